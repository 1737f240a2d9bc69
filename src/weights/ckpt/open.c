/* Opening checkpoints: one mmap'd safetensors file, a sharded folder, or an
 * image in memory; lookups by name. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "weights/ckpt/ckpt_int.h"

static int ckpt__map(const char *path, const uint8_t **map, uint64_t *size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sh_err_errno(errno, "open %s", path);
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return sh_err_errno(e, "stat %s", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return sh_err(SH_EFORMAT, "%s: not a regular file or a checkpoint folder", path);
    }
    *size = (uint64_t)st.st_size;
    *map = NULL;
    if (st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return sh_err_errno(e, "mmap %s", path);
        }
        *map = m;
    }
    close(fd);
    return SH_OK;
}

static int ckpt__cmp_name(const void *a, const void *b, void *arg)
{
    const ckpt *c = arg;
    return strcmp(c->tensors[*(const size_t *)a].name, c->tensors[*(const size_t *)b].name);
}

/* Appends the tensors of file f (parsed from its image) to c. */
static int ckpt__add_file(ckpt *c, uint32_t f)
{
    ckpt_file *cf = &c->files[f];
    ckpt_tensor *t;
    size_t n;
    json_t *meta = NULL;
    SH_TRY(ckpt__parse_image(cf->map, cf->size, 0, cf->path, &t, &n, &meta, &cf->header_len));
    ckpt_tensor *all = realloc(c->tensors, (c->ntensors + n + 1) * sizeof *all);
    if (!all) {
        ckpt_tensors_free(t, n);
        json_decref(meta);
        return sh_err(SH_ENOMEM, "%s: out of memory", cf->path);
    }
    c->tensors = all;
    cf->first = c->ntensors;
    cf->count = n;
    for (size_t i = 0; i < n; i++) {
        t[i].file = f;
        all[c->ntensors++] = t[i];
    }
    free(t); /* names moved into c->tensors */
    if (f == 0) c->metadata = meta;
    else json_decref(meta);
    return SH_OK;
}

static int ckpt__index_names(ckpt *c)
{
    c->by_name = malloc((c->ntensors + 1) * sizeof *c->by_name);
    if (!c->by_name) return sh_err(SH_ENOMEM, "%s: out of memory", c->path);
    for (size_t i = 0; i < c->ntensors; i++) c->by_name[i] = i;
    qsort_r(c->by_name, c->ntensors, sizeof *c->by_name, ckpt__cmp_name, c);
    for (size_t i = 1; i < c->ntensors; i++)
        if (!strcmp(c->tensors[c->by_name[i]].name, c->tensors[c->by_name[i - 1]].name))
            return sh_err(SH_EFORMAT, "%s: tensor \"%s\" appears in two shards (%s and %s)",
                          c->path, c->tensors[c->by_name[i]].name,
                          c->files[c->tensors[c->by_name[i]].file].name,
                          c->files[c->tensors[c->by_name[i - 1]].file].name);
    return SH_OK;
}

static ckpt *ckpt__new(const char *path, size_t nfiles)
{
    ckpt *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->path = strdup(path);
    c->files = calloc(nfiles ? nfiles : 1, sizeof *c->files);
    c->tensors = malloc(sizeof *c->tensors);
    if (!c->path || !c->files || !c->tensors) {
        ckpt_close(c);
        return NULL;
    }
    c->nfiles = nfiles;
    return c;
}

int ckpt_open_mem(const void *buf, size_t len, const char *name, ckpt **out)
{
    ckpt *c = ckpt__new(name, 1);
    if (!c) return sh_err(SH_ENOMEM, "%s: out of memory", name);
    const char *base = strrchr(name, '/');
    c->files[0].name = strdup(base ? base + 1 : name);
    c->files[0].path = strdup(name);
    c->files[0].map = buf;
    c->files[0].size = len;
    int rc = c->files[0].name && c->files[0].path ? SH_OK : sh_err(SH_ENOMEM, "out of memory");
    if (rc == SH_OK) rc = ckpt__add_file(c, 0);
    if (rc == SH_OK) rc = ckpt__index_names(c);
    if (rc < 0) {
        ckpt_close(c);
        return rc;
    }
    *out = c;
    return SH_OK;
}

static int ckpt__open_file(ckpt *c, uint32_t f, const char *dir, const char *name)
{
    ckpt_file *cf = &c->files[f];
    char p[4096];
    if (dir) SH_TRY(sh_path_join(p, sizeof p, dir, name));
    else snprintf(p, sizeof p, "%s", name);
    const char *base = strrchr(name, '/');
    cf->name = strdup(base ? base + 1 : name);
    cf->path = strdup(p);
    if (!cf->name || !cf->path) return sh_err(SH_ENOMEM, "out of memory");
    SH_TRY(ckpt__map(p, &cf->map, &cf->size));
    cf->owns_map = 1;
    return ckpt__add_file(c, f);
}

static int ckpt__cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Reads weight_map and returns its distinct shard names, sorted. */
static int ckpt__shards(const char *ipath, json_t *wm, const char ***names, size_t *n)
{
    size_t cap = json_object_size(wm), k = 0;
    const char **v = malloc((cap + 1) * sizeof *v);
    if (!v) return sh_err(SH_ENOMEM, "out of memory");
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val)
    {
        const char *s = json_string_value(val);
        if (sh_control_at(key) >= 0 || (s && sh_control_at(s) >= 0)) {
            free(v); /* names reach terminals: never print this one */
            return sh_err(SH_EFORMAT, "%s: weight_map holds a name or file with a control character; "
                          "tensor and file names must be printable", ipath);
        }
        if (!s || !*s || strchr(s, '/') || !strcmp(s, "..") || !strcmp(s, ".")) {
            free(v);
            return sh_err(SH_EFORMAT, "%s: weight_map[\"%s\"] must be a file name in the folder "
                          "(no '/')", ipath, key);
        }
        v[k++] = s;
    }
    qsort(v, k, sizeof *v, ckpt__cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (u == 0 || strcmp(v[u - 1], v[i])) v[u++] = v[i];
    *names = v;
    *n = u;
    return SH_OK;
}

