/* The store: run folders, version folders, manifests, and the LATEST pointer.
 *
 * The one invariant everything here protects: LATEST never names a version
 * whose bytes are not durable.  A version folder is built under staging/,
 * fsynced file by file, renamed into versions/ (and versions/ fsynced), and
 * only then is LATEST replaced with sh_write_atomic(). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shoal/ckpt.h"
#include "weights/store/store_int.h"

int store__valid_run(const char *run)
{
    size_t n = strlen(run);
    if (n == 0 || n > 64 || run[0] == '.') return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)run[i]) && !strchr("._-", run[i])) return 0;
    return 1;
}

int store__version_dir(const store *s, uint64_t v, char *out, size_t cap)
{
    int k = snprintf(out, cap, "%s/%010llu", s->versions, (unsigned long long)v);
    if (k < 0 || (size_t)k >= cap) return sh_err(SH_ERANGE, "path too long under %s", s->versions);
    return SH_OK;
}

int store_open(const char *root, const char *run, int create, store **out)
{
    *out = NULL;
    if (!run) run = STORE_DEFAULT_RUN;
    if (!store__valid_run(run))
        return sh_err(SH_EINVAL, "run id \"%s\": use 1-64 letters, digits, '.', '_' or '-'", run);
    store *s = calloc(1, sizeof *s);
    if (!s) return sh_err(SH_ENOMEM, "store");
    s->writer_fd = -1;
    snprintf(s->run, sizeof s->run, "%s", run);
    int rc = snprintf(s->root, sizeof s->root, "%s", root) >= (int)sizeof s->root
                 ? sh_err(SH_ERANGE, "store path too long")
                 : 0;
    if (rc == 0) rc = sh_path_join(s->dir, sizeof s->dir, root, run);
    if (rc == 0) rc = sh_path_join(s->versions, sizeof s->versions, s->dir, "versions");
    if (rc == 0) rc = sh_path_join(s->staging, sizeof s->staging, s->dir, "staging");
    if (rc == 0 && create) {
        rc = sh_mkdir_p(s->versions, 0755);
        if (rc == 0) rc = sh_mkdir_p(s->staging, 0755);
    } else if (rc == 0 && !sh_is_dir(s->versions)) {
        rc = sh_is_dir(root)         ? sh_err(SH_ENOENT, "store %s has no run \"%s\" (publish to create it)", root, run)
             : sh_path_exists(root) ? sh_err(SH_EINVAL, "store %s is a file, not a store's folder", root)
                                    : sh_err(SH_ENOENT, "store %s does not exist (`shoal store publish %s CKPT` creates it)", root, root);
    }
    if (rc < 0) {
        free(s);
        return rc;
    }
    *out = s;
    return SH_OK;
}

void store_close(store *s)
{
    if (s) store__keep_free(s);
    if (s && s->writer_fd >= 0) close(s->writer_fd);
    free(s);
}

int store_claim_publisher(store *s, const char *writer_id)
{
    if (s->writer_fd >= 0) return SH_OK;
    if (writer_id && (!*writer_id || strlen(writer_id) > 64 || strchr(writer_id, '\n')))
        return sh_err(SH_EINVAL, "run \"%s\" of store %s: writer id \"%s\": use 1-64 characters, no newline",
                      s->run, s->root, writer_id);
    char path[4096];
    SH_TRY(sh_path_join(path, sizeof path, s->dir, "publisher"));
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return sh_err_errno(errno, "open %s", path);
    if (flock(fd, (writer_id ? LOCK_SH : LOCK_EX) | LOCK_NB) < 0) {
        int e = errno;
        char held[128] = "";
        ssize_t k = pread(fd, held, sizeof held - 1, 0);
        held[k > 0 ? k : 0] = 0;
        held[strcspn(held, "\n")] = 0;
        close(fd);
        if (e != EWOULDBLOCK) return sh_err_errno(e, "lock %s", path);
        long pid = atol(held);
        const char *id = strchr(held, ' ');
        return sh_err(SH_EEXIST, "run \"%s\" of store %s already has a publisher (process %ld%s%s%s%s): "
                      "publish from one process only (with DDP, from rank 0); publishers that share a run "
                      "on purpose each give a writer id", s->run, s->root, pid,
                      pid == (long)getpid() ? ", this one" : "", id ? ", writer id \"" : "",
                      id ? id + 1 : "", id ? "\"" : "");
    }
    /* The holder's pid (and writer id) for the message a second publisher
     * gets; a shared holder overwrites another's, either names one. */
    char text[128];
    int n = snprintf(text, sizeof text, "%ld%s%s\n", (long)getpid(), writer_id ? " " : "",
                     writer_id ? writer_id : "");
    if (ftruncate(fd, 0) < 0 || pwrite(fd, text, (size_t)n, 0) != n) sh_debug("%s: cannot write the pid", path);
    s->writer_fd = fd;
    return SH_OK;
}
const char *store_root(const store *s) { return s->root; }
const char *store_run(const store *s) { return s->run; }

