/* gpumemd logging: journal (sd_journal_send with MESSAGE_ID and fields) or stderr, chosen once at start. */
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <systemd/sd-journal.h>

static int log_level = LOG_INFO;
static bool log_to_journal;

static const char *const level_names[] = {
        [LOG_EMERG] = "emerg",     [LOG_ALERT] = "alert",   [LOG_CRIT] = "crit", [LOG_ERR] = "err",
        [LOG_WARNING] = "warning", [LOG_NOTICE] = "notice", [LOG_INFO] = "info", [LOG_DEBUG] = "debug",
};

/* systemd sets JOURNAL_STREAM to "dev:ino" of stderr when it is connected to the journal. */
static bool stderr_is_journal(void)
{
        const char *e = getenv("JOURNAL_STREAM");
        unsigned long long dev, ino;
        struct stat st;

        if (!e || sscanf(e, "%llu:%llu", &dev, &ino) != 2)
                return false;
        if (fstat(STDERR_FILENO, &st) < 0)
                return false;
        return st.st_dev == dev && st.st_ino == ino;
}

void log_setup(void)
{
        log_to_journal = stderr_is_journal();
}

void log_set_level(int level)
{
        __atomic_store_n(&log_level, level, __ATOMIC_RELAXED); /* read by every loop */
}

int log_get_level(void)
{
        return __atomic_load_n(&log_level, __ATOMIC_RELAXED);
}

int log_level_from_string(const char *s)
{
        for (size_t i = 0; i < ARRAY_SIZE(level_names); i++)
                if (strcasecmp(s, level_names[i]) == 0)
                        return (int)i;
        if (strcasecmp(s, "error") == 0)
                return LOG_ERR;
        if (strcasecmp(s, "warn") == 0)
                return LOG_WARNING;
        if (s[0] >= '0' && s[0] <= '7' && s[1] == '\0')
                return s[0] - '0';
        return -EINVAL;
}

const char *log_level_to_string(int level)
{
        if (level < 0 || level >= (int)ARRAY_SIZE(level_names))
                return "unknown";
        return level_names[level];
}

int log_full(int prio, int err, const char *message_id, const char *const *fields, const char *fmt, ...)
{
        char msg[1024];
        va_list ap;

        if (err < 0)
                err = -err;
        if (prio > log_get_level())
                return -err;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);

        if (log_to_journal) {
                struct iovec iov[32];
                char prio_s[16], msg_s[sizeof(msg) + 16], id_s[64], err_s[32];
                size_t n = 0;

                snprintf(prio_s, sizeof(prio_s), "PRIORITY=%d", prio);
                iov[n++] = (struct iovec){prio_s, strlen(prio_s)};
                snprintf(msg_s, sizeof(msg_s), "MESSAGE=%s", msg);
                iov[n++] = (struct iovec){msg_s, strlen(msg_s)};
                if (message_id) {
                        snprintf(id_s, sizeof(id_s), "MESSAGE_ID=%s", message_id);
                        iov[n++] = (struct iovec){id_s, strlen(id_s)};
                }
                if (err) {
                        snprintf(err_s, sizeof(err_s), "ERRNO=%d", err);
                        iov[n++] = (struct iovec){err_s, strlen(err_s)};
                }
                for (size_t i = 0; fields && fields[i] && n < ARRAY_SIZE(iov); i++)
                        iov[n++] = (struct iovec){(void *)fields[i], strlen(fields[i])};
                (void)sd_journal_sendv(iov, (int)n);
        } else {
                fprintf(stderr, "gpumemd[%s]: %s\n", log_level_to_string(prio), msg);
        }
        return -err;
}

bool log_ratelimit_ok(LogRatelimit *rl)
{
        uint64_t now = now_usec(CLOCK_MONOTONIC);

        if (rl->last_usec) {
                rl->tokens += (double)(now - rl->last_usec) * rl->per_sec / 1e6;
                if (rl->tokens > rl->burst)
                        rl->tokens = rl->burst;
        }
        rl->last_usec = now;
        if (rl->tokens >= 1.0) {
                rl->tokens -= 1.0;
                return true;
        }
        rl->suppressed++;
        return false;
}
