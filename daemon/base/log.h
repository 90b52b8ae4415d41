/* gpumemd logging: structured journal entries under systemd, plain stderr lines otherwise. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <syslog.h>

#include "util.h"

/* Catalogued events (prose in systemd/gpumemd.catalog). */
#define GM_MESSAGE_STARTED            "d54317cadd7d4bb19c9c0b8d0d25998a"
#define GM_MESSAGE_STOPPED            "df6f3e952c684136b7f777da4f7e609d"
#define GM_MESSAGE_CLIENT_CONNECT     "7892ed69aa0e470ca101475d8caa411a"
#define GM_MESSAGE_CLIENT_DISCONNECT  "ce4f07fd362244faa713ad4df5d74187"
#define GM_MESSAGE_PROTOCOL_VIOLATION "e845266c01b741ffa606b363f4c7b3db"
#define GM_MESSAGE_DENIED             "b4352f23d8df456daf2092ae45f5b160"
#define GM_MESSAGE_CONFIG_RELOAD      "ad338f8928f342d5b2bbc8c20f6afd77"
#define GM_MESSAGE_ADMIN_ACTION       "5917fbc74f324a4bbdee2999a28ba02e"
#define GM_MESSAGE_QUOTA_CHANGE       "26c0d2d1809b4d29963143419a04026b"
#define GM_MESSAGE_SHARE_PUBLISH      "b245d672cd9040f6b199059ea841fc47"
#define GM_MESSAGE_SHARE_OPEN         "7fd28958f6e84a988af1369b8fa53313"
#define GM_MESSAGE_SHARE_REVOKE       "348cbb5f50774e538bb00cbac8b8d27f"
#define GM_MESSAGE_HANDOVER           "20a201bfa892486ab60862f55b358ffe"

void log_setup(void);
void log_set_level(int level);
int log_get_level(void);
/* "err", "warning", "notice", "info", "debug" (or 3..7) → LOG_*; -EINVAL otherwise. */
int log_level_from_string(const char *s);
const char *log_level_to_string(int level);

/*
 * Log one line. @message_id may be NULL. Extra journal fields come as a NULL-terminated list of
 * "KEY=value" strings after the format arguments are consumed, so they are passed separately:
 * log_fields(prio, id, fields, fmt, ...), where @fields is a NULL-terminated array or NULL.
 * Returns -@err when err != 0 (so "return log_errno(LOG_ERR, r, ...)" reads naturally), else 0.
 */
int log_full(int prio, int err, const char *message_id, const char *const *fields, const char *fmt, ...)
        _printf_(5, 6);

#define log_error(...)              log_full(LOG_ERR, 0, NULL, NULL, __VA_ARGS__)
#define log_warning(...)            log_full(LOG_WARNING, 0, NULL, NULL, __VA_ARGS__)
#define log_notice(...)             log_full(LOG_NOTICE, 0, NULL, NULL, __VA_ARGS__)
#define log_info(...)               log_full(LOG_INFO, 0, NULL, NULL, __VA_ARGS__)
#define log_debug(...)              log_full(LOG_DEBUG, 0, NULL, NULL, __VA_ARGS__)
#define log_error_errno(err, ...)   log_full(LOG_ERR, (err), NULL, NULL, __VA_ARGS__)
#define log_warning_errno(err, ...) log_full(LOG_WARNING, (err), NULL, NULL, __VA_ARGS__)

/*
 * A token bucket for lines a client can trigger: at most @burst lines, refilled at @per_sec per second.
 * Returns true when the line may be written; counts suppressed lines so a summary can be logged.
 */
typedef struct LogRatelimit {
        uint64_t last_usec;
        double tokens;
        unsigned burst;
        unsigned per_sec;
        uint64_t suppressed;
} LogRatelimit;

#define LOG_RATELIMIT_INIT(b, p)                                                                             \
        {                                                                                                    \
                .burst = (b), .per_sec = (p), .tokens = (b)                                                  \
        }
bool log_ratelimit_ok(LogRatelimit *rl);
