/* "Did you mean": the closest of a list of names to a mistyped one. */
#include <string.h>

#include "shoal/common.h"

/* Optimal string alignment distance (Levenshtein plus adjacent swaps),
 * capped: names longer than 63 bytes are never suggested. */
static int distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n > 63 || m > 63) return 1 << 20;
    int d[64][64];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int c = a[i - 1] != b[j - 1];
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + c < v) v = d[i - 1][j - 1] + c;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

const char *sh_closest(const char *word, const char *const *names, size_t n)
{
    size_t len = strlen(word);
    /* A third of the word may be wrong (at least one edit, at most three),
     * or the word is the start of exactly one name. */
    int limit = (int)(len / 3);
    if (limit < 1) limit = 1;
    if (limit > 3) limit = 3;
    const char *best = NULL, *prefix = NULL;
    int best_d = limit + 1, prefixes = 0;
    for (size_t i = 0; i < n && names[i]; i++) {
        int d = distance(word, names[i]);
        if (d < best_d) best_d = d, best = names[i];
        if (len >= 2 && !strncmp(names[i], word, len)) prefixes++, prefix = names[i];
    }
    if (best) return best;
    return prefixes == 1 ? prefix : NULL;
}
