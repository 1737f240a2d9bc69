/* A string -> index map with open addressing and linear probing.  Keys are
 * copied and owned by the map.  A removed node keeps its entry (its index
 * stays a valid handle); a forgotten job's entry is deleted by backward
 * shifting, so probing needs no tombstones and lookups stay O(1). */
#include <stdlib.h>
#include <string.h>

#include "model_int.h"

static int map__grow(smap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    char **keys = calloc(cap, sizeof *keys);
    uint64_t *hashes = calloc(cap, sizeof *hashes);
    uint32_t *vals = calloc(cap, sizeof *vals);
    if (!keys || !hashes || !vals) {
        free(keys), free(hashes), free(vals);
        return sh_err(SH_ENOMEM, "sched: out of memory growing an id table");
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t k = m->hashes[i] & (cap - 1);
        while (keys[k]) k = (k + 1) & (cap - 1);
        keys[k] = m->keys[i], hashes[k] = m->hashes[i], vals[k] = m->vals[i];
    }
    free(m->keys), free(m->hashes), free(m->vals);
    m->keys = keys, m->hashes = hashes, m->vals = vals, m->cap = cap;
    return 0;
}

static size_t map__slot(const smap *m, const char *key, uint64_t h)
{
    size_t k = h & (m->cap - 1);
    while (m->keys[k] && (m->hashes[k] != h || strcmp(m->keys[k], key))) k = (k + 1) & (m->cap - 1);
    return k;
}

int sched__map_put(smap *m, const char *key, uint32_t val, const char **stored)
{
    if ((m->n + 1) * 2 > m->cap) SH_TRY(map__grow(m));
    uint64_t h = sh_hash64_of(key, strlen(key));
    size_t k = map__slot(m, key, h);
    if (!m->keys[k]) {
        if (!(m->keys[k] = strdup(key))) return sh_err(SH_ENOMEM, "sched: out of memory");
        m->hashes[k] = h;
        m->n++;
    }
    m->vals[k] = val;
    if (stored) *stored = m->keys[k];
    return 0;
}

uint32_t sched__map_get(const smap *m, const char *key)
{
    if (!m->cap || !key) return NONE;
    size_t k = map__slot(m, key, sh_hash64_of(key, strlen(key)));
    return m->keys[k] ? m->vals[k] : NONE;
}

void sched__map_del(smap *m, const char *key)
{
    if (!m->cap || !key) return;
    size_t mask = m->cap - 1, i = map__slot(m, key, sh_hash64_of(key, strlen(key)));
    if (!m->keys[i]) return;
    free(m->keys[i]);
    m->keys[i] = NULL;
    m->n--;
    /* Shift back every later entry of the run whose home slot does not lie
     * cyclically in (i, j]: otherwise a lookup would stop at the gap. */
    for (size_t j = (i + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
        size_t home = m->hashes[j] & mask;
        int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (stays) continue;
        m->keys[i] = m->keys[j], m->hashes[i] = m->hashes[j], m->vals[i] = m->vals[j];
        m->keys[j] = NULL;
        i = j;
    }
}

void sched__map_free(smap *m)
{
    for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
    free(m->keys), free(m->hashes), free(m->vals);
    memset(m, 0, sizeof *m);
}
