/* Properties of a push node against hostile peers that the generated
 * mutants (scripts/mutgen.py) found no test held (docs/testing.md).
 *
 * One small tree, reused by every test in order: a push node C (in this
 * process, with the run's secret, its spool on a small tmpfs when one can
 * be mounted) whose parent is H, played by hand: a raw UCX worker on
 * loopback that speaks the push protocol (docs/push-protocol.md) as the
 * test tells it.  H is also connected to C's listener as another peer
 * (a would-be child), so that it can send C a parent's messages from an
 * endpoint that is not C's parent.  The properties:
 *  - a WELCOME counts only from the parent's endpoint: a stranger's wrong
 *    proof does not make C leave its parent, and nothing the parent sends
 *    counts before the parent's own WELCOME;
 *  - once the parent is proven, OFFER, CHUNK, ANNOUNCE and REDIRECT count
 *    only from the parent's endpoint: another peer's valid object is not
 *    delivered, its announce and redirect not taken;
 *  - a child refused for lacking the secret is dropped: nothing is sent to
 *    it, a valid HELLO on the same connection attaches nothing, and the
 *    connection is closed;
 *  - a malformed OFFER from the parent makes C leave it and keep nothing of
 *    it (no spool file, nothing to resume in its next HELLO);
 *  - an object whose chunks all pass their checksums but whose whole does
 *    not match the OFFER's hash is fetched again from its first chunk, and
 *    only the right bytes are delivered;
 *  - a full spool drops the chunks it cannot hold (no SIGBUS), and the
 *    object completes once there is space again;
 *  - a verified chunk is kept: a later copy of it with other bytes (and
 *    their checksum) does not replace it;
 *  - an OFFER of an object the node cannot hold (a size no file system or
 *    address space takes) is refused with a warning, and the node goes on;
 *  - an OFFER whose spool file cannot be created is refused with a warning
 *    that names the file and why;
 *  - a chunk that fails its checksum is asked for again with a NACK that
 *    names it, as docs/push-protocol.md has it (12-byte header, no data),
 *    and the node stays with its parent;
 *  - an OFFER whose spool file's path would not fit is refused, not
 *    received into a truncated path (the last test gives C a new spool);
 *  - a root's object is cut into chunks that cover its payload exactly,
 *    whatever its size (a multiple of the chunk size, or empty), so that
 *    its OFFER passes a receiver's check (pure: bcast__obj_from_file). */
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "shoal/bcast.h"
#include "shoal/net.h"
#include "weights/push/obj_int.h"
#include "weights/push/wire_int.h"

#define SECRET_HEX "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
#define OBJ_SIZE (64u << 10)
#define OBJ_CHUNK (16u << 10)
#define OBJ_CHUNKS (OBJ_SIZE / OBJ_CHUNK)
#define MAXEP 16

/* H: the hand-played parent and stranger. */
static struct {
    net_ucx u;
    ucp_ep_h pep;   /* the newest connection C opened to H: H as C's parent */
    ucp_ep_h cep;   /* H's connection to C's listener: another peer of C's */
    int cep_failed; /* C closed it */
    ucp_ep_h eps[MAXEP];
    int neps;
    int hellos;        /* HELLOs C sent to its parent */
    bcast__hello last; /* the newest of them */
    int got_on_cep[8]; /* messages C sent on H's other connection, by id */
    int nacks;         /* NACKs C sent its parent ... */
    bcast__nack nack;  /* ... the newest */
    size_t nack_data;  /* and its data length */
} H;

static bcast_node *C;
static sh_hash128 secret;
static char spool[4096];
static int mounted;
static int ndelivered;
static uint64_t delivered_v;
static sh_hash128 delivered_hash;
static int chunks_seen[8]; /* verified chunks per version (C's on_chunk) */

/* ---- H's side of the wire ------------------------------------------------ */

static void ep_err(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    if (ep == H.cep) H.cep_failed = 1;
}

