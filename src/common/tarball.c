/* Work-dir archives: the code a job ships (`shoal submit --workdir DIR`).
 *
 * The format is POSIX ustar, restricted to what a source tree needs and
 * what an agent can unpack without trusting it: regular files, directories
 * and relative symbolic links that stay inside the tree.  The packer refuses
 * anything else with the path that broke the rule; the unpacker, which runs
 * in the agent on bytes a tenant sent, checks every header again and
 * creates each entry through directory descriptors opened with O_NOFOLLOW,
 * so that no entry is written outside the destination, whatever the
 * archive holds (docs/job-format.md, "Work dir"). */
#include "shoal/common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BLK 512

typedef struct packer {
    sh_buf *out;
    uint64_t limit;
    const char *root;
    size_t entries;
} packer;

static void octal(char *f, size_t n, uint64_t v)
{
    snprintf(f, n, "%0*llo", (int)n - 1, (unsigned long long)v);
}

/* Whether the link target, read in the directory `rel` of the tree, stays
 * inside it: relative, and never climbing above the root. */
static int link_inside(const char *rel, const char *target)
{
    if (!*target || target[0] == '/') return 0;
    int depth = 0;
    for (const char *p = rel; *p; p++) depth += *p == '/';
    if (*rel) depth++; /* rel names the directory the link lies in */
    char t[4096];
    snprintf(t, sizeof t, "%s", target);
    for (char *sv = NULL, *c = strtok_r(t, "/", &sv); c; c = strtok_r(NULL, "/", &sv)) {
        if (!strcmp(c, "..")) {
            if (--depth < 0) return 0;
        } else if (strcmp(c, ".")) depth++;
    }
    return 1;
}

static int put_header(packer *p, const char *name, char type, unsigned mode, uint64_t size, const char *link)
{
    uint8_t h[BLK] = {0};
    size_t n = strlen(name);
    const char *base = name;
    if (n > 100) {
        /* ustar splits a long name at a '/' into prefix (155) and name (100). */
        const char *cut = NULL;
        for (const char *s = name; *s; s++)
            if (*s == '/' && s - name <= 155 && n - (size_t)(s - name) - 1 <= 100) {
                cut = s;
                break;
            }
        if (!cut) return sh_err(SH_EINVAL, "%s/%s: path longer than a work-dir archive holds (ustar: 255 bytes)", p->root, name);
        memcpy(h + 345, name, (size_t)(cut - name));
        base = cut + 1;
    }
    memcpy(h, base, strlen(base));
    octal((char *)h + 100, 8, mode);
    octal((char *)h + 108, 8, 0);
    octal((char *)h + 116, 8, 0);
    octal((char *)h + 124, 12, size);
    octal((char *)h + 136, 12, 0);
    h[156] = (uint8_t)type;
    if (link) {
        if (strlen(link) > 100) return sh_err(SH_EINVAL, "%s/%s: link target longer than 100 bytes", p->root, name);
        memcpy(h + 157, link, strlen(link));
    }
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < BLK; i++) sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    p->entries++;
    return sh_buf_append(p->out, h, BLK) < 0 ? sh_err(SH_ENOMEM, "work-dir archive") : SH_OK;
}

static int over(const packer *p, uint64_t more)
{
    return p->out->len + more > p->limit;
}

