/* A notice of what is coming to this core (notice.h). */
#include "notice.h"

int notice_fill(const struct notice *n, uint64_t now_ms, Tpuemu__Notice *out)
{
    if (!n || !n->kind)
        return 0;
    uint64_t at = n->under_way ? n->event_ms + n->window_ms : n->event_ms;
    out->kind = (Tpuemu__NoticeKind)n->kind;
    out->event_in_ms = at > now_ms ? at - now_ms : 0;
    out->window_ms = n->window_ms;
    out->under_way = n->under_way != 0;
    return 1;
}
