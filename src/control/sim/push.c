/* The push-tree model of src/control/sim/sim_push_int.h.
 *
 * The tree is walked depth first.  A node's chunk arrival times (when each
 * chunk is verified there and can be forwarded) determine its children's,
 * through the node's sending loop; a node's times are dropped once its
 * children's are known, so memory stays at (depth x fanout) arrays of one
 * double per chunk however many replicas there are.  Pure: no clock, no
 * file, no socket. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/bcast.h"
#include "shoal/common.h"
#include "control/sim/sim_push_int.h"

enum { LINK_FABRIC, LINK_ZONE, LINK_CROSS };

typedef struct model {
    const sim_push_config *c;
    int n;            /* nodes: 0 the root, 1..N replicas */
    int *parent, *cls, *first_child, *next_sibling, *depth;
    uint64_t chunk, nchunks;
    double nic_Bps;
    double converge, first;
    int maxdepth;
} model;

uint64_t sim_push_chunk_auto(uint64_t payload, int depth, double gbps, double overhead_s)
{
    return bcast_chunk_auto(payload, depth, gbps, overhead_s > 0 ? overhead_s : 20e-6);
}

static void add_child(model *m, int p, int child, int cls)
{
    m->parent[child] = p;
    m->cls[child] = cls;
    m->depth[child] = m->depth[p] + 1;
    if (m->depth[child] > m->maxdepth) m->maxdepth = m->depth[child];
    /* Appended last: a node serves its children in the order they came. */
    m->next_sibling[child] = -1;
    if (m->first_child[p] < 0) {
        m->first_child[p] = child;
        return;
    }
    int k = m->first_child[p];
    while (m->next_sibling[k] >= 0) k = m->next_sibling[k];
    m->next_sibling[k] = child;
}

/* members[0..n) of one group hang under `top` (a node already placed),
 * breadth first, `fanout` per node; top is position 0. */
static void hang(model *m, int top, const int *members, int n, int fanout, int cls)
{
    for (int k = 0; k < n; k++) {
        int pos = k + 1, ppos = (pos - 1) / fanout;
        add_child(m, ppos == 0 ? top : members[ppos - 1], members[k], cls);
    }
}

/* The tree bcast builds (sim_push.h). */
static int build(model *m)
{
    const sim_push_config *c = m->c;
    int F = c->fanout > 0 ? c->fanout : 2, N = c->replicas, Z = c->zones;
    int *members = malloc(sizeof(int) * (size_t)N), *relays = malloc(sizeof(int) * (size_t)N);
    if (!members || !relays) {
        free(members), free(relays);
        return sh_err(SH_ENOMEM, "sim push: %d replicas", N);
    }
    for (int z = 0; z < Z; z++) {
        int n = 0;
        for (int i = z; i < N; i += Z) members[n++] = 1 + i; /* replica i lives in zone i % Z */
        /* Zone 0 is the root's: its replicas hang under the root itself. */
        int top = 0, start = 0;
        if (z > 0) {
            add_child(m, 0, members[0], LINK_CROSS);
            top = members[0], start = 1;
        }
        int M = c->fabric_size;
        if (M <= 0 || M >= n) {
            hang(m, top, members + start, n - start, F, LINK_ZONE);
            continue;
        }
        /* Fabrics of M: their first members hang under the zone's top by
         * zone links, the rest under their fabric's first by fabric links. */
        int nf = 0;
        for (int k = 0; k < n; k += M) relays[nf++] = members[k];
        if (z > 0) hang(m, top, relays + 1, nf - 1, F, LINK_ZONE);
        else hang(m, top, relays, nf, F, LINK_ZONE);
        for (int f = 0; f < nf; f++) {
            int lo = f * M, hi = lo + M < n ? lo + M : n;
            hang(m, members[lo], members + lo + 1, hi - lo - 1, F, LINK_FABRIC);
        }
    }
    free(members), free(relays);
    return 0;
}

static const sim_push_link *link_of(const model *m, int cls)
{
    return cls == LINK_FABRIC ? &m->c->fabric : cls == LINK_ZONE ? &m->c->zone : &m->c->cross;
}

static double chunk_len(const model *m, uint64_t j)
{
    uint64_t off = j * m->chunk;
    return (double)(m->c->payload - off < m->chunk ? m->c->payload - off : m->chunk);
}

/* Node p holds chunk j from have[j] on; fills each child's times.  The
 * node's loop posts the chunk that can start soonest, in round-robin order
 * among equals, as bcast's pump does one message per child per pass. */
static void send_all(model *m, int p, const double *have, double **out, int nc, const int *kids)
{
    const sim_push_config *c = m->c;
    int W = c->window > 0 ? c->window : 4;
    uint64_t *next = calloc((size_t)nc, sizeof *next);
    double *pipe = calloc((size_t)nc, sizeof *pipe);
    double nic = 0;
    uint64_t left = (uint64_t)nc * m->nchunks;
    int rr = 0;
    while (left > 0) {
        int best = -1;
        double bstart = INFINITY;
        for (int q = 0; q < nc; q++) {
            int k = (rr + q) % nc;
            uint64_t j = next[k];
            if (j >= m->nchunks) continue;
            const sim_push_link *l = link_of(m, m->cls[kids[k]]);
            double s = have[j];
            if (pipe[k] > s) s = pipe[k];
            if (nic > s) s = nic;
            if (j >= (uint64_t)W) { /* the ack of chunk j - W */
                double ack = out[k][j - W] - c->chunk_overhead_s + l->latency_s;
                if (ack > s) s = ack;
            }
            if (s < bstart) bstart = s, best = k;
        }
        int k = best;
        uint64_t j = next[k]++;
        const sim_push_link *l = link_of(m, m->cls[kids[k]]);
        double len = chunk_len(m, j);
        nic = bstart + len / m->nic_Bps;
        pipe[k] = bstart + len / (l->gbps * 1e9 / 8);
        out[k][j] = pipe[k] + l->latency_s + c->chunk_overhead_s;
        rr = (k + 1) % nc;
        left--;
    }
    (void)p;
    free(next), free(pipe);
}

