/* Rank log files: framed records that a crash cannot tear.
 *
 * A plain append-only text file can end in half a chunk after a power cut
 * or a full disk, and the next append then glues new output onto the cut
 * bytes.  Each chunk is therefore one record (docs/server-api.md, "Rank log
 * files"):
 *
 *     u32 LE length (1..SRV_LOG_MAX_RECORD) | u32 LE check | length bytes
 *
 * where check is the low 32 bits of the low half of xxh3-128 over the
 * length field and the data.  Readers stop at the first record that is incomplete or fails its
 * check; the first append of each file by a server process truncates the file
 * to its last whole record before writing, so new output never follows torn
 * bytes.  A record is written with one write() on an O_APPEND descriptor, and
 * a failed write is cut off again at once. */
#include "srv_int.h"
#include "files_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HDR 8u

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The check covers the length too, so a torn or zero-filled header fails. */
static uint32_t check_of(const uint8_t *rec, uint32_t len)
{
    sh_hasher *h = sh_hasher_new();
    if (!h) return 0;
    sh_hasher_update(h, rec, 4);
    sh_hasher_update(h, rec + HDR, len);
    uint32_t c = (uint32_t)sh_hasher_digest(h).lo;
    sh_hasher_free(h);
    return c;
}

/* Length of the whole record at buf[0..avail), or 0 when it is incomplete
 * or broken. */
static size_t record_at(const uint8_t *buf, size_t avail)
{
    if (avail < HDR) return 0;
    uint32_t len = get_u32(buf);
    if (len == 0 || len > SRV_LOG_MAX_RECORD || avail - HDR < len) return 0;
    return check_of(buf, len) == get_u32(buf + 4) ? HDR + len : 0;
}

/* Offset just past the last whole record of the open file fd. */
static int last_whole(int fd, const char *path, uint64_t *end)
{
    struct stat st;
    if (fstat(fd, &st) < 0) return sh_err_errno(errno, "%s: stat", path);
    uint64_t size = (uint64_t)st.st_size, off = 0;
    uint8_t *buf = malloc(HDR + SRV_LOG_MAX_RECORD);
    if (!buf) return sh_err(SH_ENOMEM, "%s: scan buffer", path);
    int rc = SH_OK;
    while (off < size) {
        size_t want = size - off < HDR + SRV_LOG_MAX_RECORD ? (size_t)(size - off) : HDR + SRV_LOG_MAX_RECORD;
        ssize_t got = pread(fd, buf, want, (off_t)off);
        if (got < 0) {
            rc = sh_err_errno(errno, "%s: read at %llu", path, (unsigned long long)off);
            break;
        }
        size_t n = record_at(buf, (size_t)got);
        if (!n) break;
        off += n;
    }
    free(buf);
    *end = off;
    return rc;
}

int srv__log_append(const char *path, const void *data, size_t len, int repair)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) return sh_err_errno(errno, "%s: open", path);
    int rc = SH_OK;
    uint64_t end = 0;
    struct stat st;
    if (repair) {
        int rfd = open(path, O_RDONLY | O_CLOEXEC);
        rc = rfd < 0 ? sh_err_errno(errno, "%s: open", path) : last_whole(rfd, path, &end);
        if (rfd >= 0) close(rfd);
        if (rc == SH_OK && fstat(fd, &st) == 0 && (uint64_t)st.st_size > end && ftruncate(fd, (off_t)end) < 0)
            rc = sh_err_errno(errno, "%s: cut the torn tail at %llu", path, (unsigned long long)end);
    }
    uint8_t *rec = rc == SH_OK ? malloc(HDR + (len < SRV_LOG_MAX_RECORD ? len : SRV_LOG_MAX_RECORD)) : NULL;
    if (rc == SH_OK && !rec) rc = sh_err(SH_ENOMEM, "%s: record", path);
    const uint8_t *p = data;
    while (rc == SH_OK && len > 0) {
        uint32_t n = len < SRV_LOG_MAX_RECORD ? (uint32_t)len : SRV_LOG_MAX_RECORD;
        /* A record ends on a character (a reader's window ends with a
         * record), unless the bytes are no UTF-8 anyway. */
        if (n < len && sh_utf8_tail(p, n) < n) n -= (uint32_t)sh_utf8_tail(p, n);
        put_u32(rec, n);
        memcpy(rec + HDR, p, n);
        put_u32(rec + 4, check_of(rec, n));
        if (fstat(fd, &st) < 0) rc = sh_err_errno(errno, "%s: stat", path);
        else if ((rc = sh_write_all(fd, rec, HDR + n, path)) < 0 && ftruncate(fd, st.st_size) < 0)
            sh_warn("%s: cannot cut a failed record: %s", path, strerror(errno));
        p += n;
        len -= n;
    }
    free(rec);
    close(fd);
    return rc;
}

int srv__log_read(const char *path, uint64_t off, size_t max, sh_buf *out, uint64_t *next)
{
    *next = off;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? SH_OK : sh_err_errno(errno, "%s: open", path);
    struct stat st;
    int rc = SH_OK;
    if (fstat(fd, &st) < 0) rc = sh_err_errno(errno, "%s: stat", path);
    uint64_t size = rc == SH_OK ? (uint64_t)st.st_size : 0;
    /* Whole records only: read the window, then keep what parses. */
    size_t want = size > off ? (size_t)(size - off < max + HDR + SRV_LOG_MAX_RECORD ? size - off
                                                                                    : max + HDR + SRV_LOG_MAX_RECORD)
                             : 0;
    uint8_t *buf = want ? malloc(want) : NULL;
    if (want && !buf) rc = sh_err(SH_ENOMEM, "%s: read buffer", path);
    if (rc == SH_OK && want) rc = sh_pread_all(fd, buf, want, off, path);
    size_t pos = 0, n;
    while (rc == SH_OK && pos < want && out->len < max && (n = record_at(buf + pos, want - pos)) > 0) {
        rc = sh_buf_append(out, buf + pos + HDR, n - HDR);
        pos += n;
    }
    /* The window ends on a character: records cut inside one (written by an
     * older server) are carried on into the next record, if it is there. */
    while (rc == SH_OK && out->len && sh_utf8_tail(out->data, out->len) && pos < want &&
           (n = record_at(buf + pos, want - pos)) > 0) {
        rc = sh_buf_append(out, buf + pos + HDR, n - HDR);
        pos += n;
    }
    free(buf);
    close(fd);
    *next = off + pos;
    return rc;
}
