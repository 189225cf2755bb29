/* The core's identity (ident.h): only the sender string needs keeping in step. */
#include "ident.h"

#include <stdio.h>
#include <string.h>

static void name_sender(struct core_ident *id)
{
    if (id->core < 0)
        snprintf(id->sender, sizeof id->sender, "worker %s/?", id->host_id);
    else
        snprintf(id->sender, sizeof id->sender, "worker %s/%d", id->host_id, id->core);
}

void ident_init(struct core_ident *id, const char *host_id, int core)
{
    memset(id, 0, sizeof *id);
    snprintf(id->host_id, sizeof id->host_id, "%s", host_id);
    id->core = core;
    id->replica_id = -1;
    name_sender(id);
}

void ident_set_core(struct core_ident *id, int core)
{
    id->core = core;
    name_sender(id);
}