/* Every tensor of every shard is in weight_map, pointing at that shard, and
 * every weight_map entry exists. */
static int ckpt__check_weight_map(ckpt *c, const char *ipath, json_t *wm)
{
    for (size_t i = 0; i < c->ntensors; i++) {
        const char *want = json_string_value(json_object_get(wm, c->tensors[i].name));
        const char *has = c->files[c->tensors[i].file].name;
        if (!want)
            return sh_err(SH_EFORMAT, "%s: tensor \"%s\" of %s is missing from weight_map", ipath,
                          c->tensors[i].name, has);
        if (strcmp(want, has))
            return sh_err(SH_EFORMAT, "%s: weight_map puts tensor \"%s\" in %s, but it is in %s",
                          ipath, c->tensors[i].name, want, has);
    }
    if (json_object_size(wm) != c->ntensors) {
        const char *key;
        json_t *val;
        json_object_foreach(wm, key, val) if (!ckpt_find(c, key)) return sh_err(
            SH_EFORMAT, "%s: weight_map lists tensor \"%s\", but %s does not hold it", ipath, key,
            json_string_value(val));
    }
    return SH_OK;
}

static int ckpt__open_folder(const char *path, ckpt **out)
{
    char ipath[4096];
    SH_TRY(sh_path_join(ipath, sizeof ipath, path, CKPT_INDEX_NAME));
    char *text;
    size_t len;
    int rc = sh_read_file(ipath, CKPT_MAX_HEADER, &text, &len);
    if (rc == SH_ENOENT)
        return sh_err(SH_ENOENT, "%s is a folder without %s, so not a sharded checkpoint: give a .safetensors "
                      "file or a folder with its index", path, CKPT_INDEX_NAME);
    if (rc < 0) return rc;
    json_t *root = NULL;
    rc = sh_json_parse(text, len, ipath, &root);
    json_t *wm = rc == SH_OK ? json_object_get(root, "weight_map") : NULL;
    if (rc == SH_OK && !json_is_object(wm))
        rc = sh_err(SH_EFORMAT, "%s: missing \"weight_map\" object", ipath);
    const char **names = NULL;
    size_t n = 0;
    if (rc == SH_OK) rc = ckpt__shards(ipath, wm, &names, &n);
    ckpt *c = NULL;
    if (rc == SH_OK && !(c = ckpt__new(path, n))) rc = sh_err(SH_ENOMEM, "out of memory");
    for (size_t i = 0; rc == SH_OK && i < n; i++) rc = ckpt__open_file(c, (uint32_t)i, path, names[i]);
    if (rc == SH_OK) rc = ckpt__index_names(c);
    if (rc == SH_OK) rc = ckpt__check_weight_map(c, ipath, wm);
    free(names);
    json_decref(root);
    if (rc < 0) {
        free(text);
        ckpt_close(c);
        return rc;
    }
    c->is_folder = 1;
    c->index_json = text;
    c->index_len = len;
    *out = c;
    return SH_OK;
}

int ckpt_open(const char *path, ckpt **out)
{
    if (sh_is_dir(path)) return ckpt__open_folder(path, out);
    ckpt *c = ckpt__new(path, 1);
    if (!c) return sh_err(SH_ENOMEM, "out of memory");
    int rc = ckpt__open_file(c, 0, NULL, path);
    if (rc == SH_OK) rc = ckpt__index_names(c);
    if (rc < 0) {
        ckpt_close(c);
        return rc;
    }
    *out = c;
    return SH_OK;
}

void ckpt_close(ckpt *c)
{
    if (!c) return;
    for (size_t i = 0; i < c->nfiles; i++) {
        ckpt_file *f = &c->files[i];
        if (f->owns_map && f->map) munmap((void *)f->map, f->size);
        free(f->name);
        free(f->path);
    }
    for (size_t i = 0; i < c->ntensors; i++) free((char *)c->tensors[i].name);
    free(c->files);
    free(c->tensors);
    free(c->by_name);
    free(c->index_json);
    json_decref(c->metadata);
    free(c->path);
    free(c);
}

const ckpt_tensor *ckpt_find(const ckpt *c, const char *name)
{
    size_t lo = 0, hi = c->ntensors;
    if (!c->by_name) return NULL;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int r = strcmp(c->tensors[c->by_name[mid]].name, name);
        if (r == 0) return &c->tensors[c->by_name[mid]];
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const char *ckpt_meta(const ckpt *c, const char *key)
{
    return c->metadata ? json_string_value(json_object_get(c->metadata, key)) : NULL;
}

uint64_t ckpt_data_bytes(const ckpt *c)
{
    uint64_t s = 0;
    for (size_t i = 0; i < c->ntensors; i++) s += c->tensors[i].nbytes;
    return s;
}

uint64_t ckpt_file_bytes(const ckpt *c)
{
    uint64_t s = c->index_len;
    for (size_t i = 0; i < c->nfiles; i++) s += c->files[i].size;
    return s;
}