/* ---- The LATEST pointer ------------------------------------------------ */

static int parse_latest(store *s, const char *path, const char *text, size_t len, uint64_t *out)
{
    json_t *j;
    if (sh_json_parse(text, len, path, &j) < 0)
        return sh_err_wrap(SH_EFORMAT, "unparsable pointer (not written by shoal, or damaged: "
                           "restore it or remove the run)");
    const char *fmt = NULL, *run = NULL;
    int64_t v = 0;
    int rc = sh_json_get_str(j, "format", 1, path, &fmt);
    if (rc == 0 && strcmp(fmt, "shoal-latest/1"))
        rc = sh_err(SH_EFORMAT, "%s: pointer format \"%s\", expected shoal-latest/1", path, fmt);
    if (rc == 0) rc = sh_json_get_str(j, "run", 1, path, &run);
    if (rc == 0 && strcmp(run, s->run))
        rc = sh_err(SH_EMISMATCH, "%s: pointer of run \"%s\" in the folder of run \"%s\"; refusing "
                    "to fall back (was the store copied between runs?)", path, run, s->run);
    if (rc == 0) rc = sh_json_get_i64(j, "version", 1, path, &v);
    if (rc == 0 && v < 1) rc = sh_err(SH_EFORMAT, "%s: version %lld is not positive", path, (long long)v);
    json_decref(j);
    if (rc == 0) *out = (uint64_t)v;
    return rc;
}

int store_latest(store *s, uint64_t *out)
{
    char path[4096], *text;
    size_t len;
    *out = 0;
    SH_TRY(sh_path_join(path, sizeof path, s->dir, "LATEST"));
    int rc = sh_read_file(path, 4096, &text, &len);
    if (rc == SH_ENOENT) return SH_OK;
    if (rc < 0) return rc;
    uint64_t v = 0;
    rc = parse_latest(s, path, text, len, &v);
    free(text);
    if (rc < 0) return rc;
    char dir[4096], man[4096];
    SH_TRY(store__version_dir(s, v, dir, sizeof dir));
    SH_TRY(sh_path_join(man, sizeof man, dir, "manifest.json"));
    if (!sh_path_exists(man))
        return sh_err(SH_ENOENT, "%s names version %llu, but %s is missing", path,
                      (unsigned long long)v, man);
    *out = v;
    return SH_OK;
}

static int write_latest(store *s, uint64_t v)
{
    char path[4096], text[256];
    SH_TRY(sh_path_join(path, sizeof path, s->dir, "LATEST"));
    int n = snprintf(text, sizeof text, "{\"format\":\"shoal-latest/1\",\"run\":\"%s\",\"version\":%llu}\n",
                     s->run, (unsigned long long)v);
    return sh_write_atomic(path, text, (size_t)n);
}

/* ---- Manifests ----------------------------------------------------------- */

