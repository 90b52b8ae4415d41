/* Small helpers for gpumemd's daemon code: number and boolean parsing for options and config files. */
#include "util.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

/* The whole unsigned number at the start of @s, and where it ends: no sign, no blank before it. */
static int read_number(const char *s, unsigned long long *ret, char **ret_end)
{
        if (!s || !*s || isspace((unsigned char)*s) || *s == '-' || *s == '+')
                return -EINVAL;
        errno = 0;
        /* decimal, or hex with 0x: a leading zero is not octal ("010G" is ten gibibytes) */
        *ret = strtoull(s, ret_end, (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) ? 16 : 10);
        return errno ? -errno : 0;
}

int parse_uint(const char *s, uint64_t max, uint64_t *ret)
{
        char *end;
        unsigned long long v;
        int r = read_number(s, &v, &end);

        if (r < 0)
                return r;
        if (*end)
                return -EINVAL;
        if (v > max)
                return -ERANGE;
        *ret = v;
        return 0;
}

int parse_size(const char *s, uint64_t *ret)
{
        char *end;
        unsigned long long v;
        unsigned shift = 0;
        int r = read_number(s, &v, &end);

        if (r < 0)
                return r;
        if (*end) {
                switch (toupper((unsigned char)*end)) {
                case 'K':
                        shift = 10;
                        break;
                case 'M':
                        shift = 20;
                        break;
                case 'G':
                        shift = 30;
                        break;
                case 'T':
                        shift = 40;
                        break;
                default:
                        return -EINVAL;
                }
                end++;
                if (*end == 'i' || *end == 'I')
                        end++;
                if (*end == 'B' || *end == 'b')
                        end++;
                if (*end)
                        return -EINVAL;
        }
        if (shift && v > (UINT64_MAX >> shift))
                return -ERANGE;
        *ret = (uint64_t)v << shift;
        return 0;
}

int parse_bool(const char *s, bool *ret)
{
        static const char *const yes[] = {"1", "yes", "true", "on"};
        static const char *const no[] = {"0", "no", "false", "off"};

        for (size_t i = 0; i < ARRAY_SIZE(yes); i++) {
                if (strcasecmp(s, yes[i]) == 0) {
                        *ret = true;
                        return 0;
                }
                if (strcasecmp(s, no[i]) == 0) {
                        *ret = false;
                        return 0;
                }
        }
        return -EINVAL;
}

void error_list_vadd(char *buf, size_t len, const char *path, unsigned line, const char *fmt, va_list ap)
{
        size_t used = buf ? strnlen(buf, len) : 0;
        int n;

        if (!buf || used + 1 >= len)
                return;
        n = snprintf(buf + used, len - used, "%s:%u: ", path, line);
        if (n < 0 || (size_t)n >= len - used)
                return;
        used += (size_t)n;
        n = vsnprintf(buf + used, len - used, fmt, ap);
        if (n < 0 || (size_t)n + 1 >= len - used)
                return;
        used += (size_t)n;
        buf[used] = '\n';
        buf[used + 1] = '\0';
}