static int walk(model *m, int p, double *have)
{
    int nc = 0;
    for (int k = m->first_child[p]; k >= 0; k = m->next_sibling[k]) nc++;
    if (p > 0) {
        double done = 0;
        for (uint64_t j = 0; j < m->nchunks; j++)
            if (have[j] > done) done = have[j];
        done += m->c->apply_s;
        if (done > m->converge) m->converge = done;
        if (done < m->first) m->first = done;
    }
    if (!nc) {
        free(have);
        return 0;
    }
    int *kids = malloc(sizeof(int) * (size_t)nc);
    double **out = calloc((size_t)nc, sizeof *out);
    int rc = kids && out ? 0 : sh_err(SH_ENOMEM, "sim push");
    int i = 0;
    for (int k = m->first_child[p]; k >= 0 && !rc; k = m->next_sibling[k]) {
        kids[i] = k;
        if (!(out[i++] = malloc(sizeof(double) * m->nchunks))) rc = sh_err(SH_ENOMEM, "sim push");
    }
    if (!rc) send_all(m, p, have, out, nc, kids);
    free(have);
    for (i = 0; i < nc; i++) {
        if (!rc) rc = walk(m, kids[i], out[i]); /* walk frees out[i] */
        else free(out[i]);
    }
    free(kids), free(out);
    return rc;
}

static int check(const sim_push_config *c)
{
    if (c->replicas < 1) return sh_err(SH_EINVAL, "push model: %d replicas: must be at least 1", c->replicas);
    if (c->zones < 1 || c->zones > c->replicas)
        return sh_err(SH_EINVAL, "push model: %d zones: must be 1..%d (the replicas)", c->zones, c->replicas);
    if (c->payload < 1) return sh_err(SH_EINVAL, "push model: the payload must be at least 1 byte");
    const sim_push_link *l[3] = {&c->fabric, &c->zone, &c->cross};
    const char *names[3] = {"fabric", "zone", "cross-zone"};
    for (int i = 0; i < 3; i++)
        if (!(l[i]->gbps > 0) || !(l[i]->latency_s >= 0))
            return sh_err(SH_EINVAL, "push model: the %s link needs gbps > 0 and latency >= 0", names[i]);
    if (c->fanout < 0 || c->window < 0 || c->fabric_size < 0 || c->chunk_overhead_s < 0 || c->apply_s < 0)
        return sh_err(SH_EINVAL, "push model: fanout, window, fabric size, overhead and apply time must not be negative");
    return 0;
}

int sim_push_run(const sim_push_config *c, sim_push_result *out)
{
    memset(out, 0, sizeof *out);
    SH_TRY(check(c));
    model m = {.c = c, .n = c->replicas + 1, .first = INFINITY};
    m.parent = malloc(sizeof(int) * (size_t)m.n);
    m.cls = malloc(sizeof(int) * (size_t)m.n);
    m.first_child = malloc(sizeof(int) * (size_t)m.n);
    m.next_sibling = malloc(sizeof(int) * (size_t)m.n);
    m.depth = calloc((size_t)m.n, sizeof(int));
    int rc = m.parent && m.cls && m.first_child && m.next_sibling && m.depth ? 0 : sh_err(SH_ENOMEM, "sim push");
    for (int i = 0; !rc && i < m.n; i++) m.first_child[i] = m.next_sibling[i] = -1, m.parent[i] = -1;
    if (!rc) rc = build(&m);
    double fastest = fmax(c->fabric.gbps, fmax(c->zone.gbps, c->cross.gbps));
    m.nic_Bps = (c->nic_gbps > 0 ? c->nic_gbps : fastest) * 1e9 / 8;
    /* The slowest link on the way sets the pace a chunk is cut for. */
    double slow = c->replicas > c->zones || c->zones == 1 ? c->zone.gbps : c->cross.gbps;
    if (c->zones > 1) slow = fmin(slow, c->cross.gbps);
    m.chunk = c->chunk ? c->chunk : sim_push_chunk_auto(c->payload, m.maxdepth, slow, c->chunk_overhead_s);
    m.nchunks = (c->payload + m.chunk - 1) / m.chunk;
    double *root = rc ? NULL : calloc((size_t)m.nchunks, sizeof(double));
    if (!rc && !root) rc = sh_err(SH_ENOMEM, "sim push: %llu chunks", (unsigned long long)m.nchunks);
    if (!rc) rc = walk(&m, 0, root);
    if (!rc) {
        out->converge_s = m.converge;
        out->first_s = m.first;
        out->depth = m.maxdepth;
        out->chunk = m.chunk;
        out->nchunks = m.nchunks;
        out->cross_zone_copies = (uint64_t)(c->zones - 1);
    }
    free(m.parent), free(m.cls), free(m.first_child), free(m.next_sibling), free(m.depth);
    return rc;
}
