/* The heartbeat's stretch for a machine's cores per CPU (machine.h), and the
 * machine's identity as the daemons read it. */
#include <criterion/criterion.h>
#include <string.h>

#include "machine.h"

Test(machine, stretch_follows_cores_per_cpu)
{
    cr_assert_eq(machine_stretch(0, 2), 1, "no cores: the flag's interval");
    cr_assert_eq(machine_stretch(64, 2), 1, "32 a CPU keep the flag's interval");
    cr_assert_eq(machine_stretch(65, 2), 2);
    cr_assert_eq(machine_stretch(256, 2), 4);
    cr_assert_eq(machine_stretch(1024, 2), 16, "1,024 cores on 2 CPUs: 16 times");
    cr_assert_eq(machine_stretch(1024, 64), 1);
    cr_assert_eq(machine_stretch(40, 0), 2, "CPUs not told count as one");
    cr_assert_eq(machine_stretch(4000000000u, 1), 60, "at most 60 times");
}

Test(machine, identity)
{
    const char *id = machine_boot_id();
    cr_assert_geq(machine_cpus(), 1);
    cr_assert_eq(strlen(id), 36, "a boot id is a UUID: '%s'", id);
    cr_assert_eq(machine_boot_id(), id, "read once");
}
