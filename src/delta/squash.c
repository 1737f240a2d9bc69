/* delta squash: compose a chain of deltas without the checkpoints. */
#include "delta/internal.h"

int delta_squash(const char *const *deltas, size_t n, const char *out, const delta_opts *o,
                 delta_stats *st)
{
    return sh_err(SH_EINTERNAL, "squash: not yet");
}
