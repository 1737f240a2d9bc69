/* Helpers for foreign callers (the Python package under python/shoal): they
 * see no struct layouts and no jansson, only pointers, numbers and text. */
#include <stdlib.h>

#include "shoal/common.h"

void sh_free(void *p) { free(p); }

int sh_json_take_text(json_t *j, char **out)
{
    *out = NULL;
    if (!j) return sh_err(SH_EINVAL, "no JSON value to serialise");
    *out = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(j);
    return *out ? SH_OK : sh_err(SH_ENOMEM, "JSON text: out of memory");
}
