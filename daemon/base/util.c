/* Small helpers for gpumemd's daemon code: number and boolean parsing for options and config files. */
#include "util.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

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

int parse_size_or_percent(const char *s, uint64_t *ret)
{
        size_t n = strlen(s);
        long pages, page;
        uint64_t pct;
        char num[16];

        if (n == 0 || s[n - 1] != '%')
                return parse_size(s, ret);
        if (n - 1 == 0 || n - 1 >= sizeof(num))
                return -EINVAL;
        memcpy(num, s, n - 1);
        num[n - 1] = '\0';
        if (parse_uint(num, 100, &pct) < 0 || pct == 0)
                return -EINVAL;
        pages = sysconf(_SC_PHYS_PAGES);
        page = sysconf(_SC_PAGESIZE);
        if (pages <= 0 || page <= 0)
                return -EINVAL;
        *ret = (uint64_t)pages / 100 * pct * (uint64_t)page;
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

int config_reader_open(ConfigReader *r, const char *path, bool must_exist, char *err, size_t errlen)
{
        int e;

        *r = (ConfigReader){.path = path, .err = err, .errlen = errlen};
        if (err && errlen)
                err[0] = '\0';
        r->f = fopen(path, "re");
        if (r->f)
                return 0;
        e = errno;
        if (err && (e != ENOENT || must_exist))
                snprintf(err, errlen, "%s: cannot open: %s\n", path, strerror(e));
        return -e;
}

void config_reader_close(ConfigReader *r)
{
        if (r->f)
                fclose(r->f);
        r->f = NULL;
}

char *config_reader_gets(ConfigReader *r, char *str, int num)
{
        char *s = fgets(str, num, r->f);

        if (s)
                r->line++;
        return s;
}

bool config_line_section(const char *line, const char **ret_name, size_t *ret_len)
{
        const char *p = line + strspn(line, " \t"), *end;

        if (*p != '[')
                return false;
        end = strchr(p, ']');
        *ret_name = p + 1;
        *ret_len = end ? (size_t)(end - p - 1) : SIZE_MAX;
        return true;
}

void config_error(ConfigReader *r, const char *fmt, ...)
{
        size_t used = r->err ? strnlen(r->err, r->errlen) : 0;
        va_list ap;
        int n;

        r->n_errors++;
        if (!r->err || used + 1 >= r->errlen)
                return;
        n = snprintf(r->err + used, r->errlen - used, "%s:%u: ", r->path, r->line);
        if (n < 0 || (size_t)n >= r->errlen - used)
                return;
        used += (size_t)n;
        va_start(ap, fmt);
        n = vsnprintf(r->err + used, r->errlen - used, fmt, ap);
        va_end(ap);
        if (n < 0 || (size_t)n + 1 >= r->errlen - used)
                return;
        used += (size_t)n;
        r->err[used] = '\n';
        r->err[used + 1] = '\0';
}