static int get_hash(json_t *j, const char *key, const char *ctx, sh_hash128 *h)
{
    const char *hex;
    SH_TRY(sh_json_get_str(j, key, 1, ctx, &hex));
    if (sh_hash128_parse(hex, h) < 0)
        return sh_err(SH_EFORMAT, "%s: field \"%s\": \"%s\" is not 32 hex digits", ctx, key, hex);
    return SH_OK;
}

static int parse_manifest(const char *want_run, uint64_t v, const char *ctx, json_t *j, store_version *m)
{
    static const char *const keys[] = {"format", "run", "version", "kind", "base", "file", "size",
                                       "xxh3", "model_size", "model_xxh3", "created_at", NULL};
    const char *fmt, *run, *kind, *file;
    int64_t ver, base = 0, size, msize;
    memset(m, 0, sizeof *m);
    SH_TRY(sh_json_check_keys(j, keys, ctx));
    SH_TRY(sh_json_get_str(j, "format", 1, ctx, &fmt));
    if (strcmp(fmt, "shoal-version/1"))
        return sh_err(SH_EFORMAT, "%s: format \"%s\", expected shoal-version/1", ctx, fmt);
    SH_TRY(sh_json_get_str(j, "run", 1, ctx, &run));
    SH_TRY(sh_json_get_i64(j, "version", 1, ctx, &ver));
    if (!v && ver > 0) v = (uint64_t)ver;
    if ((want_run && strcmp(run, want_run)) || ver != (int64_t)v)
        return sh_err(SH_EMISMATCH, "%s: says run \"%s\" version %lld, but belongs to run \"%s\" "
                      "version %llu", ctx, run, (long long)ver, want_run ? want_run : run, (unsigned long long)v);
    SH_TRY(sh_json_get_str(j, "kind", 1, ctx, &kind));
    SH_TRY(sh_json_get_str(j, "file", 1, ctx, &file));
    SH_TRY(sh_json_get_i64(j, "size", 1, ctx, &size));
    SH_TRY(sh_json_get_i64(j, "model_size", 1, ctx, &msize));
    SH_TRY(sh_json_get_i64(j, "base", 0, ctx, &base));
    SH_TRY(get_hash(j, "xxh3", ctx, &m->xxh3));
    SH_TRY(get_hash(j, "model_xxh3", ctx, &m->model_xxh3));
    SH_TRY(sh_json_get_num(j, "created_at", 0, ctx, &m->created_at));
    m->anchor = !strcmp(kind, "anchor");
    if (!m->anchor && strcmp(kind, "delta"))
        return sh_err(SH_EFORMAT, "%s: kind \"%s\" is neither anchor nor delta", ctx, kind);
    if (!m->anchor && base != ver - 1)
        return sh_err(SH_EFORMAT, "%s: a delta's base must be %lld, not %lld", ctx, (long long)ver - 1,
                      (long long)base);
    if (size < 0 || msize < 0) return sh_err(SH_EFORMAT, "%s: negative size", ctx);
    if (m->anchor && (size != msize || !sh_hash128_eq(m->xxh3, m->model_xxh3)))
        return sh_err(SH_EFORMAT, "%s: an anchor's payload is its model: size and xxh3 must equal "
                      "model_size and model_xxh3", ctx);
    if (strchr(file, '/') || !file[0] || strlen(file) >= sizeof m->file)
        return sh_err(SH_EFORMAT, "%s: file \"%s\" must be a plain name", ctx, file);
    m->version = v;
    m->base = m->anchor ? 0 : (uint64_t)base;
    m->size = (uint64_t)size;
    m->model_size = (uint64_t)msize;
    snprintf(m->file, sizeof m->file, "%s", file);
    return SH_OK;
}

