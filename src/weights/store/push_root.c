/* The root of a push tree (`shoal push serve`, docs/push-protocol.md): it
 * follows a store's LATEST and offers every version from the newest anchor
 * on to a bcast node, verified against its manifest first; a late joiner
 * gets the cheapest plan the store would give it (a squashed delta, made
 * once and kept in the store's squash cache).  Its twin, the replica at the
 * tree's leaves, is replica.c. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "shoal/bcast.h"
#include "shoal/store.h"
#include "weights/store/store_int.h"

/* A payload that failed its check, as it was on disk: it is not hashed
 * again (a whole anchor, twice a second) until the file changes. */
typedef struct bad_payload {
    uint64_t version;
    struct stat st;
    char msg[1024];
    int known; /* the last error was this payload's, already said */
} bad_payload;

struct store_push_root {
    store *s;
    bcast_node *node;
    uint64_t have; /* the newest version offered to the node */
    bad_payload bad;
};

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_ino == b->st_ino && a->st_size == b->st_size && a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
           a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static int verify_once(store *s, uint64_t v, bad_payload *bad)
{
    char path[4096];
    struct stat st = {0};
    int known = store_payload_path(s, v, path, sizeof path) == 0 && stat(path, &st) == 0 &&
                bad->version == v && same_file(&st, &bad->st);
    bad->known = known;
    if (known) return sh_err(SH_EMISMATCH, "%s", bad->msg);
    int rc = store_verify(s, v);
    if (rc < 0) {
        bad->version = v, bad->st = st;
        snprintf(bad->msg, sizeof bad->msg, "%s", sh_errmsg());
    }
    return rc;
}

/* Offers every version from the newest anchor at or below `latest` that the
 * node does not have yet, in order. */
static int offer_new(store_push_root *r, uint64_t latest)
{
    store_plan *p = malloc(sizeof *p);
    if (!p) return sh_err(SH_ENOMEM, "plan");
    int rc = store_plan_make(r->s, r->have, latest, p);
    /* A squash in the store's cache from what the node has (made for a
     * late joiner, or by `shoal store squash`) is no plan for the node,
     * which needs every version: the plan from the anchor, less what the
     * node already has (offering that again is refused). */
    if (rc == 0 && p->kind == STORE_PLAN_SQUASH) rc = store_plan_make(r->s, 0, latest, p);
    uint64_t list[STORE_MAX_CHAIN + 1];
    size_t k = 0, i0 = 0;
    if (rc == 0 && p->kind == STORE_PLAN_ANCHOR && p->anchor > r->have) list[k++] = p->anchor;
    while (rc == 0 && i0 < p->nsteps && p->steps[i0] <= r->have) i0++;
    for (size_t i = i0; rc == 0 && i < p->nsteps; i++) list[k++] = p->steps[i];
    free(p);
    for (size_t i = 0; rc == 0 && i < k; i++) {
        char *text = NULL, path[4096];
        store_version m;
        rc = store_get(r->s, list[i], &m, &text);
        if (rc == 0) rc = verify_once(r->s, list[i], &r->bad);
        if (rc == 0) rc = store_payload_path(r->s, list[i], path, sizeof path);
        if (rc == 0) rc = bcast_node_add_object(r->node, text, path);
        if (rc == 0) r->have = list[i];
        free(text);
    }
    return rc;
}

/* The root's answer for a late joiner at `from`: a squashed delta to `to`
 * when the store's plan says it is the fewest bytes.  It is made (and kept
 * in the store's squash cache) the first time a child needs it. */
static int squash_plan(void *arg, uint64_t from, uint64_t to, char *path, size_t cap)
{
    store *s = arg;
    store_plan *p = malloc(sizeof *p);
    int rc = p ? store_plan_make(s, from, to, p) : sh_err(SH_ENOMEM, "plan");
    if (rc == 0 && p->kind == STORE_PLAN_CHAIN && store_squash_path(s, from, to, path, cap) == 0 &&
        !sh_path_exists(path) && store_squash(s, from, to, NULL) == 0)
        rc = store_plan_make(s, from, to, p);
    /* A child below the anchor that holds a version: one delta across the
     * anchor, when it is fewer bytes than the anchor (and its chain). */
    if (rc == 0 && p->kind == STORE_PLAN_ANCHOR && from > 0 && from < p->anchor &&
        store_squash_path(s, from, to, path, cap) == 0 && !sh_path_exists(path)) {
        if (store__cross_delta(s, from, to, NULL) == 0) rc = store_plan_make(s, from, to, p);
        else sh_warn("push root: a delta v%llu -> v%llu across the anchor: %s", (unsigned long long)from,
                     (unsigned long long)to, sh_errmsg());
    }
    int use = rc == 0 && p->kind == STORE_PLAN_SQUASH && store_squash_path(s, from, to, path, cap) == 0;
    if (rc < 0)
        sh_warn("push root: plan v%llu -> v%llu: %s", (unsigned long long)from, (unsigned long long)to,
                sh_errmsg());
    free(p);
    return use;
}

int store_push_root_new(const char *root, const char *run, const bcast_config *cfg, store_push_root **out)
{
    *out = NULL;
    store_push_root *r = calloc(1, sizeof *r);
    if (!r) return sh_err(SH_ENOMEM, "push root");
    int rc = store_open(root, run, 0, &r->s);
    if (rc < 0) {
        free(r);
        return rc;
    }
    bcast_config c = *cfg;
    c.accept_children = 1;
    if (!c.name) c.name = "root";
    c.squash = squash_plan;
    c.arg = r->s;
    if ((rc = bcast_node_new(&c, &r->node)) < 0) {
        store_push_root_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

const char *store_push_root_address(const store_push_root *r) { return bcast_node_address(r->node); }

const char *store_push_root_run(const store_push_root *r) { return store_run(r->s); }

int store_push_root_step(store_push_root *r, double seconds)
{
    uint64_t latest;
    int rc = store_latest(r->s, &latest);
    r->bad.known = 0;
    if (rc == 0 && latest > r->have) rc = offer_new(r, latest);
    if (rc < 0) {
        /* A bad version in the store stops the offer, not the root:
         * children keep what they have; the next step retries (a damaged
         * payload only once it changes, said once). */
        if (!r->bad.known) sh_warn("push root: %s", sh_errmsg());
        int run = bcast_node_run(r->node, seconds > 0.5 ? seconds : 0.5);
        return run < 0 ? run : 0;
    }
    return bcast_node_run(r->node, seconds);
}

void store_push_root_free(store_push_root *r)
{
    if (!r) return;
    bcast_node_free(r->node);
    store_close(r->s);
    free(r);
}
