/* Which child gets which chunk next, the rate limiter, and the tree shape.
 *
 * A node keeps the objects from its newest anchor onwards.  For each child it
 * walks the cheapest plan it can serve: the deltas after the child's version
 * when the child holds a version at or after the anchor, else the anchor and
 * every delta after it.  A chunk is forwarded as soon as it is verified here,
 * which is what pipelines a tree. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "weights/push/node_int.h"

bcast__obj *bcast__find(bcast_node *n, uint64_t version)
{
    for (bcast__obj *o = n->objs; o; o = o->next)
        if (o->version == version) return o;
    return NULL;
}

void bcast__insert(bcast_node *n, bcast__obj *o)
{
    bcast__obj **pp = &n->objs;
    while (*pp && (*pp)->version < o->version) pp = &(*pp)->next;
    o->next = *pp;
    *pp = o;
}

static uint64_t newest_delivered_anchor(const bcast_node *n)
{
    uint64_t a = 0;
    for (const bcast__obj *o = n->objs; o; o = o->next)
        if (o->anchor && o->delivered) a = o->version;
    return a;
}

int bcast__obj_busy(const bcast__obj *o)
{
    int busy = o->refs > 0;
    for (uint32_t i = 0; !busy && i < o->nchunks; i++) busy = o->receiving[i];
    return busy;
}

int bcast__replace(bcast_node *n, bcast__obj *o)
{
    if (o->complete || bcast__obj_busy(o)) return 0;
    for (bcast__obj **pp = &n->objs; *pp; pp = &(*pp)->next) {
        if (*pp != o) continue;
        *pp = o->next;
        bcast__obj_free(o);
        return 1;
    }
    return 0;
}

/* Objects older than the newest delivered anchor serve no plan any more:
 * whoever holds less than that anchor needs the anchor itself.  Objects still
 * being sent to a child stay until that child moves on. */
void bcast__drop_old(bcast_node *n)
{
    /* Root: a squashed delta to an older version than the newest helps no
     * one once no child is being sent it. */
    for (bcast__obj **sp = &n->squashes; *sp;) {
        bcast__obj *o = *sp;
        if (o->version < n->have && o->refs == 0) *sp = o->next, bcast__obj_free(o);
        else sp = &o->next;
    }
    uint64_t a = newest_delivered_anchor(n);
    bcast__obj **pp = &n->objs;
    while (*pp) {
        bcast__obj *o = *pp;
        if (o->version < a && !bcast__obj_busy(o)) {
            *pp = o->next;
            bcast__obj_free(o);
        } else {
            /* Delivered and sent to every child that wanted it: only its
             * file is kept (the next child or joiner maps it again). */
            if (o->delivered) bcast__obj_unmap(o);
            pp = &o->next;
        }
    }
}

/* Hands complete objects to on_object strictly in version order: an anchor,
 * or a delta whose base is the version delivered last. */
void bcast__deliver(bcast_node *n)
{
    for (bcast__obj *o = n->objs; o; o = o->next) {
        if (o->version <= n->have || o->delivered) continue;
        if (!o->complete || (!o->anchor && o->base != n->have)) break;
        o->delivered = 1;
        n->have = o->version;
        n->stats.have_version = n->have;
        if (n->have > n->stats.newest_announced) n->stats.newest_announced = n->have;
        snprintf(n->stats.parent, sizeof n->stats.parent, "%s", n->fed_by);
        sh_info("push %s: v%llu complete (%s, %llu bytes)", n->name, (unsigned long long)o->version,
                o->anchor ? "anchor" : "delta", (unsigned long long)o->size);
        if (n->cfg.on_object) {
            bcast_object_info info = {o->version, o->base, o->anchor, o->squash, o->size, o->path,
                                      o->manifest, o->hash};
            n->cfg.on_object(n->cfg.arg, &info);
        }
    }
    bcast__drop_old(n);
}

/* Root: the object for the squashed delta at `path` from `from` to the
 * newest version (kept for other children at `from`). */
static bcast__obj *squash_obj(bcast_node *n, uint64_t from, const char *path)
{
    bcast__obj *last = bcast__find(n, n->have), *o;
    struct stat st;
    if (!last || stat(path, &st) < 0 ||
        bcast__obj_squash(last->manifest, path, from, bcast__chunk_for(n, (uint64_t)st.st_size), &o) < 0) {
        sh_warn("push %s: cannot serve the squashed delta %s: %s", n->name, path, sh_errmsg());
        return NULL;
    }
    o->next = n->squashes;
    n->squashes = o;
    return o;
}

/* Root: asks the squash callback once per child and newest version whether
 * a child two or more versions behind (at or after the anchor) should get
 * a squashed delta.  NULL: the chain. */
