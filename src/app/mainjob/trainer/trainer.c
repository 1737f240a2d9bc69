/* Rank 0 of the trainer gang (`shoal rl trainer`, docs/mainjob.md): the RL
 * engine with remote workers, every version published to the store from
 * memory, one line per step and evaluation to the events file, and the
 * rendezvous file workers find it by. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "trainer_int.h"
#include "shoal/store.h"

typedef struct trainer_ctx {
    mj_train dp; /* first: rl_config.hook_ctx is also mj_train_step's ctx */
    store *st;
    const char *store_dir;
    FILE *events;
    double t0, publish_s;
    uint64_t delta_bytes, full_bytes, last_delta, image_bytes;
    uint64_t store_bytes; /* payload bytes written to the store (deltas and anchors) */
    uint64_t base0;     /* the store's LATEST when the trainer started */
    long versions;
} trainer_ctx;

/* Policy version `version` becomes store version base0 + version + 1: the
 * image and the delta the trainer made for it go to the store as they are
 * (store_publish_mem: nothing is diffed again, no image is staged for a
 * delta version). */
static int on_publish(void *ctx, int version, const sh_buf *img, const sh_buf *delta)
{
    trainer_ctx *t = ctx;
    double t0 = sh_now_mono();
    uint64_t v;
    store_mem_version in = {img->data, img->len, delta->data, delta->len, t->base0 + (uint64_t)version};
    store_publish_opts o = {.anchor_every = 16};
    int rc = store_publish_mem(t->st, &in, &o, &v);
    if (rc) return sh_err_wrap(rc, "trainer: publishing version %d to %s", version, t->store_dir);
    store_version sv;
    if (store_get(t->st, v, &sv, NULL) == 0) t->store_bytes += sv.size;
    t->image_bytes = img->len;
    t->last_delta = delta->len;
    t->delta_bytes += delta->len;
    t->full_bytes += delta->len ? img->len : 0;
    t->versions++;
    t->publish_s += sh_now_mono() - t0;
    return 0;
}

static void on_event(const json_t *ev, void *ctx)
{
    trainer_ctx *t = ctx;
    json_t *e = json_deep_copy(ev);
    json_object_set_new(e, "delta_bytes", json_integer((json_int_t)t->last_delta));
    json_object_set_new(e, "image_bytes", json_integer((json_int_t)t->image_bytes));
    json_object_set_new(e, "delta_bytes_total", json_integer((json_int_t)t->delta_bytes));
    json_object_set_new(e, "full_bytes_total", json_integer((json_int_t)t->full_bytes));
    json_object_set_new(e, "store_versions", json_integer(t->versions));
    json_object_set_new(e, "t", json_real(sh_now_wall()));
    if (t->events) {
        char *s = json_dumps(e, JSON_COMPACT);
        if (s) fprintf(t->events, "%s\n", s), fflush(t->events);
        free(s);
    }
    json_decref(e);
}

/* DIR/trainer.json: where workers connect and the options they must share. */
static int announce(const char *dir, const char *addr, int argc, char **argv, const char *state,
                    uint64_t base0)
{
    json_t *args = json_array();
    for (int i = 0; i < argc; i++) json_array_append_new(args, json_string(argv[i]));
    json_t *j = json_pack("{s:s,s:o,s:s,s:i,s:I}", "addr", addr, "args", args, "state", state, "pid",
                          (int)getpid(), "store_base", (json_int_t)base0);
    char path[4096];
    snprintf(path, sizeof path, "%s/trainer.json", dir);
    int rc = sh_json_write_atomic(path, j);
    json_decref(j);
    return rc;
}

static int listen_tcp(const char *host, char *addr, size_t cap, int *fd_out)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof sa;
    if (fd < 0) return sh_err_errno(errno, "trainer: socket");
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        close(fd);
        return sh_err(SH_EINVAL, "trainer: MASTER_ADDR \"%s\" is not an IPv4 address", host);
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 64) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) < 0) {
        int e = errno;
        close(fd);
        return sh_err_errno(e, "trainer: listen on %s", host);
    }
    snprintf(addr, cap, "%s:%u", host, ntohs(sa.sin_port));
    *fd_out = fd;
    return 0;
}

int mj_trainer_rank0(const rl_config *c0, const mj_trainer_opts *o, mj_ring *ring, int world,
                     const char *host, json_t **res)
{
    rl_config c = *c0;
    trainer_ctx t = {.dp = {.ring = ring, .rank = 0, .world = world, .total_steps = c.steps},
                     .store_dir = o->store};
    char addr[64];
    int lfd = -1;
    int rc = sh_mkdir_p(o->store, 0755);
    if (!rc) rc = store_open(o->store, NULL, 1, &t.st);
    if (!rc) rc = store_latest(t.st, &t.base0);
    if (!rc) rc = listen_tcp(host, addr, sizeof addr, &lfd);
    if (!rc && o->events && !(t.events = fopen(o->events, "a")))
        rc = sh_err_errno(errno, "trainer: %s", o->events);
    if (!rc) rc = announce(o->store, addr, o->nargs, o->args, "running", t.base0);
    if (!rc) {
        if (o->on_listen) o->on_listen(o->arg, addr);
        c.remote = 1, c.listen_fd = lfd, c.drain_s = 15;
        c.on_publish = on_publish, c.train_fn = mj_train_step, c.hook_ctx = &t;
        rc = rl_run(&c, on_event, &t, res);
    }
    if (!rc) {
        json_object_set_new(*res, "ranks", json_integer(world));
        json_object_set_new(*res, "ranks_in_sync", json_boolean(t.dp.in_sync || world == 1));
        json_object_set_new(*res, "ring_bytes_sent_rank0", json_integer((json_int_t)mj_ring_bytes_sent(ring)));
        json_object_set_new(*res, "store_versions", json_integer(t.versions));
        json_object_set_new(*res, "delta_bytes_total", json_integer((json_int_t)t.delta_bytes));
        json_object_set_new(*res, "full_bytes_total", json_integer((json_int_t)t.full_bytes));
        json_object_set_new(*res, "store_bytes_total", json_integer((json_int_t)t.store_bytes));
        json_object_set_new(*res, "store_base", json_integer((json_int_t)t.base0));
        json_object_set_new(*res, "publish_s", json_real(t.publish_s));
        if (o->result) rc = sh_json_write_atomic(o->result, *res);
    }
    announce(o->store, lfd >= 0 ? addr : "", o->nargs, o->args, rc ? "failed" : "done", t.base0);
    if (lfd >= 0) close(lfd);
    if (t.events) fclose(t.events);
    store_close(t.st);
    return rc;
}

