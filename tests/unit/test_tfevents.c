/* Unit tests of client/src/profile/tfevents (internal, compiled in): a log
 * directory that cannot be made is reported as what it is. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "tfevents.h"

/* A directory under a regular file does not exist (NOT_FOUND), a name too
 * long for the system is a bad argument (INVALID_ARGUMENT): both were
 * PERMISSION_DENIED, which sent the user to check permissions. */
Test(tfevents, logdir_errors_say_what_is_wrong)
{
    char dir[] = "/tmp/test_tfevents.XXXXXX", file[64], under[80], longdir[5000];
    err e;
    cr_assert_not_null(mkdtemp(dir));
    snprintf(file, sizeof file, "%s/plain", dir);
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fclose(f);
    snprintf(under, sizeof under, "%s/logs/train", file);
    cr_assert_eq(tfevents_profile_empty(under, &e), CODE_NOT_FOUND, "%s", e.msg);
    cr_assert(strstr(e.msg, under), "%s", e.msg);
    memset(longdir, 'd', sizeof longdir - 1);
    longdir[sizeof longdir - 1] = '\0';
    memcpy(longdir, dir, strlen(dir));
    longdir[strlen(dir)] = '/';
    cr_assert_eq(tfevents_profile_empty(longdir, &e), CODE_INVALID_ARGUMENT, "%s", e.msg);
    /* and one that can be made works */
    snprintf(under, sizeof under, "%s/logs", dir);
    cr_assert_eq(tfevents_profile_empty(under, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(tfevents_profile_empty(under, &e), CODE_OK, "a second time: %s", e.msg);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