static bcast__obj *planned(bcast_node *n, bcast__peer *p, int below_anchor)
{
    if (!n->cfg.squash || n->cfg.nparents > 0 || n->have <= p->have) return NULL;
    /* Below the anchor, a child that holds a version may get one delta
     * across it; above it, one squashed delta over two versions or more. */
    if (below_anchor ? p->have == 0 : n->have < p->have + 2) return NULL;
    for (bcast__obj *o = n->squashes; o; o = o->next)
        if (o->base == p->have && o->version == n->have) return o;
    if (p->plan_for == n->have && p->plan_from == p->have) return NULL; /* asked: the chain */
    char path[4096];
    p->plan_for = n->have;
    p->plan_from = p->have;
    p->squash = n->cfg.squash(n->cfg.arg, p->have, n->have, path, sizeof path);
    sh_info("push %s: child %s from v%llu to v%llu: %s", n->name, p->name, (unsigned long long)p->have,
            (unsigned long long)n->have, p->squash ? "a squashed delta" : "the chain of deltas");
    return p->squash ? squash_obj(n, p->have, path) : NULL;
}

/* The next object on this child's plan, or NULL when it has everything this
 * node can give it.  A child behind this node's newest anchor gets the
 * anchor.  Otherwise (or when this node holds no anchor: a replica that
 * restarted on a version and since received only deltas) the root may
 * send a squashed delta when that is fewer bytes than the chain; else the
 * child gets the first object that is
 * a delta on its version: the next of the chain, or a squashed delta this
 * node received from its version. */
static bcast__obj *next_obj(bcast_node *n, bcast__peer *p)
{
    bcast__obj *anchor = NULL;
    for (bcast__obj *o = n->objs; o; o = o->next)
        if (o->anchor) anchor = o;
    int below = anchor && p->have < anchor->version;
    bcast__obj *o = planned(n, p, below);
    if (o) return o;
    if (below) return anchor;
    for (o = n->objs; o; o = o->next)
        if (o->version > p->have && !o->anchor && o->base == p->have) return o;
    return NULL;
}

/* The link: a FIFO drained at egress_bps, one per node (a NIC shared by its
 * children).  A chunk that became ready at `ready` starts on the link when
 * the link is free and it is ready, and is handed to UCX once the link has
 * had the time to carry it: each hop adds one chunk time, as store-and-
 * forward over a real link would.  The link's clock runs on scheduled
 * times, not on when this process got the CPU, so a node the scheduler held
 * back for a moment then sends what a NIC would have carried meanwhile
 * instead of losing that link time for good (a real NIC drains its queue
 * while the host is busy); the average rate never exceeds the link's. */
static int rate_ok(bcast_node *n, uint32_t len, double ready, double now)
{
    if (n->cfg.egress_bps <= 0) return 1;
    double start = ready > n->link_free ? ready : n->link_free;
    double done = start + len / n->cfg.egress_bps;
    if (done <= now) {
        n->link_free = done;
        return 1;
    }
    if (n->wake_at == 0 || done < n->wake_at) n->wake_at = done;
    return 0;
}

/* An object about to be sent to a child, mapped again if it was unmapped;
 * 0 if it cannot be (said once per attempt). */
static int mapped(bcast_node *n, bcast__obj *o)
{
    if (bcast__obj_map(o) == 0) return 1;
    sh_warn("push %s: %s", n->name, sh_errmsg());
    return 0;
}

static uint64_t chunk_sum(bcast__obj *o, uint32_t i)
{
    if (!o->summed[i]) {
        o->sums[i] = sh_hash64_of(o->map + bcast__obj_chunk_off(o, i), bcast__obj_chunk_len(o, i));
        o->summed[i] = 1;
    }
    return o->sums[i];
}

static void send_chunk(bcast_node *n, bcast__peer *p, bcast__obj *o, uint32_t i)
{
    bcast__chunk c = {o->version, i, bcast__obj_chunk_len(o, i), chunk_sum(o, i)};
    uint8_t hdr[BCAST__CHUNK_LEN];
    bcast__pack_chunk(&c, hdr);
    const uint8_t *data = o->map + bcast__obj_chunk_off(o, i);
    void *owned = NULL;
    if (n->corrupt_armed && n->corrupt_version == o->version && n->corrupt_index == i && c.len) {
        /* Fault injection for tests: one flipped bit on the wire, once. */
        owned = malloc(c.len);
        if (owned) {
            memcpy(owned, data, c.len);
            ((uint8_t *)owned)[c.len / 2] ^= 0x10;
            data = owned;
            n->corrupt_armed = 0;
            sh_warn("push %s: corrupting chunk %u of v%llu on purpose (SHOAL_BCAST_CORRUPT)",
                    n->name, i, (unsigned long long)o->version);
        }
    }
    if (bcast__send(n, p->ep, p, BCAST__AM_CHUNK, hdr, sizeof hdr, data, c.len, owned, o) == 0)
        n->stats.bytes_sent += c.len;
}