static void conn_cb(ucp_conn_request_h req, void *arg)
{
    ucp_ep_h ep;
    if (net_ucx_accept(&H.u, req, ep_err, NULL, &ep) < 0) return;
    if (H.neps < MAXEP) H.eps[H.neps++] = ep;
    H.pep = ep;
}

static ucs_status_t on_msg(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                           const ucp_am_recv_param_t *prm)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    int from_cep = (prm->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) && prm->reply_ep == H.cep;
    if (from_cep && id < 8) H.got_on_cep[id]++;
    if (id == BCAST__AM_HELLO && !from_cep && bcast__unpack_hello(hdr, hlen, &H.last) == 0) H.hellos++;
    if (id == BCAST__AM_NACK && !from_cep && bcast__unpack_nack(hdr, hlen, &H.nack) == 0) H.nack_data = len, H.nacks++;
    return UCS_OK;
}

static void spin_once(void)
{
    bcast_node_run(C, 0.002);
    while (ucp_worker_progress(H.u.worker)) {
    }
}

/* Runs C and H for `s` seconds, or until *flag reaches `want`. */
static int spin_until(double s, const int *flag, int want)
{
    double end = sh_now_mono() + s;
    while (sh_now_mono() < end) {
        spin_once();
        if (flag && *flag >= want) return 1;
    }
    return flag && *flag >= want;
}

static void spin(double s) { spin_until(s, NULL, 0); }

static void h_send(ucp_ep_h ep, unsigned id, const void *hdr, size_t hlen, const void *data, size_t len)
{
    ucp_request_param_t prm = {0};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, id, hdr, hlen, data, len, &prm);
    if (UCS_PTR_IS_ERR(r)) fail_msg("H: send of message %u: %s", id, ucs_status_string(UCS_PTR_STATUS(r)));
    double end = sh_now_mono() + 10;
    while (r && ucp_request_check_status(r) == UCS_INPROGRESS) {
        if (sh_now_mono() > end) fail_msg("H: message %u not sent within 10 s", id);
        spin_once();
    }
    if (r) ucp_request_free(r);
}

static void h_welcome(ucp_ep_h ep, sh_hash128 proof)
{
    uint8_t w[BCAST__WELCOME_LEN];
    bcast__pack_welcome(proof, w);
    h_send(ep, BCAST__AM_WELCOME, w, sizeof w, NULL, 0);
}

/* The parent's answer to C's newest HELLO. */
static void h_welcome_parent(void) { h_welcome(H.pep, net_secret_proof(secret, "push parent", H.last.nonce)); }

static void h_announce(ucp_ep_h ep, uint64_t v)
{
    uint8_t a[BCAST__ANNOUNCE_LEN];
    bcast__pack_announce(v, a);
    h_send(ep, BCAST__AM_ANNOUNCE, a, sizeof a, NULL, 0);
}

/* ---- Objects ------------------------------------------------------------- */

typedef struct obj {
    uint64_t version;
    uint8_t *bytes;
    sh_hash128 hash;
    char manifest[256];
} obj;

static void obj_make(obj *o, uint64_t version)
{
    o->version = version;
    o->bytes = malloc(OBJ_SIZE);
    assert_non_null(o->bytes);
    uint64_t x = 0x9e3779b97f4a7c15ull * version;
    for (size_t i = 0; i < OBJ_SIZE; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        o->bytes[i] = (uint8_t)x;
    }
    o->hash = sh_hash128_of(o->bytes, OBJ_SIZE);
    char hex[33];
    sh_hash128_hex(o->hash, hex);
    snprintf(o->manifest, sizeof o->manifest, "{\"version\":%llu,\"kind\":\"anchor\",\"size\":%u,\"xxh3\":\"%s\"}",
             (unsigned long long)version, OBJ_SIZE, hex);
}