int store_get(store *s, uint64_t v, store_version *out, char **text)
{
    char dir[4096], path[4096], *buf;
    size_t len;
    SH_TRY(store__version_dir(s, v, dir, sizeof dir));
    SH_TRY(sh_path_join(path, sizeof path, dir, "manifest.json"));
    int rc = sh_read_file(path, 1 << 20, &buf, &len);
    uint64_t latest = 0;
    /* A version past LATEST that has no folder was never published: say
     * so, rather than suggest a damaged store. */
    if (rc == SH_ENOENT && !sh_path_exists(dir) && store_latest(s, &latest) == SH_OK && v > latest)
        return sh_err(SH_ENOENT, "run \"%s\" has no version %llu (LATEST is %llu)", s->run,
                      (unsigned long long)v, (unsigned long long)latest);
    if (rc == SH_ENOENT)
        return sh_err(SH_ENOENT, "version %llu of run \"%s\": %s is missing (truncated or removed "
                      "version folder)", (unsigned long long)v, s->run, path);
    if (rc < 0) return rc;
    json_t *j;
    rc = sh_json_parse(buf, len, path, &j);
    if (rc == 0) {
        rc = parse_manifest(s->run, v, path, j, out);
        json_decref(j);
    }
    if (rc == 0 && text) *text = buf;
    else free(buf);
    return rc;
}

int store_manifest_parse(const char *text, const char *run, store_version *out)
{
    json_t *j;
    SH_TRY(sh_json_parse(text, strlen(text), "manifest", &j));
    int rc = parse_manifest(run, 0, "manifest", j, out);
    json_decref(j);
    return rc;
}

int store_payload_path(store *s, uint64_t v, char *out, size_t cap)
{
    store_version m;
    char dir[4096];
    SH_TRY(store_get(s, v, &m, NULL));
    SH_TRY(store__version_dir(s, v, dir, sizeof dir));
    return sh_path_join(out, cap, dir, m.file);
}

int store_verify(store *s, uint64_t v)
{
    store_version m;
    char path[4096];
    SH_TRY(store_get(s, v, &m, NULL));
    SH_TRY(store_payload_path(s, v, path, sizeof path));
    struct stat st;
    if (stat(path, &st) < 0) return sh_err_errno(errno, "version %llu: payload %s", (unsigned long long)v, path);
    if ((uint64_t)st.st_size != m.size)
        return sh_err(SH_EFORMAT, "version %llu: %s has %lld bytes, its manifest says %llu (truncated?)",
                      (unsigned long long)v, path, (long long)st.st_size, (unsigned long long)m.size);
    sh_hash128 h;
    uint64_t n;
    SH_TRY(store__hash_file(path, &h, &n));
    if (!sh_hash128_eq(h, m.xxh3)) {
        char a[33], b[33];
        sh_hash128_hex(h, a);
        sh_hash128_hex(m.xxh3, b);
        return sh_err(SH_EMISMATCH, "version %llu: %s hashes to %s, its manifest says %s",
                      (unsigned long long)v, path, a, b);
    }
    return SH_OK;
}

static int cmp_version(const void *a, const void *b)
{
    uint64_t x = ((const store_version *)a)->version, y = ((const store_version *)b)->version;
    return x < y ? -1 : x > y;
}

int store_list(store *s, store_version **out, size_t *n, size_t *broken)
{
    *out = NULL, *n = 0, *broken = 0;
    DIR *d = opendir(s->versions);
    if (!d) return sh_err_errno(errno, "open %s", s->versions);
    store_version *list = NULL;
    size_t cap = 0, cnt = 0;
    int rc = SH_OK;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        char *end;
        unsigned long long v = strtoull(e->d_name, &end, 10);
        if (*end || v == 0 || strlen(e->d_name) != 10) continue;
        if (cnt == cap) {
            cap = cap ? 2 * cap : 32;
            store_version *l = realloc(list, cap * sizeof *l);
            if (!l) {
                rc = sh_err(SH_ENOMEM, "store list");
                break;
            }
            list = l;
        }
        if (store_get(s, v, &list[cnt], NULL) < 0) {
            memset(&list[cnt], 0, sizeof list[cnt]);
            list[cnt].version = v;
            (*broken)++;
        }
        cnt++;
    }
    closedir(d);
    if (rc < 0) {
        free(list);
        return rc;
    }
    if (cnt) qsort(list, cnt, sizeof *list, cmp_version);
    *out = list;
    *n = cnt;
    return SH_OK;
}

