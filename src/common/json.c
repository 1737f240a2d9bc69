/* JSON helpers over jansson that turn type errors into messages naming the
 * object and the field. */
#include "shoal/common.h"

#include <stdlib.h>
#include <string.h>

static const char *sh__json_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

int sh_json_parse(const char *text, size_t len, const char *ctx, json_t **out)
{
    json_error_t e;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &e);
    if (!j)
        return sh_err(SH_EFORMAT, "%s: invalid JSON at line %d, column %d: %s", ctx, e.line, e.column,
                      e.text);
    *out = j;
    return SH_OK;
}

int sh_json_load_file(const char *path, size_t max_len, json_t **out)
{
    char *text;
    size_t len;
    SH_TRY(sh_read_file(path, max_len, &text, &len));
    int rc = sh_json_parse(text, len, path, out);
    free(text);
    return rc;
}

int sh_json_write_atomic(const char *path, const json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (!s) return sh_err(SH_ENOMEM, "%s: cannot serialise JSON", path);
    size_t n = strlen(s);
    s[n] = 0;
    sh_buf b = {0};
    int rc = sh_buf_append(&b, s, n);
    if (rc == SH_OK) rc = sh_buf_append(&b, "\n", 1);
    free(s);
    if (rc == SH_OK) rc = sh_write_atomic(path, b.data, b.len);
    sh_buf_free(&b);
    return rc;
}

static int sh__json_field(const json_t *obj, const char *key, int required, const char *ctx,
                          json_t **v)
{
    if (!json_is_object(obj)) return sh_err(SH_EFORMAT, "%s: expected a JSON object", ctx);
    *v = json_object_get(obj, key);
    if (!*v) {
        if (required) return sh_err(SH_EFORMAT, "%s: missing field \"%s\"", ctx, key);
        return 1;
    }
    return SH_OK;
}

int sh_json_get_str(const json_t *obj, const char *key, int required, const char *ctx, const char **out)
{
    json_t *v;
    int rc = sh__json_field(obj, key, required, ctx, &v);
    if (rc != SH_OK) return rc < 0 ? rc : SH_OK;
    if (!json_is_string(v))
        return sh_err(SH_EFORMAT, "%s: field \"%s\": expected a string, got %s", ctx, key,
                      sh__json_type(v));
    *out = json_string_value(v);
    return SH_OK;
}

int sh_json_get_i64(const json_t *obj, const char *key, int required, const char *ctx, int64_t *out)
{
    json_t *v;
    int rc = sh__json_field(obj, key, required, ctx, &v);
    if (rc != SH_OK) return rc < 0 ? rc : SH_OK;
    if (!json_is_integer(v))
        return sh_err(SH_EFORMAT, "%s: field \"%s\": expected an integer, got %s", ctx, key,
                      sh__json_type(v));
    *out = (int64_t)json_integer_value(v);
    return SH_OK;
}

int sh_json_get_num(const json_t *obj, const char *key, int required, const char *ctx, double *out)
{
    json_t *v;
    int rc = sh__json_field(obj, key, required, ctx, &v);
    if (rc != SH_OK) return rc < 0 ? rc : SH_OK;
    if (!json_is_number(v))
        return sh_err(SH_EFORMAT, "%s: field \"%s\": expected a number, got %s", ctx, key,
                      sh__json_type(v));
    *out = json_number_value(v);
    return SH_OK;
}

int sh_json_get_bool(const json_t *obj, const char *key, int required, const char *ctx, int *out)
{
    json_t *v;
    int rc = sh__json_field(obj, key, required, ctx, &v);
    if (rc != SH_OK) return rc < 0 ? rc : SH_OK;
    if (!json_is_boolean(v))
        return sh_err(SH_EFORMAT, "%s: field \"%s\": expected true or false, got %s", ctx, key,
                      sh__json_type(v));
    *out = json_is_true(v);
    return SH_OK;
}

int sh_json_check_keys(const json_t *obj, const char *const *allowed, const char *ctx)
{
    if (!json_is_object(obj)) return sh_err(SH_EFORMAT, "%s: expected a JSON object", ctx);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++)
            if (!strcmp(*a, key)) ok = 1;
        if (ok) continue;
        const char *near = sh_closest(key, allowed, (size_t)-1);
        if (near) return sh_err(SH_EFORMAT, "%s: unknown field \"%s\" (did you mean \"%s\"?)", ctx, key, near);
        return sh_err(SH_EFORMAT, "%s: unknown field \"%s\"", ctx, key);
    }
    return SH_OK;
}

size_t sh_utf8_tail(const uint8_t *p, size_t n)
{
    /* The last byte that is not a continuation byte (10xxxxxx), within a
     * character's reach of the end. */
    size_t k = 0;
    while (k < n && k < 4 && (p[n - 1 - k] & 0xC0) == 0x80) k++;
    if (k == n || k == 4) return 0;
    uint8_t lead = p[n - 1 - k];
    size_t len = lead >= 0xC2 && lead <= 0xDF ? 2 : lead >= 0xE0 && lead <= 0xEF ? 3 : lead >= 0xF0 && lead <= 0xF4 ? 4 : 0;
    return len && k + 1 < len ? k + 1 : 0;
}

void sh_json_print(const json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(15));
    if (s) {
        fputs(s, stdout);
        fputc('\n', stdout);
        free(s);
    }
    fflush(stdout);
}