/* An OFFER of o; `manifest_extra` is added to the manifest length the
 * header claims, `nchunks_extra` to its chunk count (0, 0: a valid one). */
static void h_offer(ucp_ep_h ep, const obj *o, uint32_t manifest_extra, uint32_t nchunks_extra)
{
    bcast__offer of = {.version = o->version, .base = 0, .size = OBJ_SIZE, .hash = o->hash,
                       .chunk_size = OBJ_CHUNK, .nchunks = OBJ_CHUNKS + nchunks_extra,
                       .flags = BCAST__OFFER_ANCHOR, .manifest_len = (uint32_t)strlen(o->manifest) + manifest_extra};
    uint8_t hdr[BCAST__OFFER_LEN];
    bcast__pack_offer(&of, hdr);
    h_send(ep, BCAST__AM_OFFER, hdr, sizeof hdr, o->manifest, strlen(o->manifest));
}

/* Chunk i of o with its checksum; `bad`: one byte changed, and the
 * checksum of the changed bytes (it passes the chunk's check); `bad` 2:
 * the byte changed after the checksum (damaged on the way). */
static void h_chunk(ucp_ep_h ep, const obj *o, uint32_t i, int bad)
{
    static uint8_t buf[OBJ_CHUNK];
    memcpy(buf, o->bytes + (size_t)i * OBJ_CHUNK, OBJ_CHUNK);
    if (bad == 1) buf[OBJ_CHUNK / 3] ^= 0x40;
    bcast__chunk c = {.version = o->version, .index = i, .len = OBJ_CHUNK, .xxh64 = sh_hash64_of(buf, OBJ_CHUNK)};
    if (bad == 2) buf[OBJ_CHUNK / 3] ^= 0x40;
    uint8_t hdr[BCAST__CHUNK_LEN];
    bcast__pack_chunk(&c, hdr);
    h_send(ep, BCAST__AM_CHUNK, hdr, sizeof hdr, buf, OBJ_CHUNK);
}

static void h_object(ucp_ep_h ep, const obj *o)
{
    h_offer(ep, o, 0, 0);
    for (uint32_t i = 0; i < OBJ_CHUNKS; i++) h_chunk(ep, o, i, 0);
}

static int spool_has(uint64_t v)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/v%llu.part", spool, (unsigned long long)v);
    return sh_path_exists(p);
}

static bcast_stats stats(void)
{
    bcast_stats s;
    bcast_node_stats(C, &s);
    return s;
}

/* ---- C ------------------------------------------------------------------- */

static void on_object(void *arg, const bcast_object_info *info)
{
    size_t n = 0;
    uint8_t *b = tu_read_file(info->path, &n);
    delivered_v = info->version;
    delivered_hash = sh_hash128_of(b, n);
    free(b);
    ndelivered++;
}

static void on_chunk(void *arg, uint64_t version, uint32_t index, uint32_t nchunks)
{
    if (version < 8) chunks_seen[version]++;
}

static bcast_node *node_new(const char *dir)
{
    bcast_config cfg = {0};
    cfg.name = "c";
    cfg.spool = dir;
    cfg.accept_children = 1;
    cfg.parents[0] = H.u.addr;
    cfg.nparents = 1;
    cfg.on_object = on_object;
    cfg.on_chunk = on_chunk;
    bcast_node *n;
    TU_OK(bcast_node_new(&cfg, &n));
    return n;
}