/* ---- Publish ----------------------------------------------------------- */

/* The version's manifest, written as the last file of the staging folder. */
static int write_manifest(store *s, const char *dir, const store_version *m)
{
    char path[4096], x[33], mx[33];
    SH_TRY(sh_path_join(path, sizeof path, dir, "manifest.json"));
    sh_hash128_hex(m->xxh3, x);
    sh_hash128_hex(m->model_xxh3, mx);
    json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:s,s:I,s:s,s:I,s:s,s:f}", "format", "shoal-version/1",
                          "run", s->run, "version", (json_int_t)m->version, "kind",
                          m->anchor ? "anchor" : "delta", "file", m->file, "size",
                          (json_int_t)m->size, "xxh3", x, "model_size", (json_int_t)m->model_size,
                          "model_xxh3", mx, "created_at", m->created_at);
    if (!j) return sh_err(SH_ENOMEM, "manifest");
    if (!m->anchor) json_object_set_new(j, "base", json_integer((json_int_t)m->base));
    int rc = sh_json_write_atomic(path, j);
    json_decref(j);
    return rc;
}

/* The anchor a version chains back to (itself for an anchor). */
static int anchor_of(store *s, uint64_t v, uint64_t *out)
{
    for (size_t hops = 0; hops < STORE_MAX_CHAIN; hops++) {
        store_version m;
        SH_TRY(store_get(s, v, &m, NULL));
        if (m.anchor) {
            *out = v;
            return SH_OK;
        }
        v = m.base;
    }
    return sh_err(SH_EFORMAT, "run \"%s\": a delta chain longer than %d versions", s->run, STORE_MAX_CHAIN);
}

/* ---- The head cache ----------------------------------------------------
 * A delta is made against the previous version's full checkpoint.  When
 * that version is an anchor, its payload is that checkpoint.  Otherwise the
 * run keeps cache/head.safetensors, the newest published checkpoint (a hard
 * link to the file published, or rebuilt from the chain once), named by
 * cache/head.json.  A cache whose bytes do not hash to the version's
 * model_xxh3 (the publisher rewrote its file in place, a crash) is rebuilt,
 * so a delta is never made against anything but the real previous version.
 * A publish therefore stages only its delta. */

static int head_paths(store *s, char *file, char *meta, size_t cap)
{
    char dir[4096];
    SH_TRY(sh_path_join(dir, sizeof dir, s->dir, "cache"));
    SH_TRY(sh_mkdir_p(dir, 0755));
    SH_TRY(sh_path_join(file, cap, dir, "head.safetensors"));
    return sh_path_join(meta, cap, dir, "head.json");
}

static void head_drop(const char *file, const char *meta)
{
    unlink(meta);
    unlink(file);
}

/* The version cache/head.json names, or 0. */
static uint64_t head_version(const char *meta)
{
    json_t *j;
    int64_t v = 0;
    if (sh_json_load_file(meta, 4096, &j) < 0) return 0;
    sh_json_get_i64(j, "version", 0, meta, &v);
    json_decref(j);
    return v > 0 ? (uint64_t)v : 0;
}

static int head_name(const char *meta, uint64_t v)
{
    char text[64];
    int n = snprintf(text, sizeof text, "{\"version\":%llu}\n", (unsigned long long)v);
    return sh_write_atomic(meta, text, (size_t)n);
}

/* The full checkpoint of version prev (manifest pm) into out. */
static int head_base(store *s, uint64_t prev, const store_version *pm, char *out, size_t cap)
{
    if (pm->anchor) return store_payload_path(s, prev, out, cap); /* hashed by chain_readable */
    char meta[4096];
    SH_TRY(head_paths(s, out, meta, cap));
    if (head_version(meta) == prev) {
        sh_hash128 h;
        uint64_t n;
        if (store__hash_file(out, &h, &n) == SH_OK && n == pm->model_size &&
            sh_hash128_eq(h, pm->model_xxh3))
            return SH_OK;
    }
    head_drop(out, meta);
    SH_TRY(store_materialize(s, prev, 0, NULL, out));
    return head_name(meta, prev);
}

