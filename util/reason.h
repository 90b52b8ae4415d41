/* One way to say why something failed: a line for the user, next to the negative errno that is returned. */
#pragma once

#include "macro.h"

#define REASON_MAX 256

typedef struct Reason {
        char msg[REASON_MAX];
} Reason;

/* Record the reason (when @r is not NULL) and return @err, for "return reason_set(r, -EINVAL, ...)". */
int reason_set(Reason *r, int err, const char *fmt, ...) _printf_(3, 4);
/* The reason, or strerror(-@err) when none was recorded. */
const char *reason_or_errno(const Reason *r, int err);
