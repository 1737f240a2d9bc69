/* The store's seam to the delta codec.  Until src/delta is in this build the
 * store publishes anchors only and refuses to apply deltas with a clear
 * message. */
#include "store/internal.h"

int store_have_codec(void) { return 0; }

int store__delta_make(const char *prev, const char *next, const char *out)
{
    return sh_err(SH_EINVAL, "cannot make a delta for %s: this build has no delta codec", next);
}

int store__delta_apply(const char *prev, const char *delta, const char *out)
{
    return sh_err(SH_EINVAL, "cannot apply %s: this build has no delta codec", delta);
}

int store__delta_squash(const char *const *deltas, size_t n, const char *out)
{
    return sh_err(SH_EINVAL, "cannot squash into %s: this build has no delta codec", out);
}