/* A folder's version has no file to link: the cache, when it holds
 * version v - 1, is patched in place with the version's delta (only the
 * changed elements are written; the codec undoes its writes on failure).
 * Its name is dropped first, so a crash midway leaves a cache that the next
 * publish rebuilds. */
static void head_patch(store *s, uint64_t v, const store_version *m, const char *delta_path)
{
    char file[4096], meta[4096];
    if (head_paths(s, file, meta, sizeof file) < 0) return;
    int ok = head_version(meta) == v - 1;
    unlink(meta);
    int fd = ok ? open(file, O_RDWR | O_CLOEXEC) : -1;
    struct stat st;
    ok = fd >= 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_size == m->model_size && st.st_size > 0;
    void *img = ok ? mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                   : MAP_FAILED;
    ok = img != MAP_FAILED && store__delta_patch_mem(img, (uint64_t)st.st_size, delta_path, NULL, 0, NULL, NULL) == SH_OK;
    if (img != MAP_FAILED) ok = munmap(img, (size_t)st.st_size) == 0 && ok;
    ok = ok && fsync(fd) == 0;
    if (fd >= 0) close(fd);
    if (!ok || head_name(meta, v) < 0) head_drop(file, meta);
}

/* After version v (from src) is published: the cache names it.  A hard
 * link costs no space; where src is on another file system the cache is
 * dropped and the next delta publish rebuilds it. */
static int head_advance(store *s, uint64_t v, const char *src)
{
    char file[4096], meta[4096], tmp[4200];
    SH_TRY(head_paths(s, file, meta, sizeof file));
    head_drop(file, meta);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", file, (long)getpid());
    unlink(tmp);
    if (link(src, tmp) < 0) return errno == EXDEV ? SH_OK : sh_err_errno(errno, "link %s", tmp);
    int rc = rename(tmp, file) < 0 ? sh_err_errno(errno, "rename %s", tmp) : head_name(meta, v);
    if (rc < 0) {
        unlink(tmp);
        head_drop(file, meta);
    }
    return rc;
}

/* Writes the single file a view stands for to fd, hashing it; pg
 * (optional) follows the bytes. */
static int write_view(const ckpt *v, int fd, const char *name, sh_hash128 *h, uint64_t *size, sh_progress *pg)
{
    sh_hasher *hs = sh_hasher_new();
    if (!hs) return sh_err(SH_ENOMEM, "out of memory");
    int rc = SH_OK;
    uint64_t n = 0;
    for (size_t i = 0; rc == SH_OK && i <= v->ntensors; i++) {
        const uint8_t *p = i ? v->tensors[i - 1].data : v->files[0].map;
        uint64_t len = i ? v->tensors[i - 1].nbytes : v->files[0].header_len;
        sh_hasher_update(hs, p, (size_t)len);
        if (fd >= 0) rc = sh_write_all(fd, p, (size_t)len, name);
        n += len;
        if (pg) sh_progress_update(pg, n);
    }
    if (rc == SH_OK && fd >= 0 && fsync(fd) < 0) rc = sh_err_errno(errno, "fsync %s", name);
    *h = sh_hasher_digest(hs), *size = n;
    sh_hasher_free(hs);
    return rc;
}

/* src is a .safetensors file, or (view non-NULL) a folder published as the
 * single file view stands for. */
