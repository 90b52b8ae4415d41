/* Small helpers for gpumemd's daemon code: number and boolean parsing for options and config files. */
#include "util.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

int parse_uint(const char *s, uint64_t max, uint64_t *ret)
{
        char *end;
        unsigned long long v;

        if (!s || !*s || isspace((unsigned char)*s) || *s == '-' || *s == '+')
                return -EINVAL;
        errno = 0;
        /* decimal, or hex with 0x: a leading zero is not octal ("010G" is ten gibibytes) */
        v = strtoull(s, &end, (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) ? 16 : 10);
        if (errno)
                return -errno;
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

        if (!s || !*s || isspace((unsigned char)*s) || *s == '-' || *s == '+')
                return -EINVAL;
        errno = 0;
        /* decimal, or hex with 0x: a leading zero is not octal ("010G" is ten gibibytes) */
        v = strtoull(s, &end, (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) ? 16 : 10);
        if (errno)
                return -errno;
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