static int setup(void **state)
{
    setenv("SHOAL_RUN_SECRET", SECRET_HEX, 1);
    assert_int_equal(net_run_secret(&secret), 1);
    snprintf(spool, sizeof spool, "%s", tu_path("pp-spool"));
    TU_OK(sh_mkdir_p(spool, 0755));
    mounted = mount("tmpfs", spool, "tmpfs", 0, "size=1m") == 0;
    TU_OK(net_ucx_open(&H.u, "hostile peer", UCP_FEATURE_AM));
    for (unsigned id = BCAST__AM_HELLO; id <= BCAST__AM_ANNOUNCE; id++) {
        ucp_am_handler_param_t h = {0};
        h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
        h.id = id;
        h.cb = on_msg;
        h.arg = (void *)(uintptr_t)id;
        h.flags = UCP_AM_FLAG_WHOLE_MSG;
        assert_int_equal(ucp_worker_set_am_recv_handler(H.u.worker, &h), UCS_OK);
    }
    TU_OK(net_ucx_listen(&H.u, "hostile peer", "127.0.0.1:0", conn_cb, NULL));
    C = node_new(spool);
    if (!spin_until(10, &H.hellos, 1)) fail_msg("C sent its parent no HELLO");
    TU_OK(net_ucx_connect(&H.u, "hostile peer", bcast_node_address(C), ep_err, NULL, &H.cep));
    return 0;
}

