/* What handlers.c and system.c both answer and probe through, below both of
 * them: sealing and sending a reply (or an error reply) to a request, and the
 * control link to a registered core, made on first use. It calls neither. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "corelink.h"
#include "log.h"
#include "resolver.h"

void rsv_reply(resolver *r, rreq *req, wire_msg *m)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    err e;

    m->request_id = req->id;
    if (wire_seal(&r->auth, RSV_SENDER, m, &buf, &len, NULL, &e) != CODE_OK) {
        log_error("cannot seal a reply", "reason=%s", log_q(e.msg));
        sprep_ctl_free(req->ctl);
    } else {
        /* a resend that came while this was being answered gets it too */
        void *dup = req->refused ? NULL : drc_answer(r->drc, req->id, buf, len);
        if (sprep_reply(r->rep, req->ctl, buf, len, &e) != CODE_OK)
            log_warn("cannot send a reply", "reason=%s", log_q(e.msg));
        if (dup && sprep_reply(r->rep, dup, buf, len, &e) != CODE_OK)
            log_warn("cannot send a reply", "reason=%s", log_q(e.msg));
    }
    req->ctl = NULL;
    free(buf);
}

void rsv_reply_error(resolver *r, rreq *req, int code, const char *fmt, ...)
{
    wire_msg m = TPUEMU__MESSAGE__INIT;
    Tpuemu__Status st = TPUEMU__STATUS__INIT;
    char msg[ERR_MSG_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    st.code = (Tpuemu__Code)code;
    st.message = msg;
    m.body_case = TPUEMU__MESSAGE__BODY_ERROR;
    m.error = &st;
    rsv_reply(r, req, &m);
}

struct corelink *rsv_link(resolver *r, rentry *en, err *e)
{
    if (!en->link)
        en->link = corelink_new(r->loop, &r->auth, r, en->w.control_addr, en->w.host_id, en->w.core,
                                en->w.incarnation, e);
    return en->link;
}

void rsv_drop_link(rentry *en)
{
    if (en->link) {
        corelink_close(en->link);
        en->link = NULL;
    }
}
