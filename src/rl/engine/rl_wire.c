/* Framing for the trainer/worker protocol.  Both ends are the same binary
 * on one host (fork), so records are in native little-endian layout; the
 * spec in docs/rl-protocol.md gives every offset. */
#include "rl/engine/wire_int.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

int rl__msg_append(sh_buf *buf, uint32_t type, const void *a, size_t alen, const void *b,
                   size_t blen)
{
    rl_wire_hdr h = {RL_WIRE_MAGIC, type, alen + blen};
    SH_TRY(sh_buf_append(buf, &h, sizeof h));
    if (alen) SH_TRY(sh_buf_append(buf, a, alen));
    if (blen) SH_TRY(sh_buf_append(buf, b, blen));
    return 0;
}

int rl__msg_write(int fd, uint32_t type, const void *a, size_t alen, const void *b, size_t blen)
{
    rl_wire_hdr h = {RL_WIRE_MAGIC, type, alen + blen};
    SH_TRY(sh_write_all(fd, &h, sizeof h, "rl socket"));
    if (alen) SH_TRY(sh_write_all(fd, a, alen, "rl socket"));
    if (blen) SH_TRY(sh_write_all(fd, b, blen, "rl socket"));
    return 0;
}

static int read_full(int fd, void *p, size_t n, int *eof)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (uint8_t *)p + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return sh_err_errno(errno, "rl socket: read");
        if (r == 0) {
            *eof = got == 0;
            return sh_err(SH_ENOENT, "rl socket: peer closed the connection");
        }
        got += (size_t)r;
    }
    return 0;
}

int rl__msg_read(int fd, uint32_t *type, sh_buf *payload)
{
    rl_wire_hdr h;
    int eof = 0;
    SH_TRY(read_full(fd, &h, sizeof h, &eof));
    if (h.magic != RL_WIRE_MAGIC || h.len > RL_WIRE_MAX)
        return sh_err(SH_EFORMAT, "rl socket: bad frame (magic %08x, length %llu)", h.magic,
                      (unsigned long long)h.len);
    payload->len = 0;
    SH_TRY(sh_buf_reserve(payload, h.len + 1));
    SH_TRY(read_full(fd, payload->data, h.len, &eof));
    payload->len = h.len;
    *type = h.type;
    return 0;
}

long rl__msg_peek(const sh_buf *buf, uint32_t *type, const uint8_t **payload, size_t *len)
{
    if (buf->len < sizeof(rl_wire_hdr)) return 0;
    rl_wire_hdr h;
    memcpy(&h, buf->data, sizeof h);
    if (h.magic != RL_WIRE_MAGIC || h.len > RL_WIRE_MAX)
        return sh_err(SH_EFORMAT, "rl socket: bad frame (magic %08x, length %llu)", h.magic,
                      (unsigned long long)h.len);
    if (buf->len < sizeof h + h.len) return 0;
    *type = h.type;
    *payload = buf->data + sizeof h;
    *len = h.len;
    return (long)(sizeof h + h.len);
}