static int stage_payload(store *s, const char *stage, const char *src, const ckpt *view,
                         uint64_t prev, int anchor, store_version *m, sh_progress *pg)
{
    char out[4096];
    snprintf(m->file, sizeof m->file, "%s", anchor ? STORE__ANCHOR_FILE : STORE__DELTA_FILE);
    SH_TRY(sh_path_join(out, sizeof out, stage, m->file));
    if (anchor) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) return sh_err_errno(errno, "create %s", out);
        if (pg && view && !pg->total) pg->total = ckpt_data_bytes(view) + view->files[0].header_len;
        int rc = view ? write_view(view, fd, out, &m->xxh3, &m->size, pg)
                      : store__copy_hash(src, fd, out, &m->xxh3, &m->size, pg);
        if (close(fd) < 0 && rc == 0) rc = sh_err_errno(errno, "close %s", out);
        m->model_xxh3 = m->xxh3;
        m->model_size = m->size;
        return rc;
    }
    /* The delta is made against the previous version's full checkpoint,
     * from the store (its anchor, or the head cache), so that a publisher
     * needs no local state and stages nothing but the delta. */
    store_version pm;
    char base[4096];
    SH_TRY(store_get(s, prev, &pm, NULL));
    SH_TRY(head_base(s, prev, &pm, base, sizeof base));
    int rc = view ? store__delta_make_ckpt(base, view, out, pg) : store__delta_make(base, src, out, pg);
    if (rc == 0) rc = store__hash_file(out, &m->xxh3, &m->size);
    if (rc == 0) rc = view ? write_view(view, -1, NULL, &m->model_xxh3, &m->model_size, NULL)
                           : store__hash_file(src, &m->model_xxh3, &m->model_size);
    return rc;
}

/* Whether readers can rebuild version `latest` from its chain (anchor `a`
 * and the deltas after it): every payload is there, a plain file of its
 * manifest's size.  A delta on a version readers cannot rebuild would be
 * unreadable too, so the publish writes an anchor instead.  Hashes are not
 * checked here (that would read the whole chain at every publish), except
 * an anchor's when it is `latest`: it is then the delta's base (head_base),
 * whose make reads it again from the page cache, and a delta made against
 * damaged bytes could never be applied.  A delta damaged in place, same
 * size, is found by readers and `store verify`. */
static int chain_readable(store *s, uint64_t a, uint64_t latest)
{
    return store__chain_readable(s, a, latest, 1);
}

int store__chain_readable(store *s, uint64_t a, uint64_t latest, int verify_anchor)
{
    for (uint64_t v = a; v <= latest; v++) {
        store_version m;
        char path[4096];
        struct stat st;
        if (store_get(s, v, &m, NULL) < 0 || store_payload_path(s, v, path, sizeof path) < 0 ||
            stat(path, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != m.size ||
            (verify_anchor && m.anchor && v == latest && store_verify(s, v) < 0))
            return 0;
    }
    return 1;
}

static int publish_locked(store *s, const char *src, const ckpt *view, uint64_t every, sh_progress *pg,
                          uint64_t *out)
{
    uint64_t latest, v, last_anchor = 0;
    SH_TRY(store_latest(s, &latest));
    v = latest + 1;
    if (latest) SH_TRY(anchor_of(s, latest, &last_anchor));
    int anchor = latest == 0 || v - last_anchor >= every || !store_have_codec() ||
                 !chain_readable(s, last_anchor, latest);
    char final[4096], stage[4096];
    SH_TRY(store__version_dir(s, v, final, sizeof final));
    /* A folder above LATEST is the leftover of a publish that crashed before
     * its pointer moved: nothing can name it, so it is replaced. */
    if (sh_path_exists(final)) SH_TRY(sh_rm_rf(final));
    store__clean_staging(s); /* a crashed publish's payload, up to a model's size */
    snprintf(stage, sizeof stage, "%s/%010llu.%ld", s->staging, (unsigned long long)v, (long)getpid());
    SH_TRY(sh_rm_rf(stage));
    SH_TRY(sh_mkdir_p(stage, 0755));
    store_version m = {0};
    m.version = v;
    m.anchor = anchor;
    m.base = anchor ? 0 : latest;
    m.created_at = sh_now_wall();
    int rc = stage_payload(s, stage, src, view, latest, anchor, &m, pg);
    /* The head cache moves to v before v is committed: a cache naming a
     * version that never commits is refused by the next publish (its name
     * is not that publish's previous version, or its bytes do not hash to
     * it), and a cache that cannot move fails the publish here, while
     * LATEST still names the previous version. */
    if (rc == 0 && !anchor && view) {
        char d[4200];
        snprintf(d, sizeof d, "%s/%s", stage, m.file);
        head_patch(s, v, &m, d);
    } else if (rc == 0 && !anchor) {
        rc = head_advance(s, v, src);
    }
    if (rc == 0) rc = write_manifest(s, stage, &m);
    SH_TRY(store__commit_version(s, rc, stage, final, v, latest, ""));
    *out = v;
    return SH_OK;
}

int store__commit_version(store *s, int rc, const char *stage, const char *final, uint64_t v, uint64_t latest,
                          const char *how)
{
    if (rc == 0) rc = sh_fsync_dir(stage);
    if (rc == 0 && rename(stage, final) < 0) rc = sh_err_errno(errno, "rename %s to %s", stage, final);
    if (rc == 0) rc = sh_fsync_dir(s->versions);
    if (rc == 0) rc = write_latest(s, v);
    if (rc == 0) return SH_OK;
    int keep = rc;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sh_errmsg());
    sh_rm_rf(stage);
    /* LATEST may have moved with only the fsync of its folder failing:
     * then the version it names is durable and must stay (removing it
     * left LATEST naming a missing version, which broke the run). */
    uint64_t now = 0;
    if (store_latest(s, &now) == SH_OK && now == v)
        return sh_err(keep, "publish version %llu of run \"%s\"%s: %s; LATEST names version %llu, "
                      "but a crash may bring back version %llu", (unsigned long long)v, s->run, how, msg,
                      (unsigned long long)v, (unsigned long long)latest);
    sh_rm_rf(final);
    return sh_err(keep, "publish version %llu of run \"%s\"%s: %s; LATEST still names version %llu",
                  (unsigned long long)v, s->run, how, msg, (unsigned long long)latest);
}