static void send_offer(bcast_node *n, bcast__peer *p, bcast__obj *o)
{
    uint32_t flags = (o->anchor ? BCAST__OFFER_ANCHOR : 0) | (o->squash ? BCAST__OFFER_SQUASH : 0);
    bcast__offer of = {o->version, o->base, o->size, o->hash, o->chunk_size, o->nchunks,
                       flags, (uint32_t)strlen(o->manifest)};
    uint8_t hdr[BCAST__OFFER_LEN];
    bcast__pack_offer(&of, hdr);
    bcast__send(n, p->ep, p, BCAST__AM_OFFER, hdr, sizeof hdr, o->manifest, of.manifest_len, NULL, o);
}

/* Posts at most one message to p; returns 1 if it did something. */
static int pump_peer(bcast_node *n, bcast__peer *p, double now)
{
    if (p->dead || !p->hello || p->outstanding >= BCAST__MAX_OUTSTANDING) return 0;
    if (p->nresend) {
        bcast__obj *o = bcast__find(n, p->resend_ver[0]);
        uint32_t i = p->resend_idx[0];
        if (o && i < o->nchunks && o->verified[i] && mapped(n, o)) {
            if (!rate_ok(n, bcast__obj_chunk_len(o, i), p->nack_at, now)) return 0;
            send_chunk(n, p, o, i);
        }
        p->nresend--;
        memmove(p->resend_ver, p->resend_ver + 1, p->nresend * sizeof *p->resend_ver);
        memmove(p->resend_idx, p->resend_idx + 1, p->nresend * sizeof *p->resend_idx);
        return 1;
    }
    if (!p->cur) {
        bcast__obj *o = next_obj(n, p);
        if (!o || !mapped(n, o)) return 0;
        p->cur = o;
        o->refs++;
        p->next = 0;
        if (p->resume_version == o->version && sh_hash128_eq(p->resume_hash, o->hash) &&
            p->resume_next <= o->nchunks)
            p->next = p->resume_next;
        send_offer(n, p, o);
        p->offer_at = now;
        return 1;
    }
    bcast__obj *o = p->cur;
    if (p->next >= o->nchunks) {
        p->have = o->version;
        o->refs--;
        p->cur = NULL;
        return 1;
    }
    if (!o->verified[p->next]) return 0;
    double ready = o->ready_at[p->next] > p->offer_at ? o->ready_at[p->next] : p->offer_at;
    if (!rate_ok(n, bcast__obj_chunk_len(o, p->next), ready, now)) return 0;
    send_chunk(n, p, o, p->next++);
    return 1;
}

/* Round-robin over the children, one message each per pass, so that a star
 * shares the node's egress evenly. */
void bcast__pump(bcast_node *n, double now)
{
    n->wake_at = 0;
    /* Children that understand it learn the newest version above them as
     * soon as this node knows it: a late joiner then builds the versions
     * on its way there without activating each (docs/push-protocol.md). */
    uint64_t newest = n->stats.newest_announced > n->have ? n->stats.newest_announced : n->have;
    for (bcast__peer *p = n->children; newest && p; p = p->next_peer) {
        if (p->dead || !p->hello || !p->announce || p->announced >= newest) continue;
        uint8_t hdr[BCAST__ANNOUNCE_LEN];
        bcast__pack_announce(newest, hdr);
        if (bcast__send(n, p->ep, p, BCAST__AM_ANNOUNCE, hdr, sizeof hdr, NULL, 0, NULL, NULL) == 0)
            p->announced = newest;
    }
    for (int pass = 0; pass < 1 << 16; pass++) {
        int did = 0;
        for (bcast__peer *p = n->children; p; p = p->next_peer) did |= pump_peer(n, p, now);
        if (!did) break;
    }
}

static int same(const char *a, const char *b) { return !strcmp(a, b); }

/* The tree's shape.  A child from another zone goes to this node's child in
 * that zone when there is one, so that exactly one copy crosses each zone
 * boundary, a child far behind too (a late joiner, or one whose relay
 * died): its zone's relay serves it the anchor and the chain within the
 * zone, where a catch-up from the root would cross the boundary again.  A
 * child that is the first of its zone stays here, and the root serves it
 * its cheapest plan (one squashed delta where that is fewer bytes).  A
 * child of this zone is accepted while fewer than `fanout` children of this
 * zone are attached, and otherwise sent to the child of this zone that was
 * sent the fewest so far. */
bcast__peer *bcast__choose_redirect(bcast_node *n, bcast__peer *p)
{
    bcast__peer *best = NULL;
    int same_zone = 0;
    int foreign = !same(p->zone, n->zone);
    for (bcast__peer *c = n->children; c; c = c->next_peer) {
        if (c == p || c->dead || !c->hello) continue;
        if (same(c->zone, n->zone)) same_zone++;
        if (!c->accepts || !c->addr[0] || !same(c->zone, p->zone)) continue;
        if (!best || c->redirects < best->redirects) best = c;
    }
    if (foreign) return best;
    int fanout = n->cfg.fanout > 0 ? n->cfg.fanout : 2;
    return same_zone < fanout ? NULL : best;
}
