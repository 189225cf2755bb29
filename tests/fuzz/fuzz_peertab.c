/* libFuzzer target: the peer table a core opens at every initialize
 * (ResetCore.peer_table). First byte: the number of cores it must list. */
#include <stddef.h>
#include <stdint.h>

#include "peertab.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct peertab *t;
    char buf[PEERTAB_MAX_ADDR + 1];
    size_t n;
    err e;

    if (size < 1)
        return 0;
    n = data[0] % 64;
    if (peertab_open(data + 1, size - 1, n, &t, &e) != CODE_OK)
        return 0;
    for (size_t r = 0; r < peertab_n(t); r++) {
        (void)peertab_host(t, r);
        (void)peertab_host_index(t, r);
        (void)peertab_core(t, r);
        (void)peertab_incarnation(t, r);
        (void)peertab_has_shm(t, r);
        (void)peertab_data_addr(t, r, buf, sizeof buf);
        (void)peertab_control_addr(t, r, buf, sizeof buf);
        (void)peertab_shm_name(t, r, buf, sizeof buf);
    }
    peertab_free(t);
    return 0;
}