int store_publish(store *s, const char *path, const store_publish_opts *o, uint64_t *out)
{
    uint64_t every = o && o->anchor_every ? o->anchor_every : 8;
    if (!sh_path_exists(path)) return sh_err(SH_ENOENT, "checkpoint %s does not exist", path);
    /* Only checkpoints go in: a replica must be able to serve every version.
     * A sharded folder goes in as the single file holding its tensors. */
    ckpt *c, *view = NULL;
    SH_TRY(ckpt_open(path, &c));
    if (c->is_folder) {
        int rc = ckpt_single_view(c, &view);
        if (rc < 0) {
            ckpt_close(c);
            return rc;
        }
    } else {
        ckpt_close(c);
        c = NULL;
    }
    int fd;
    int rc = store__lock(s, &fd);
    if (rc == SH_OK) rc = publish_locked(s, path, view, every, o ? o->progress : NULL, out);
    if (fd >= 0) close(fd);
    ckpt_close(view);
    ckpt_close(c);
    return rc;
}

/* ---- Shared with publish_mem.c and plan.c -------------------------------- */

int store__lock(store *s, int *fd)
{
    char lock[4096];
    *fd = -1;
    SH_TRY(sh_path_join(lock, sizeof lock, s->dir, "lock"));
    *fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*fd < 0) return sh_err_errno(errno, "open %s", lock);
    if (flock(*fd, LOCK_EX) < 0) {
        int e = errno;
        close(*fd);
        *fd = -1;
        return sh_err_errno(e, "lock %s", lock);
    }
    return SH_OK;
}

int store__write_manifest(store *s, const char *dir, const store_version *m)
{
    return write_manifest(s, dir, m);
}
int store__write_latest(store *s, uint64_t v) { return write_latest(s, v); }
int store__anchor_of(store *s, uint64_t v, uint64_t *out) { return anchor_of(s, v, out); }
int store__head_base(store *s, uint64_t prev, const store_version *pm, char *out, size_t cap)
{
    return head_base(s, prev, pm, out, cap);
}