static void close_ep(ucp_ep_h ep)
{
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *r = ucp_ep_close_nbx(ep, &prm);
    while (r && !UCS_PTR_IS_ERR(r) && ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(H.u.worker);
    if (r && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
}

static int teardown(void **state)
{
    bcast_node_free(C);
    for (int i = 0; i < H.neps; i++) close_ep(H.eps[i]);
    if (H.cep) close_ep(H.cep);
    net_ucx_close(&H.u);
    if (mounted) umount2(spool, MNT_DETACH);
    return 0;
}

/* ---- The tests ----------------------------------------------------------- */

/* C waits for its parent's WELCOME.  A stranger's WELCOME (a wrong proof)
 * does not count against the parent, and nothing the parent sends counts
 * before the parent's own. */
static void test_welcome_only_from_parent(void **state)
{
    h_welcome(H.cep, net_secret_proof(secret, "push parent", (sh_hash128){1, 2}));
    h_announce(H.pep, 7);
    spin(0.4);
    bcast_stats s = stats();
    if (s.parents_refused || H.hellos != 1 || !s.attached)
        fail_msg("a stranger's WELCOME made C leave its parent (refused %llu, HELLOs %d, attached %d)",
                 (unsigned long long)s.parents_refused, H.hellos, s.attached);
    assert_int_equal(s.newest_announced, 0); /* the parent is not proven yet */
    h_welcome_parent();
    h_announce(H.pep, 7);
    spin(0.2);
    s = stats();
    assert_int_equal(s.newest_announced, 7);
    assert_int_equal(s.parents_refused, 0);
}

/* A valid object, an ANNOUNCE and a REDIRECT from a peer that is not the
 * parent are ignored; the same object from the parent is delivered. */
static void test_parent_messages_only_from_parent(void **state)
{
    obj o;
    obj_make(&o, 1);
    h_announce(H.cep, 50);
    uint8_t red[BCAST__REDIRECT_LEN] = {0};
    snprintf((char *)red, sizeof red, "%s", H.u.addr);
    h_send(H.cep, BCAST__AM_REDIRECT, red, sizeof red, NULL, 0);
    h_object(H.cep, &o);
    spin(0.4);
    bcast_stats s = stats();
    if (ndelivered || s.have_version || chunks_seen[1])
        fail_msg("C took v1 from a peer that is not its parent (%d delivered, %d chunks)", ndelivered, chunks_seen[1]);
    assert_false(spool_has(1));
    assert_int_equal(s.newest_announced, 7);
    assert_int_equal(s.redirects, 0);
    assert_int_equal(H.hellos, 1);
    h_object(H.pep, &o);
    if (!spin_until(5, &ndelivered, 1)) fail_msg("v1 from the parent was not delivered");
    assert_int_equal(delivered_v, 1);
    assert_true(sh_hash128_eq(delivered_hash, o.hash));
    free(o.bytes);
}

/* A HELLO without the secret is refused, and the connection with it: a
 * valid HELLO on it afterwards attaches nothing and gets nothing. */
static void test_refused_child_dropped(void **state)
{
    bcast__hello h = {.flags = BCAST__HELLO_ANNOUNCE};
    snprintf(h.name, sizeof h.name, "stranger");
    snprintf(h.zone, sizeof h.zone, "default");
    uint8_t buf[BCAST__HELLO_LEN];
    bcast__pack_hello(&h, buf);
    h_send(H.cep, BCAST__AM_HELLO, buf, sizeof buf, NULL, 0);
    spin(0.2);
    assert_int_equal(stats().children_refused, 1);
    net_hello hs;
    TU_OK(net_hello_make(secret, "push child", "push parent", &hs));
    h.nonce = hs.nonce, h.proof = hs.proof;
    bcast__pack_hello(&h, buf);
    if (!H.cep_failed) h_send(H.cep, BCAST__AM_HELLO, buf, sizeof buf, NULL, 0);
    spin_until(3, &H.cep_failed, 1);
    bcast_stats s = stats();
    if (s.children || H.got_on_cep[BCAST__AM_WELCOME] || H.got_on_cep[BCAST__AM_OFFER])
        fail_msg("a refused child's connection took a HELLO: %d children, %d WELCOME, %d OFFER", s.children,
                 H.got_on_cep[BCAST__AM_WELCOME], H.got_on_cep[BCAST__AM_OFFER]);
    if (!H.cep_failed) fail_msg("C kept the connection of a child it refused");
}

/* A malformed OFFER from the parent: C leaves it, and keeps nothing of the
 * offer (no spool file, nothing to resume when it attaches again). */
static void test_bad_offer_leaves_nothing(void **state)
{
    obj o;
    obj_make(&o, 2);
    for (int k = 0; k < 2; k++) {
        int before = H.hellos;
        h_offer(H.pep, &o, k == 0, k == 1); /* a manifest longer than sent; a chunk count off by one */
        if (!spin_until(5, &H.hellos, before + 1)) fail_msg("C stayed with a parent that sent a malformed OFFER");
        h_welcome_parent();
        if (spool_has(2) || H.last.resume_version)
            fail_msg("a malformed OFFER left v2 in the spool (%d) or to resume (v%llu)", spool_has(2),
                     (unsigned long long)H.last.resume_version);
        assert_int_equal(H.last.have, 1);
    }
    assert_int_equal(stats().have_version, 1);
    free(o.bytes);
}

/* Every chunk passes its checksum but the whole does not match the OFFER's
 * hash (the sender's copy is bad): C starts the object over from its first
 * chunk, and delivers only the right bytes. */
static void test_whole_hash_mismatch_refetched(void **state)
{
    obj o;
    obj_make(&o, 2);
    int before = H.hellos;
    h_offer(H.pep, &o, 0, 0);
    for (uint32_t i = 0; i < OBJ_CHUNKS; i++) h_chunk(H.pep, &o, i, i == OBJ_CHUNKS - 1);
    if (!spin_until(5, &H.hellos, before + 1)) fail_msg("C kept a parent whose v2 does not match its hash");
    assert_int_equal(ndelivered, 1);
    assert_int_equal(H.last.resume_version, 2);
    assert_int_equal(H.last.resume_next, 0); /* which chunk is bad is unknown: all again */
    h_welcome_parent();
    h_object(H.pep, &o);
    if (!spin_until(5, &ndelivered, 2)) fail_msg("v2 fetched again was not delivered");
    assert_int_equal(delivered_v, 2);
    assert_true(sh_hash128_eq(delivered_hash, o.hash));
    free(o.bytes);
}

/* The spool's file system is full: the chunks that do not fit are dropped
 * (a write into the mapped file would kill the node with SIGBUS), and the
 * object completes when they come again with space. */
static void test_full_spool_drops_chunks(void **state)
{
    if (!mounted) {
        fprintf(stderr, "cannot mount a tmpfs (%s): skipping\n", strerror(errno));
        skip();
    }
    char filler[4200];
    snprintf(filler, sizeof filler, "%s/filler", spool);
    struct statvfs vfs;
    assert_int_equal(statvfs(spool, &vfs), 0);
    uint64_t room = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    assert_true(room > OBJ_CHUNK);
    int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(posix_fallocate(fd, 0, (off_t)(room - OBJ_CHUNK / 2)), 0);
    close(fd);
    obj o;
    obj_make(&o, 3);
    h_object(H.pep, &o);
    spin(0.3);
    assert_int_equal(ndelivered, 2);
    if (chunks_seen[3] >= (int)OBJ_CHUNKS) fail_msg("all of v3 landed in a full spool");
    unlink(filler);
    for (uint32_t i = 0; i < OBJ_CHUNKS; i++) h_chunk(H.pep, &o, i, 0);
    if (!spin_until(5, &ndelivered, 3)) fail_msg("v3 was not delivered once the spool had space");
    assert_int_equal(delivered_v, 3);
    assert_true(sh_hash128_eq(delivered_hash, o.hash));
    free(o.bytes);
}

/* A chunk is verified once: a second copy of it with other bytes (a
 * resend racing the first, or a parent that changed its mind) is dropped,
 * so the object completes with the bytes verified first and C stays. */
static void test_verified_chunk_kept(void **state)
{
    obj o;
    obj_make(&o, 4);
    int before = H.hellos, had = ndelivered;
    h_offer(H.pep, &o, 0, 0);
    h_chunk(H.pep, &o, 0, 0);
    h_chunk(H.pep, &o, 0, 1);
    for (uint32_t i = 1; i < OBJ_CHUNKS; i++) h_chunk(H.pep, &o, i, 0);
    if (!spin_until(5, &ndelivered, had + 1)) fail_msg("v4 was not delivered after a second copy of its chunk 0");
    assert_int_equal(delivered_v, 4);
    assert_true(sh_hash128_eq(delivered_hash, o.hash));
    assert_int_equal(H.hellos, before);
    free(o.bytes);
}

/* An OFFER of 2^47 bytes (in 65536 chunks of 2 GiB): its spool file cannot
 * be made or mapped, so C refuses it with a warning and goes on: the next
 * object is delivered, and nothing of the big one stays. */
static void test_offer_too_big_refused(void **state)
{
    obj o;
    obj_make(&o, 6);
    bcast__offer of = {.version = 6, .size = 1ull << 47, .hash = o.hash, .chunk_size = 1u << 31, .nchunks = 1u << 16,
                       .flags = BCAST__OFFER_ANCHOR, .manifest_len = (uint32_t)strlen(o.manifest)};
    uint8_t hdr[BCAST__OFFER_LEN];
    bcast__pack_offer(&of, hdr);
    int before = H.hellos, had = ndelivered;
    h_send(H.pep, BCAST__AM_OFFER, hdr, sizeof hdr, o.manifest, strlen(o.manifest));
    spin(0.2);
    assert_false(spool_has(6));
    h_object(H.pep, &o);
    if (!spin_until(5, &ndelivered, had + 1)) fail_msg("v6 was not delivered after an OFFER too big to hold");
    assert_int_equal(delivered_v, 6);
    assert_true(sh_hash128_eq(delivered_hash, o.hash));
    assert_int_equal(H.hellos, before);
    free(o.bytes);
}

static char warned[1024];

static void sink(int level, const char *line, void *arg)
{
    if (level == SH_LOG_WARN && strstr(line, "v7.part")) snprintf(warned, sizeof warned, "%s", line);
}

/* The spool file of v7 cannot be created (a directory has its name): C
 * refuses the OFFER with a warning that names the file and the reason,
 * and takes v7 once the name is free. */
static void test_spool_file_refused_named(void **state)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/v7.part", spool);
    assert_int_equal(mkdir(p, 0755), 0);
    obj o;
    obj_make(&o, 7);
    int had = ndelivered;
    warned[0] = 0;
    sh_log_set_sink(sink, NULL);
    h_offer(H.pep, &o, 0, 0);
    spin(0.2);
    sh_log_set_sink(NULL, NULL);
    if (!strstr(warned, "create") || !strstr(warned, "Is a directory"))
        fail_msg("an uncreatable spool file was reported as \"%s\"", warned);
    assert_int_equal(rmdir(p), 0);
    h_object(H.pep, &o);
    if (!spin_until(5, &ndelivered, had + 1)) fail_msg("v7 was not delivered once its spool name was free");
    assert_int_equal(delivered_v, 7);
    assert_true(sh_hash128_eq(delivered_hash, o.hash));
    free(o.bytes);
}

/* A chunk damaged on the way fails its checksum: C drops it and asks its
 * parent for it again (a NACK naming it: a 12-byte header, no data),
 * without leaving it; the chunk sent again completes the object. */
static void test_corrupt_chunk_nacked(void **state)
{
    obj o;
    obj_make(&o, 5);
    int before = H.hellos, had = ndelivered, nacks = H.nacks;
    h_offer(H.pep, &o, 0, 0);
    for (uint32_t i = 0; i < OBJ_CHUNKS; i++) h_chunk(H.pep, &o, i, i == 2 ? 2 : 0);
    if (!spin_until(5, &H.nacks, nacks + 1)) fail_msg("no NACK for a chunk that failed its checksum");
    assert_int_equal(H.nack.version, 5);
    assert_int_equal(H.nack.index, 2);
    assert_int_equal(H.nack_data, 0);
    spin(0.1);
    assert_int_equal(ndelivered, had);
    h_chunk(H.pep, &o, 2, 0);
    if (!spin_until(5, &ndelivered, had + 1)) fail_msg("v5 was not delivered after its chunk came again");
    assert_int_equal(delivered_v, 5);
    assert_true(sh_hash128_eq(delivered_hash, o.hash));
    assert_int_equal(H.hellos, before);
    assert_int_equal(H.nacks, nacks + 1);
    assert_int_equal(stats().chunks_corrupt, 1);
    free(o.bytes);
}

/* A spool directory whose path leaves no room for "/v<version>.part": an
 * OFFER of such a version is refused (the file would be created at a
 * truncated path, another name); a short version's is taken. */
static void test_spool_path_too_long(void **state)
{
    static char dir[4096];
    int k = snprintf(dir, sizeof dir, "%s", tu_path("pp-long"));
    while (k < 4080 - 201) k += snprintf(dir + k, sizeof dir - (size_t)k, "/%0200d", 0);
    k += snprintf(dir + k, sizeof dir - (size_t)k, "/%0*d", 4080 - k - 1, 0);
    assert_int_equal(k, 4080);
    bcast_node_free(C);
    int before = H.hellos, had = ndelivered;
    C = node_new(dir); /* a mkdir -p of a path of 4080 bytes */
    if (!spin_until(10, &H.hellos, before + 1)) fail_msg("the new node sent its parent no HELLO");
    h_welcome_parent();
    obj big, o;
    obj_make(&big, 1000000000000000ull); /* "/v1000000000000000.part": 23 more bytes */
    obj_make(&o, 1);
    h_object(H.pep, &big);
    h_object(H.pep, &o);
    if (!spin_until(5, &ndelivered, had + 1)) fail_msg("v1 was not delivered into the long spool");
    spin(0.2);
    if (ndelivered != had + 1 || delivered_v != 1)
        fail_msg("v%llu was received into a truncated spool path (%d delivered, the last v%llu)",
                 (unsigned long long)big.version, ndelivered - had, (unsigned long long)delivered_v);
    assert_true(sh_hash128_eq(delivered_hash, o.hash));
    assert_int_equal(stats().have_version, 1);
    free(big.bytes), free(o.bytes);
    bcast_node_free(C);
    C = NULL;
    sh_rm_rf(tu_path("pp-long"));
}

/* A root's object of any size: ceil(size / chunk) chunks whose lengths add
 * up to the size, none empty, and an OFFER made of it (as the root sends
 * it) that a receiver's check accepts; the same for a squashed delta. */
static void test_root_chunks_cover_payload(void **state)
{
    const uint64_t sizes[] = {0, 1, 4095, 4096, 4097, 3 * 16384, 3 * 16384 + 1, 32 * 4096};
    const uint32_t chunks[] = {4096, 16384};
    char path[4096];
    snprintf(path, sizeof path, "%s", tu_path("pp-root.bin"));
    uint8_t *buf = calloc(1, 32 * 4096 + 1);
    assert_non_null(buf);
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
        for (size_t ci = 0; ci < 2; ci++)
            for (int squash = 0; squash < 2; squash++) {
                uint64_t size = sizes[si];
                uint32_t cs = chunks[ci];
                for (uint64_t i = 0; i < size; i++) buf[i] = (uint8_t)(i * 7 + si);
                tu_write_file(path, buf, size);
                char hex[33], man[256];
                sh_hash128_hex(sh_hash128_of(buf, size), hex);
                snprintf(man, sizeof man, "{\"version\":5,\"kind\":\"anchor\",\"size\":%llu,\"xxh3\":\"%s\"}",
                         (unsigned long long)size, hex);
                bcast__obj *o = NULL;
                if (squash) TU_OK(bcast__obj_squash(man, path, 3, cs, &o));
                else TU_OK(bcast__obj_from_file(man, path, cs, &o));
                uint64_t want = (size + cs - 1) / cs, sum = 0;
                if (o->nchunks != want)
                    fail_msg("%llu bytes in chunks of %u: %u chunks, want %llu", (unsigned long long)size, cs, o->nchunks,
                             (unsigned long long)want);
                for (uint32_t i = 0; i < o->nchunks; i++) {
                    uint32_t len = bcast__obj_chunk_len(o, i);
                    if (len == 0 || len > cs) fail_msg("%llu bytes: chunk %u of %u bytes", (unsigned long long)size, i, len);
                    sum += len;
                }
                assert_true(sum == size);
                assert_true(o->complete && o->nverified == o->nchunks);
                bcast__offer of = {o->version, o->base, o->size, o->hash, o->chunk_size, o->nchunks,
                                   (o->anchor ? BCAST__OFFER_ANCHOR : 0) | (o->squash ? BCAST__OFFER_SQUASH : 0),
                                   (uint32_t)strlen(o->manifest)},
                             got;
                uint8_t hdr[BCAST__OFFER_LEN];
                bcast__pack_offer(&of, hdr);
                if (bcast__unpack_offer(hdr, sizeof hdr, &got) < 0) fail_msg("its OFFER is refused: %s", sh_errmsg());
                bcast__obj_free(o);
            }
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_root_chunks_cover_payload),
        cmocka_unit_test(test_welcome_only_from_parent),
        cmocka_unit_test(test_parent_messages_only_from_parent),
        cmocka_unit_test(test_refused_child_dropped),
        cmocka_unit_test(test_bad_offer_leaves_nothing),
        cmocka_unit_test(test_whole_hash_mismatch_refetched),
        cmocka_unit_test(test_full_spool_drops_chunks),
        cmocka_unit_test(test_verified_chunk_kept),
        cmocka_unit_test(test_corrupt_chunk_nacked),
        cmocka_unit_test(test_offer_too_big_refused),
        cmocka_unit_test(test_spool_file_refused_named),
        cmocka_unit_test(test_spool_path_too_long),
    };
    /* In this order, on one tree: no SHOAL_TEST_FILTER (each test starts
     * where the one before left C). */
    return cmocka_run_group_tests(tests, setup, teardown);
}