static int limit_err(const packer *p, uint64_t more)
{
    return sh_err(SH_ERANGE, "%s: the work dir takes more than %llu bytes (at least %llu): over the limit; leave out"
                             " data and checkpoints (ship code, read data from a writable folder) or raise"
                             " --workdir-limit", p->root, (unsigned long long)p->limit,
                  (unsigned long long)(p->out->len + more));
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int add_file(packer *p, const char *path, const char *rel, const struct stat *st)
{
    uint64_t size = (uint64_t)st->st_size, padded = (size + BLK - 1) / BLK * BLK;
    if (over(p, BLK + padded)) return limit_err(p, BLK + padded);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return sh_err_errno(errno, "%s", path);
    int rc = put_header(p, rel, '0', st->st_mode & 0100 ? 0755 : 0644, size, NULL);
    size_t at = p->out->len;
    if (rc == SH_OK) {
        uint8_t *zero = calloc(1, padded ? padded : 1);
        if (!zero || sh_buf_append(p->out, zero, padded) < 0) rc = sh_err(SH_ENOMEM, "work-dir archive");
        free(zero);
    }
    for (uint64_t got = 0; rc == SH_OK && got < size;) {
        ssize_t r = read(fd, p->out->data + at + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) rc = r < 0 ? sh_err_errno(errno, "%s", path) : sh_err(SH_EIO, "%s: changed while read", path);
        else got += (uint64_t)r;
    }
    close(fd);
    return rc;
}

static int walk(packer *p, const char *dir, const char *rel)
{
    DIR *d = opendir(dir);
    if (!d) return sh_err_errno(errno, "%s", dir);
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = SH_OK;
    for (struct dirent *e; rc == SH_OK && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (n == cap) {
            char **nn = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *nn);
            if (!nn) rc = sh_err(SH_ENOMEM, "%s", dir);
            else names = nn;
        }
        if (rc == SH_OK && !(names[n++] = strdup(e->d_name))) rc = sh_err(SH_ENOMEM, "%s", dir);
    }
    closedir(d);
    if (rc == SH_OK && n) qsort(names, n, sizeof *names, cmp_names);
    for (size_t i = 0; i < n && rc == SH_OK; i++) {
        char path[4096], r[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        snprintf(r, sizeof r, "%s%s%s", rel, *rel ? "/" : "", names[i]);
        struct stat st;
        if (lstat(path, &st) < 0) {
            rc = sh_err_errno(errno, "%s", path);
            break;
        }
        if (S_ISDIR(st.st_mode)) {
            char dn[4100];
            snprintf(dn, sizeof dn, "%s/", r);
            if (over(p, BLK)) rc = limit_err(p, BLK);
            if (rc == SH_OK) rc = put_header(p, dn, '5', 0755, 0, NULL);
            if (rc == SH_OK) rc = walk(p, path, r);
        } else if (S_ISREG(st.st_mode)) {
            rc = add_file(p, path, r, &st);
        } else if (S_ISLNK(st.st_mode)) {
            char t[4096];
            ssize_t k = readlink(path, t, sizeof t - 1);
            if (k < 0) rc = sh_err_errno(errno, "%s", path);
            else {
                t[k] = 0;
                if (!link_inside(rel, t))
                    rc = sh_err(SH_EINVAL, "%s: a symbolic link to \"%s\", outside the work dir %s: ranks would not"
                                           " find it; copy what it points to into the tree", path, t, p->root);
                else if (over(p, BLK)) rc = limit_err(p, BLK);
                else rc = put_header(p, r, '2', 0777, 0, t);
            }
        } else {
            rc = sh_err(SH_EINVAL, "%s: not a regular file, directory or symbolic link (a socket, fifo or device):"
                                   " a work dir holds none", path);
        }
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

int sh_tar_pack(const char *dir, uint64_t limit, sh_buf *out)
{
    struct stat st;
    if (stat(dir, &st) < 0) return sh_err_errno(errno, "work dir %s", dir);
    if (!S_ISDIR(st.st_mode)) return sh_err(SH_EINVAL, "work dir %s: not a directory", dir);
    packer p = {out, limit, dir, 0};
    int rc = walk(&p, dir, "");
    if (rc == SH_OK && over(&p, 2 * BLK)) rc = limit_err(&p, 2 * BLK);
    uint8_t end[2 * BLK] = {0};
    if (rc == SH_OK && sh_buf_append(out, end, sizeof end) < 0) rc = sh_err(SH_ENOMEM, "work-dir archive");
    return rc;
}

/* ---- unpacking untrusted archives ----------------------------------------- */

static int parse_octal(const uint8_t *f, size_t n, uint64_t *v)
{
    *v = 0;
    size_t i = 0;
    while (i < n && f[i] == ' ') i++;
    if (i == n || f[i] < '0' || f[i] > '7') return -1;
    for (; i < n && f[i] >= '0' && f[i] <= '7'; i++) {
        if (*v >> 60) return -1;
        *v = *v * 8 + (uint64_t)(f[i] - '0');
    }
    for (; i < n; i++)
        if (f[i] != ' ' && f[i] != 0) return -1;
    return 0;
}

/* A path inside the tree: relative, components neither empty, "." nor "..",
 * no control characters.  A directory's trailing '/' is taken off. */
static int plain_path(char *p)
{
    size_t n = strlen(p);
    if (n && p[n - 1] == '/') p[--n] = 0;
    if (!n || p[0] == '/') return 0;
    for (const char *c = p; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) return 0;
    char t[300];
    snprintf(t, sizeof t, "%s", p);
    if (strstr(p, "//")) return 0;
    for (char *sv = NULL, *c = strtok_r(t, "/", &sv); c; c = strtok_r(NULL, "/", &sv))
        if (!strcmp(c, ".") || !strcmp(c, "..")) return 0;
    return 1;
}

/* Opens the directory that holds `path` under root (creating the missing
 * ones), each step with O_NOFOLLOW: an entry named through a symbolic link
 * or a file is refused.  *leaf points at the last component. */
static int open_parent(int root, const char *where, char *path, const char **leaf, uid_t uid)
{
    int fd = dup(root);
    if (fd < 0) return sh_err_errno(errno, "%s", where);
    char *s = path;
    for (char *slash; (slash = strchr(s, '/')); s = slash + 1) {
        *slash = 0;
        if (mkdirat(fd, s, 0755) == 0) {
            if (fchownat(fd, s, uid, uid, AT_SYMLINK_NOFOLLOW) < 0 && errno != EPERM) {
                int e = errno;
                close(fd);
                return sh_err_errno(e, "%s: chown %s", where, path);
            }
        } else if (errno != EEXIST) {
            int e = errno;
            close(fd);
            return sh_err_errno(e, "%s: mkdir %s", where, path);
        }
        int next = openat(fd, s, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        close(fd);
        *slash = '/';
        if (next < 0)
            return sh_err(SH_EFORMAT, "%s: entry \"%s\" lies under something that is not a directory of the archive"
                                      " (%s)", where, path, strerror(e));
        fd = next;
    }
    *leaf = s;
    return fd;
}

typedef struct pending_link {
    char name[300], target[101];
} pending_link;

static int unpack_one(int root, const char *where, char *name, char type, uint64_t mode, const uint8_t *data,
                      uint64_t size, uid_t uid)
{
    const char *leaf;
    int dfd = open_parent(root, where, name, &leaf, uid);
    if (dfd < 0) return dfd;
    int rc = SH_OK;
    /* No setuid, setgid or sticky bit, nothing writable by others. */
    mode_t m = (mode_t)(mode & 0755);
    if (type == '5') {
        if (mkdirat(dfd, leaf, m | 0700) < 0 && errno != EEXIST) rc = sh_err_errno(errno, "%s: mkdir %s", where, name);
        else if (fchownat(dfd, leaf, uid, uid, AT_SYMLINK_NOFOLLOW) < 0 && errno != EPERM)
            rc = sh_err_errno(errno, "%s: chown %s", where, name);
    } else {
        int fd = openat(dfd, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, m | 0600);
        if (fd < 0)
            rc = errno == EEXIST ? sh_err(SH_EFORMAT, "%s: entry \"%s\" appears twice", where, name)
                                 : sh_err_errno(errno, "%s: create %s", where, name);
        else {
            rc = sh_write_all(fd, data, size, name);
            if (rc == SH_OK && fchown(fd, uid, uid) < 0 && errno != EPERM) rc = sh_err_errno(errno, "%s: chown %s", where, name);
            if (rc == SH_OK && fchmod(fd, m | 0600) < 0) rc = sh_err_errno(errno, "%s: chmod %s", where, name);
            close(fd);
        }
    }
    close(dfd);
    return rc;
}

int sh_tar_unpack(const void *buf, size_t len, const char *dest, uint64_t max_bytes, unsigned uid)
{
    const uint8_t *b = buf;
    int root = open(dest, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (root < 0) return sh_err_errno(errno, "work dir %s", dest);
    pending_link *links = NULL;
    size_t nlinks = 0, entries = 0;
    uint64_t total = 0;
    int rc = SH_OK, ended = 0;
    for (size_t at = 0; rc == SH_OK && !ended;) {
        if (len - at < BLK) {
            rc = sh_err(SH_EFORMAT, "%s: work-dir archive cut short at byte %zu", dest, at);
            break;
        }
        const uint8_t *h = b + at;
        int zero = 1;
        for (int i = 0; i < BLK && zero; i++) zero = !h[i];
        if (zero) {
            ended = 1;
            break;
        }
        uint64_t sum, size, mode;
        unsigned got = 0;
        for (int i = 0; i < BLK; i++) got += i >= 148 && i < 156 ? ' ' : h[i];
        if (parse_octal(h + 148, 8, &sum) < 0 || sum != got || memcmp(h + 257, "ustar", 5) ||
            parse_octal(h + 124, 12, &size) < 0 || parse_octal(h + 100, 8, &mode) < 0) {
            rc = sh_err(SH_EFORMAT, "%s: work-dir archive: bad header at byte %zu (not ustar, or its checksum fails)",
                        dest, at);
            break;
        }
        char name[300], link[101];
        snprintf(name, sizeof name, "%.155s%s%.100s", (const char *)h + 345, h[345] ? "/" : "", (const char *)h);
        snprintf(link, sizeof link, "%.100s", (const char *)h + 157);
        char type = (char)h[156];
        uint64_t padded = (size + BLK - 1) / BLK * BLK;
        if (padded > len - at - BLK) {
            rc = sh_err(SH_EFORMAT, "%s: work-dir archive: entry \"%s\" says %llu bytes; the archive ends first", dest,
                        name, (unsigned long long)size);
            break;
        }
        if (++entries > SH_TAR_MAX_ENTRIES || (total += size) > max_bytes) {
            rc = sh_err(SH_ERANGE, "%s: work-dir archive holds more than %d entries or %llu bytes", dest,
                        SH_TAR_MAX_ENTRIES, (unsigned long long)max_bytes);
            break;
        }
        if (!plain_path(name)) {
            rc = sh_err(SH_EFORMAT, "%s: work-dir archive: entry \"%s\" is not a plain relative path (absolute, or"
                                    " with \"..\", \".\" or an empty part)", dest, name);
            break;
        }
        if (type == '2') {
            /* Created once every file is written, so that none is written
             * through a link; each must stay inside the tree. */
            char dir[300];
            snprintf(dir, sizeof dir, "%s", name);
            char *slash = strrchr(dir, '/');
            if (slash) *slash = 0;
            else dir[0] = 0;
            if (!link_inside(dir, link)) {
                rc = sh_err(SH_EFORMAT, "%s: work-dir archive: link \"%s\" -> \"%s\" points outside the work dir",
                            dest, name, link);
                break;
            }
            pending_link *nl = realloc(links, (nlinks + 1) * sizeof *nl);
            if (!nl) {
                rc = sh_err(SH_ENOMEM, "%s", dest);
                break;
            }
            links = nl;
            snprintf(links[nlinks].name, sizeof links[nlinks].name, "%s", name);
            snprintf(links[nlinks++].target, sizeof links[0].target, "%s", link);
        } else if (type == '0' || type == 0 || type == '5') {
            rc = unpack_one(root, dest, name, type == '5' ? '5' : '0', mode, h + BLK, size, (uid_t)uid);
        } else {
            rc = sh_err(SH_EFORMAT, "%s: work-dir archive: entry \"%s\" has type '%c': only files, directories and"
                                    " links inside the tree are unpacked (no devices, fifos or hard links)",
                        dest, name, type >= 0x20 && type < 0x7f ? type : '?');
        }
        at += BLK + padded;
    }
    for (size_t i = 0; rc == SH_OK && i < nlinks; i++) {
        const char *leaf;
        int dfd = open_parent(root, dest, links[i].name, &leaf, (uid_t)uid);
        if (dfd < 0) rc = dfd;
        else {
            if (symlinkat(links[i].target, dfd, leaf) < 0)
                rc = errno == EEXIST ? sh_err(SH_EFORMAT, "%s: entry \"%s\" appears twice", dest, links[i].name)
                                     : sh_err_errno(errno, "%s: symlink %s", dest, links[i].name);
            else if (fchownat(dfd, leaf, (uid_t)uid, (uid_t)uid, AT_SYMLINK_NOFOLLOW) < 0 && errno != EPERM)
                rc = sh_err_errno(errno, "%s: chown %s", dest, links[i].name);
            close(dfd);
        }
    }
    if (rc == SH_OK && !ended) rc = sh_err(SH_EFORMAT, "%s: work-dir archive has no end marker", dest);
    free(links);
    close(root);
    return rc;
}
