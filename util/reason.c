/* Failure reasons: a fixed buffer filled with printf formatting, never allocating. */
#include "reason.h"

#include <stdarg.h>
#include <string.h>

int reason_set(Reason *r, int err, const char *fmt, ...)
{
        va_list ap;

        if (r) {
                va_start(ap, fmt);
                vsnprintf(r->msg, sizeof(r->msg), fmt, ap);
                va_end(ap);
        }
        return err;
}

const char *reason_or_errno(const Reason *r, int err)
{
        return r && r->msg[0] ? r->msg : strerror(err < 0 ? -err : err);
}
