/* The RL trainer against a hostile or buggy rollout worker.
 *
 * A real trainer (rl_run, remote mode, on a loopback TCP socket with the
 * run's secret) serves two honest remote workers and one hostile one: a
 * real worker (rl_worker_serve) behind a proxy process that holds the
 * connection, proves the secret through the worker inside, and rewrites
 * one field of what the worker sends (a TRAJS record's group, versions,
 * log-probabilities, reward, problem, prompt, length, or a REFUSE or BYE
 * in its place).  Each forged record carries a mark (blogp[0], a slot no
 * loss reads) that the trainer's train_fn looks for in every batch: a
 * forged trajectory must never reach the loss, the worker must be dropped
 * with a message naming the trajectory and the field, and the run must
 * finish its steps with the honest workers (its groups asked again:
 * the runs are ordered, so a lost group would stall them).
 *
 * The unit tests below drive rl__trajs_check and the other payload checks
 * (src/rl/engine/trajcheck.c) directly, one field at a time. */
#include "testutil.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rl/engine/wire_int.h"
#include "shoal/rl.h"

#define MARK -777.0f /* blogp[0] of a forged record (plen >= 2: never read) */

enum forge {
    F_GROUP, F_VFUTURE, F_VORDER, F_VOLD, F_BLOGP_NAN, F_BLOGP_POS, F_BLOGP_HUGE, F_REWARD_INF,
    F_REWARD_WRONG, F_PROBLEM, F_PROMPT, F_LEN_CTX, F_BYE_EARLY, F_REFUSE_HOLDING, F_VSTALE,
};

/* ---- The hostile worker: a real worker behind a rewriting proxy ------------ */

typedef struct proxy {
    int up, down; /* the trainer's connection; the worker inside */
    enum forge f;
    int go;       /* written once the first forged message is out */
    pthread_mutex_t mu;
    int minv[64], nminv; /* min_version of the REQUESTs passed down, oldest first */
} proxy;

/* Trainer -> worker, frame by frame, noting each REQUEST's min_version. */
static void *relay_down(void *arg)
{
    proxy *x = arg;
    sh_buf m = {0};
    uint32_t type;
    while (rl__msg_read(x->up, &type, &m) == 0) {
        if (type == RL_MSG_REQUEST && m.len >= sizeof(rl_wire_request)) {
            rl_wire_request rq;
            memcpy(&rq, m.data, sizeof rq);
            pthread_mutex_lock(&x->mu);
            if (x->nminv < 64) x->minv[x->nminv++] = rq.min_version;
            pthread_mutex_unlock(&x->mu);
        }
        if (rl__msg_write(x->down, type, m.data, m.len, NULL, 0) < 0) break;
    }
    _exit(0); /* the trainer dropped us (or stopped): the worker inside sees EOF */
}

static void forge_record(enum forge f, rl_traj *t)
{
    t->blogp[0] = MARK;
    switch (f) {
    case F_GROUP: t->group += 1000; break;
    case F_VFUTURE: t->vstart = t->vend = 1000; break;
    case F_VORDER: t->vstart = t->vend + 1; break;
    case F_VOLD: t->vstart = t->vend = -5; break;
    case F_BLOGP_NAN: t->blogp[t->plen] = NAN; break;
    case F_BLOGP_POS: t->blogp[t->plen] = 0.5f; break;
    case F_BLOGP_HUGE: t->blogp[t->len - 1] = -1e30f; break;
    case F_REWARD_INF: t->reward = INFINITY; break;
    case F_REWARD_WRONG: t->reward = t->reward > 0.5f ? 0 : 1; break;
    case F_PROBLEM: t->problem += 1; break;
    case F_PROMPT: t->tokens[2] = t->tokens[2] == rl_tok('7') ? rl_tok('8') : rl_tok('7'); break;
    case F_LEN_CTX: /* longer than the model's context, tokens and log-probs plausible */
        while (t->len < RL_MAX_T) t->tokens[t->len] = rl_tok('1'), t->blogp[t->len++] = -1;
        t->reward = 0; /* what rl_reward gives an answer without EOS */
        break;
    default: break;
    }
}

static void __attribute__((noreturn)) proxy_main(const rl_config *c, int port, enum forge f, int go)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int up = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), sv[2];
    if (up < 0 || connect(up, (struct sockaddr *)&sa, sizeof sa) < 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        _exit(3);
    rl_worker_spec me = {.name = "evil", .speed = 1, .price = 1};
    pid_t inner = fork();
    if (inner == 0) {
        close(up), close(sv[0]);
        rl_worker_serve(c, &me, sv[1]);
    }
    close(sv[1]);
    proxy x = {.up = up, .down = sv[0], .f = f, .go = go};
    pthread_mutex_init(&x.mu, NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, relay_down, &x)) _exit(3);
    sh_buf m = {0};
    uint32_t type;
    int told = 0;
    while (rl__msg_read(x.down, &type, &m) == 0) {
        int minv = 0;
        if (type == RL_MSG_TRAJS || type == RL_MSG_REFUSE) {
            pthread_mutex_lock(&x.mu);
            minv = x.nminv ? x.minv[0] : 0;
            if (x.nminv) memmove(x.minv, x.minv + 1, sizeof(int) * (size_t)--x.nminv);
            pthread_mutex_unlock(&x.mu);
        }
        if (type == RL_MSG_TRAJS && m.len >= sizeof(rl_wire_trajs)) {
            rl_wire_trajs hd;
            memcpy(&hd, m.data, sizeof hd);
            rl_traj *t = (rl_traj *)(m.data + sizeof hd); /* sh_buf data is malloc'd: aligned */
            if (f == F_BYE_EARLY) { /* "goodbye" with requests in flight, then gone */
                rl_wire_bye b = {.version = t[0].vend};
                if (!told++) (void)!write(go, "g", 1);
                rl__msg_write(up, RL_MSG_BYE, &b, sizeof b, NULL, 0);
                sh_sleep(0.2);
                _exit(0);
            }
            if (f == F_REFUSE_HOLDING) { /* refuses work it could do */
                rl_wire_refuse r = {.version = t[0].vend, .min_version = minv, .group0 = t[0].group,
                                    .nprompts = hd.count / c->group};
                if (!told++) (void)!write(go, "g", 1);
                if (rl__msg_write(up, RL_MSG_REFUSE, &r, sizeof r, NULL, 0) < 0) break;
                continue;
            }
            if (f == F_VSTALE && minv < 1) { /* honest until a request needs version 1 or newer */
                if (rl__msg_write(up, type, m.data, m.len, NULL, 0) < 0) break;
                continue;
            }
            for (int k = 0; k < hd.count; k++) forge_record(f, &t[k]);
            if (f == F_VSTALE) /* older than the request allows: past the staleness bound */
                for (int k = 0; k < hd.count; k++) t[k].vstart = t[k].vend = minv - 1;
        }
        /* The honest workers may come now (before the write: the trainer
         * may drop us as soon as it reads, and relay_down then exits). */
        if (type == RL_MSG_TRAJS && !told++) (void)!write(go, "g", 1);
        if (rl__msg_write(up, type, m.data, m.len, NULL, 0) < 0) break;
    }
    _exit(0);
}

/* ---- The run ----------------------------------------------------------------- */

static long trained, marked; /* trajectories the trainer trained on; forged ones among them */

static int count_then_train(void *ctx, rl_trainer *tr, const rl_traj *t, int n, rl_step_stats *st)
{
    for (int i = 0; i < n; i++) marked += t[i].blogp[0] == MARK;
    trained += n;
    return rl_train_step(tr, t, n, st);
}

static rl_config small_config(void)
{
    rl_config c;
    rl_config_default(&c);
    c.mode = RL_MODE_ASYNC, c.ordered = 1, c.max_lag = 1;
    c.warm_steps = 0, c.steps = 3, c.eval_every = 3, c.eval_n = 4;
    c.prompts_per_step = 2, c.group = 4, c.req_prompts = 1, c.minibatches = 1;
    c.gen_cost = 1, c.drain_s = 5, c.quiet = 1;
    return c;
}

static pid_t fork_or_fail(void)
{
    fflush(stdout), fflush(stderr);
    pid_t p = fork();
    assert_true(p >= 0);
    return p;
}

/* An honest worker that connects once the hostile one has sent its first
 * forged message (or after 20 s), so that the hostile one is served first. */
static pid_t honest(const rl_config *c, int port, int go, int lfd, const char *name)
{
    pid_t p = fork_or_fail();
    if (p) return p;
    close(lfd);
    struct pollfd pf = {.fd = go, .events = POLLIN};
    poll(&pf, 1, 20000);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) _exit(3);
    rl_worker_spec me = {.speed = 1, .price = 1};
    snprintf(me.name, sizeof me.name, "%s", name);
    rl_worker_serve(c, &me, fd);
}

static void reap(pid_t *pids, int n)
{
    double t0 = sh_now_mono();
    for (int i = 0; i < n; i++) {
        int st;
        while (waitpid(pids[i], &st, WNOHANG) == 0) {
            if (sh_now_mono() - t0 > 10) {
                kill(pids[i], SIGKILL);
                waitpid(pids[i], &st, 0);
                break;
            }
            sh_sleep(0.02);
        }
    }
}

/* Runs the trainer with the hostile worker forging f and two honest ones;
 * checks the run, and that the hostile one was dropped for `field`. */
static void run_against(enum forge f, const char *field)
{
#if defined(__SANITIZE_ADDRESS__)
    if (f != F_BLOGP_NAN && f != F_LEN_CTX) skip(); /* each is a whole run; the optimised build runs all */
#endif
    setenv("SHOAL_RUN_SECRET", "3b1f0c9e7a5d2c4e6f8a0b1c2d3e4f50", 1);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(lfd, 64), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
    int port = ntohs(sa.sin_port), go[2];
    assert_int_equal(pipe(go), 0);
    rl_config c = small_config();
    pid_t pids[3];
    pids[0] = fork_or_fail();
    if (!pids[0]) {
        close(lfd), close(go[0]);
        proxy_main(&c, port, f, go[1]);
    }
    pids[1] = honest(&c, port, go[0], lfd, "good-a");
    pids[2] = honest(&c, port, go[0], lfd, "good-b");
    close(go[1]);
    c.remote = 1, c.listen_fd = lfd;
    c.train_fn = count_then_train;
    trained = marked = 0;
    alarm(60); /* a run that stalls (groups never asked again) fails here */
    json_t *res = NULL;
    int rc = rl_run(&c, NULL, NULL, &res);
    alarm(0);
    close(lfd), close(go[0]);
    reap(pids, 3);
    unsetenv("SHOAL_RUN_SECRET");
    if (rc < 0) fail_msg("the run failed: %s", sh_errmsg());
    print_message("forge %d: steps %lld, trained %ld, forged trained %ld, dropped %lld\n", f,
                  json_integer_value(json_object_get(res, "steps")), trained, marked,
                  json_integer_value(json_object_get(res, "workers_dropped_for_violations")));
    assert_int_equal(marked, 0);
    assert_int_equal(json_integer_value(json_object_get(res, "steps")), 3);
    assert_int_equal(trained, 3 * 2 * 4);
    assert_int_equal(json_integer_value(json_object_get(res, "workers_dropped_for_violations")), 1);
    /* The ordered run trained on groups 0..5 in order, the requests the
     * hostile worker held asked again of an honest one. */
    json_t *steps = json_object_get(res, "step_stats");
    for (size_t i = 0; i < 3; i++) {
        json_t *g = json_object_get(json_array_get(steps, i), "groups");
        assert_int_equal(json_integer_value(json_array_get(g, 0)), 2 * (int)i);
        assert_int_equal(json_integer_value(json_array_get(g, 1)), 2 * (int)i + 1);
    }
    /* The hostile worker's entry says why it was dropped. */
    const char *why = NULL;
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(res, "workers"), i, w)
        if (!strcmp(json_string_value(json_object_get(w, "name")), "evil"))
            why = json_string_value(json_object_get(w, "dropped_for"));
    if (!why || !strstr(why, field)) fail_msg("dropped for \"%s\", expected \"%s\"", why ? why : "(nothing)", field);
    assert_non_null(strstr(why, "(evil)"));
    json_decref(res);
}

static void test_forged_group(void **s) { run_against(F_GROUP, "trajectory 0: group 1000, but it answers groups 0..0"); }
static void test_forged_future_version(void **s) { run_against(F_VFUTURE, "vend 1000, newer than the trainer's version"); }
static void test_forged_vstart_after_vend(void **s) { run_against(F_VORDER, "trajectory 0: vstart 1 > vend 0"); }
static void test_forged_negative_version(void **s) { run_against(F_VOLD, "vstart -5, older than the request's min_version 0"); }
static void test_forged_stale_version(void **s) { run_against(F_VSTALE, "vstart 0, older than the request's min_version 1"); }
static void test_forged_nan_blogp(void **s) { run_against(F_BLOGP_NAN, "is nan"); }
static void test_forged_positive_blogp(void **s) { run_against(F_BLOGP_POS, "is 0.5, not a sampled token's log-probability"); }
static void test_forged_huge_blogp(void **s) { run_against(F_BLOGP_HUGE, "is -1e+30, not a sampled token's"); }
static void test_forged_inf_reward(void **s) { run_against(F_REWARD_INF, "trajectory 0: reward inf, but its response scores"); }
static void test_forged_wrong_reward(void **s) { run_against(F_REWARD_WRONG, "but its response scores"); }
static void test_forged_problem(void **s) { run_against(F_PROBLEM, "trajectory 0: problem"); }
static void test_forged_prompt(void **s) { run_against(F_PROMPT, "trajectory 0: tokens[2] is"); }
static void test_forged_length(void **s) { run_against(F_LEN_CTX, "len 32: want 2 <= plen < len <= 24"); }
static void test_bye_before_stop(void **s) { run_against(F_BYE_EARLY, "BYE before STOP"); }
static void test_refuse_while_holding(void **s) { run_against(F_REFUSE_HOLDING, "REFUSE while holding version 0"); }

/* ---- A forked worker's corrupt answer ------------------------------------------
 * rl train's own workers are forked processes of this binary, so this test
 * corrupts one of them from inside: write() below, armed, lets the first
 * worker process to claim `forge_once` write the records of its first
 * TRAJS with a NaN log-probability (as an FP8 overflow would), and every
 * other write through untouched. */

static const char *forge_once; /* armed: the file whose creation claims the one corruption */
static pid_t trainer_pid;
static int after_trajs_hdr; /* this process: 1 after a TRAJS frame header, 2 after its count */

ssize_t write(int fd, const void *b, size_t n)
{
    static ssize_t (*real)(int, const void *, size_t);
    if (!real) real = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    if (!forge_once || getpid() == trainer_pid) return real(fd, b, n);
    if (n == sizeof(rl_wire_hdr)) {
        rl_wire_hdr h;
        memcpy(&h, b, sizeof h);
        after_trajs_hdr = h.magic == RL_WIRE_MAGIC && h.type == RL_MSG_TRAJS;
        return real(fd, b, n);
    }
    if (after_trajs_hdr == 1 && n == sizeof(rl_wire_trajs)) {
        after_trajs_hdr = 2;
        return real(fd, b, n);
    }
    if (after_trajs_hdr == 2 && n >= sizeof(rl_traj) && n % sizeof(rl_traj) == 0) {
        after_trajs_hdr = 0;
        int claim = open(forge_once, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
        if (claim < 0) return real(fd, b, n);
        close(claim);
        rl_traj *t = malloc(n);
        if (!t) return -1;
        memcpy(t, b, n);
        for (size_t k = 0; k < n / sizeof *t; k++) t[k].blogp[0] = MARK, t[k].blogp[t[k].len - 1] = NAN;
        ssize_t rc = real(fd, t, n);
        free(t);
        return rc;
    }
    after_trajs_hdr = 0;
    return real(fd, b, n);
}

/* A forked worker's NaN is refused like a remote one's: the worker is
 * killed and replaced, its groups asked again, the run goes on (before:
 * the NaN reached the loss and the step was skipped; with the check alone,
 * the run would stop). */
static void test_forked_worker_nan(void **state)
{
    rl_config c = small_config();
    c.nworkers = 2;
    c.train_fn = count_then_train;
    trained = marked = 0;
    trainer_pid = getpid();
    char claim[4300];
    snprintf(claim, sizeof claim, "%s", tu_path("forge-claim"));
    unlink(claim);
    forge_once = claim;
    alarm(60);
    json_t *res = NULL;
    int rc = rl_run(&c, NULL, NULL, &res);
    alarm(0);
    forge_once = NULL;
    if (rc < 0) fail_msg("the run failed: %s", sh_errmsg());
    assert_int_equal(access(claim, F_OK), 0); /* a worker did send the NaN */
    print_message("forked: steps %lld, deaths %lld, respawns %lld, dropped %lld, forged trained %ld\n",
                  json_integer_value(json_object_get(res, "steps")),
                  json_integer_value(json_object_get(res, "worker_deaths")),
                  json_integer_value(json_object_get(res, "respawns")),
                  json_integer_value(json_object_get(res, "workers_dropped_for_violations")), marked);
    assert_int_equal(marked, 0);
    assert_int_equal(trained, 3 * 2 * 4);
    assert_int_equal(json_integer_value(json_object_get(res, "steps")), 3);
    assert_int_equal(json_integer_value(json_object_get(res, "workers_dropped_for_violations")), 1);
    assert_int_equal(json_integer_value(json_object_get(res, "respawns")), 1);
    assert_int_equal(json_integer_value(json_object_get(res, "skipped_steps")), 0);
    const char *why = NULL;
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(res, "workers"), i, w)
        if (json_object_get(w, "dropped_for")) why = json_string_value(json_object_get(w, "dropped_for"));
    if (!why || !strstr(why, "is nan")) fail_msg("dropped for \"%s\"", why ? why : "(nothing)");
    json_decref(res);
}

/* ---- The checks, one field at a time (src/rl/engine/trajcheck.c) -------------------- */

/* An honest answer to groups 5 and 6 (2 x 3 trajectories) generated by a
 * real model at version 2, and the request it answers. */
typedef struct honest_msg {
    rl_problem probs[2];
    uint8_t buf[sizeof(rl_wire_trajs) + 6 * sizeof(rl_traj)];
    rl_traj t[6];
    rl__ask a;
} honest_msg;

static void make_honest(honest_msg *h)
{
    rl_config c = small_config();
    nn_model *m;
    TU_OK(nn_new(&c.model, 3, &m));
    uint64_t seed = 77;
    for (int k = 0; k < 2; k++) rl__group_problem(seed, c.task, 5 + k, &h->probs[k]);
    uint64_t rng = seed;
    TU_OK(rl_generate(m, h->probs, 2, 3, 5, &c.sampling, &rng, 2, NULL, NULL, h->t));
    nn_free(m);
    h->a = (rl__ask){.group0 = 5, .nprompts = 2, .group = 3, .min_version = 1, .max_version = 3,
                     .probs = h->probs, .max_len = c.model.ctx, .max_new = c.sampling.max_new};
}

static size_t pack(honest_msg *h)
{
    rl_wire_trajs th = {.worker = 0, .count = 6};
    memcpy(h->buf, &th, sizeof th);
    memcpy(h->buf + sizeof th, h->t, sizeof h->t);
    return sizeof h->buf;
}

/* Applies edit to trajectory k of an honest message and checks that it is
 * refused with a message containing `want`. */
static void refused(void (*edit)(rl_traj *), int k, const char *want)
{
    honest_msg h;
    make_honest(&h);
    rl_traj out[6];
    TU_OK(rl__trajs_check(&h.a, "worker 1 (x)", h.buf, pack(&h), out));
    assert_memory_equal(out, h.t, sizeof out);
    edit(&h.t[k]);
    TU_ERR(rl__trajs_check(&h.a, "worker 1 (x)", h.buf, pack(&h), out), SH_EFORMAT, want);
    char pre[64];
    snprintf(pre, sizeof pre, "worker 1 (x): trajectory %d: ", k);
    if (strncmp(sh_errmsg(), pre, strlen(pre))) fail_msg("\"%s\" does not start \"%s\"", sh_errmsg(), pre);
}

static void e_group(rl_traj *t) { t->group = 5; }
static void e_problem(rl_traj *t) { t->problem ^= 1; }
static void e_plen(rl_traj *t) { t->plen--; }
static void e_bos(rl_traj *t) { t->tokens[0] = RL_EOS; }
static void e_prompt_last(rl_traj *t) { t->tokens[t->plen - 1] = rl_tok('+'); }
static void e_token(rl_traj *t) { t->tokens[t->len - 1] = rl_vocab(); }
static void e_len(rl_traj *t) { t->len = 25; }
static void e_plen_len(rl_traj *t) { t->plen = t->len; }
static void e_new(rl_traj *t)
{
    while (t->len - t->plen <= 8) t->tokens[t->len] = rl_tok('1'), t->blogp[t->len++] = -1;
    t->reward = 0;
}
static void e_vmin(rl_traj *t) { t->vstart = 0; }
static void e_vorder(rl_traj *t) { t->vstart = 3, t->vend = 2; }
static void e_vmax(rl_traj *t) { t->vend = 4; }
static void e_nan(rl_traj *t) { t->blogp[t->len - 1] = NAN; }
static void e_ninf(rl_traj *t) { t->blogp[t->plen] = -INFINITY; }
static void e_pos(rl_traj *t) { t->blogp[t->plen] = 2e-3f; }
static void e_low(rl_traj *t) { t->blogp[t->plen] = -81; }
static void e_rnan(rl_traj *t) { t->reward = NAN; }
static void e_rrange(rl_traj *t) { t->reward = 2; }
static void e_rneg(rl_traj *t) { t->reward = -0.0001f; }
static void e_rwrong(rl_traj *t) { t->reward = t->reward == 0.5f ? 0.25f : 0.5f; } /* in range, not its score */

static void test_check_each_field(void **state)
{
    refused(e_group, 4, "group 5, but it answers groups 5..6 and this record belongs to group 6");
    refused(e_problem, 0, "problem");
    refused(e_plen, 3, "plen");
    refused(e_bos, 1, "tokens[0] is 1");
    refused(e_prompt_last, 2, "prompt");
    refused(e_token, 5, "not in the alphabet");
    refused(e_len, 0, "len 25: want 2 <= plen < len <= 24");
    refused(e_plen_len, 0, "want 2 <= plen < len");
    refused(e_new, 1, "response tokens, more than the run's 8");
    refused(e_vmin, 2, "vstart 0, older than the request's min_version 1");
    refused(e_vorder, 2, "vstart 3 > vend 2");
    refused(e_vmax, 2, "vend 4, newer than the trainer's version 3");
    refused(e_nan, 3, "is nan");
    refused(e_ninf, 3, "is -inf");
    refused(e_pos, 4, "is 0.002, not a sampled token's log-probability");
    refused(e_low, 4, "is -81, not a sampled token's log-probability");
    refused(e_rnan, 5, "reward nan, but its response scores");
    refused(e_rrange, 5, "reward 2, but its response scores");
    refused(e_rneg, 5, "reward -0.0001, but");
    refused(e_rwrong, 1, "but its response scores");
}

/* A log-probability that rounds just above 0, and the bounds themselves,
 * are what honest workers send. */
static void test_check_bounds_accepted(void **state)
{
    honest_msg h;
    make_honest(&h);
    h.t[0].blogp[h.t[0].plen] = RL_BLOGP_MAX;
    h.t[1].blogp[h.t[1].plen] = RL_BLOGP_MIN;
    h.t[2].vstart = 1, h.t[2].vend = 3;
    rl_traj out[6];
    TU_OK(rl__trajs_check(&h.a, "w", h.buf, pack(&h), out));
    /* A min_version below 0 (async, early) asks for no version below 0. */
    h.a.min_version = -2;
    h.t[3].vstart = -1;
    TU_ERR(rl__trajs_check(&h.a, "w", h.buf, pack(&h), out), SH_EFORMAT, "vstart -1, older than the request's min_version 0");
}

/* An exact request (REQUEST.exact, rl_link_ask): every token of the
 * version asked for; a refusal holds another (older or newer). */
static void test_check_exact(void **state)
{
    honest_msg h;
    make_honest(&h);
    rl_traj out[6];
    h.a.exact = 1, h.a.min_version = 2;
    TU_OK(rl__trajs_check(&h.a, "w", h.buf, pack(&h), out));
    h.t[4].vend = 3; /* an in-flight update inside an exact request */
    TU_ERR(rl__trajs_check(&h.a, "w", h.buf, pack(&h), out), SH_EFORMAT,
           "trajectory 4: versions 2..3, but the request asked for exactly version 2");
    h.t[4].vend = 2, h.a.min_version = 1; /* generated by a newer one than asked */
    TU_ERR(rl__trajs_check(&h.a, "w", h.buf, pack(&h), out), SH_EFORMAT, "trajectory 0: versions 2..2, but");
    h.a.exact = 0;
    TU_OK(rl__trajs_check(&h.a, "w", h.buf, pack(&h), out));
    rl__ask a = {.group0 = 8, .nprompts = 2, .group = 4, .min_version = 3, .exact = 1};
    rl_wire_refuse f = {.version = 5, .min_version = 3, .group0 = 8, .nprompts = 2}, got;
    TU_OK(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got)); /* newer: weights never go back */
    f.version = 2;
    TU_OK(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got));
    f.version = 3;
    TU_ERR(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got), SH_EFORMAT, "holding version 3");
    a.exact = 0, f.version = 5;
    TU_ERR(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got), SH_EFORMAT, "holding version 5");
}

static void test_check_message_shape(void **state)
{
    honest_msg h;
    make_honest(&h);
    rl_traj out[6];
    size_t n = pack(&h);
    TU_ERR(rl__trajs_check(&h.a, "w", h.buf, 7, out), SH_EFORMAT, "short TRAJS");
    TU_ERR(rl__trajs_check(&h.a, "w", h.buf, n - 1, out), SH_EFORMAT, "but it was asked for 6");
    rl_wire_trajs th = {.count = 5};
    memcpy(h.buf, &th, sizeof th);
    TU_ERR(rl__trajs_check(&h.a, "w", h.buf, n - sizeof(rl_traj), out), SH_EFORMAT, "TRAJS with 5 records");
}

static void test_refuse_bye_hello(void **state)
{
    rl__ask a = {.group0 = 8, .nprompts = 2, .group = 4, .min_version = 3};
    rl_wire_refuse f = {.version = 2, .min_version = 3, .group0 = 8, .nprompts = 2}, got;
    TU_OK(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got));
    f.version = -1;
    TU_OK(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got));
    TU_ERR(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f - 1, &got), SH_EFORMAT, "REFUSE of 15 bytes");
    f.version = 3;
    TU_ERR(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got), SH_EFORMAT, "holding version 3");
    f.version = -2;
    TU_ERR(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got), SH_EFORMAT, "holding version -2");
    f.version = 2, f.min_version = 2;
    TU_ERR(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got), SH_EFORMAT, "min_version 2, but the request asked for 3");
    /* Early async requests allow versions below 0; none (-1) serves them. */
    a.min_version = f.min_version = -2, f.version = -1;
    TU_OK(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got));
    f.version = 0;
    TU_ERR(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got), SH_EFORMAT, "holding version 0, which serves min_version -2");
    a.min_version = 3, f.version = 2;
    f.min_version = 3, f.group0 = 9;
    TU_ERR(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got), SH_EFORMAT, "groups 9+2");
    f.group0 = 8, f.nprompts = 0x40000001; /* * group would wrap to 4 */
    TU_ERR(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got), SH_EFORMAT, "oldest request is 8+2");

    rl_wire_bye b = {.version = 5}, gb;
    TU_OK(rl__bye_check(5, "w", (uint8_t *)&b, sizeof b, &gb));
    b.version = 6;
    TU_ERR(rl__bye_check(5, "w", (uint8_t *)&b, sizeof b, &gb), SH_EFORMAT, "BYE names version 6");
    b.version = -2;
    TU_ERR(rl__bye_check(5, "w", (uint8_t *)&b, sizeof b, &gb), SH_EFORMAT, "BYE names version -2");
    TU_ERR(rl__bye_check(5, "w", (uint8_t *)&b, 3, &gb), SH_EFORMAT, "BYE of 3 bytes");

    rl_wire_hello h = {.name = "h100", .speed = 0.5, .price = 2, .pid = 42, .flags = RL_HELLO_PUSH}, gh;
    TU_OK(rl__hello_parse("w", (uint8_t *)&h, sizeof h, &gh));
    assert_string_equal(gh.name, "h100");
    rl_wire_hello e = h;
    memset(e.name, 'a', sizeof e.name);
    TU_ERR(rl__hello_parse("w", (uint8_t *)&e, sizeof e, &gh), SH_EFORMAT, "not NUL-terminated");
    e = h, e.name[1] = (char)0xff;
    TU_ERR(rl__hello_parse("w", (uint8_t *)&e, sizeof e, &gh), SH_EFORMAT, "byte 0xff at 1");
    e = h, e.price = INFINITY;
    TU_ERR(rl__hello_parse("w", (uint8_t *)&e, sizeof e, &gh), SH_EFORMAT, "price inf");
    e = h, e.speed = NAN;
    TU_ERR(rl__hello_parse("w", (uint8_t *)&e, sizeof e, &gh), SH_EFORMAT, "speed nan");
    e = h, e.pid = -1;
    TU_ERR(rl__hello_parse("w", (uint8_t *)&e, sizeof e, &gh), SH_EFORMAT, "pid -1 must be > 0");
    e = h, e.flags = 6;
    TU_ERR(rl__hello_parse("w", (uint8_t *)&e, sizeof e, &gh), SH_EFORMAT, "flags 0x6");
    TU_ERR(rl__hello_parse("w", (uint8_t *)&h, sizeof h + 1, &gh), SH_EFORMAT, "HELLO of");
}

/* What the checks cost the trainer's event loop: a step's batch at the
 * defaults (8 prompts x 8 samples of the code task, real rollouts of a
 * real model), checked whole, rewards recomputed.  Printed, for
 * bench/results/2026-12-03-notebook.md; the assertion is that every honest record passes. */
static void test_check_cost(void **state)
{
    rl_config c;
    rl_config_default(&c);
    nn_model *m;
    TU_OK(nn_new(&c.model, 9, &m));
    enum { NP = 8, G = 8 };
    rl_problem probs[NP];
    for (int k = 0; k < NP; k++) rl__group_problem(99, c.task, 40 + k, &probs[k]);
    static uint8_t buf[sizeof(rl_wire_trajs) + NP * G * sizeof(rl_traj)];
    static rl_traj t[NP * G], out[NP * G];
    uint64_t rng = 3;
    TU_OK(rl_generate(m, probs, NP, G, 40, &c.sampling, &rng, 5, NULL, NULL, t));
    nn_free(m);
    rl_wire_trajs th = {.count = NP * G};
    memcpy(buf, &th, sizeof th);
    memcpy(buf + sizeof th, t, sizeof t);
    rl__ask a = {.group0 = 40, .nprompts = NP, .group = G, .min_version = 3, .max_version = 5,
                 .probs = probs, .max_len = c.model.ctx, .max_new = c.sampling.max_new};
    int reps = 200;
    double t0 = sh_now_mono();
    for (int i = 0; i < reps; i++) {
        /* The problems are drawn per message too, as the trainer does. */
        for (int k = 0; k < NP; k++) rl__group_problem(99, c.task, 40 + k, &probs[k]);
        TU_OK(rl__trajs_check(&a, "w", buf, sizeof buf, out));
    }
    double us = (sh_now_mono() - t0) / reps * 1e6;
    print_message("checking a %d-trajectory TRAJS (problems drawn, rewards recomputed): %.1f us, %.2f us a trajectory\n",
                  NP * G, us, us / (NP * G));
    /* The worst case: every response a loop that runs each hidden test to
     * the interpreter's step limit. */
    for (int k = 0; k < NP * G; k++) {
        const char *loop = "1[1+]";
        t[k].len = t[k].plen;
        for (const char *q = loop; *q; q++) t[k].blogp[t[k].len] = -1, t[k].tokens[t[k].len++] = rl_tok(*q);
        t[k].blogp[t[k].len] = -1, t[k].tokens[t[k].len++] = RL_EOS;
        t[k].reward = 0;
    }
    memcpy(buf + sizeof th, t, sizeof t);
    t0 = sh_now_mono();
    for (int i = 0; i < 20; i++) TU_OK(rl__trajs_check(&a, "w", buf, sizeof buf, out));
    us = (sh_now_mono() - t0) / 20 * 1e6;
    print_message("worst case (every response loops to the step limit on every test): %.1f us, %.2f us a trajectory\n",
                  us, us / (NP * G));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_each_field),
        cmocka_unit_test(test_check_bounds_accepted),
        cmocka_unit_test(test_check_exact),
        cmocka_unit_test(test_check_message_shape),
        cmocka_unit_test(test_refuse_bye_hello),
        cmocka_unit_test(test_check_cost),
        cmocka_unit_test(test_forged_group),
        cmocka_unit_test(test_forged_future_version),
        cmocka_unit_test(test_forged_vstart_after_vend),
        cmocka_unit_test(test_forged_negative_version),
        cmocka_unit_test(test_forged_stale_version),
        cmocka_unit_test(test_forged_nan_blogp),
        cmocka_unit_test(test_forged_positive_blogp),
        cmocka_unit_test(test_forged_huge_blogp),
        cmocka_unit_test(test_forged_inf_reward),
        cmocka_unit_test(test_forged_wrong_reward),
        cmocka_unit_test(test_forged_problem),
        cmocka_unit_test(test_forged_prompt),
        cmocka_unit_test(test_forged_length),
        cmocka_unit_test(test_bye_before_stop),
        cmocka_unit_test(test_refuse_while_holding),
        cmocka_unit_test(test_forked_worker_nan),
    };
    return cmocka_run_group_tests_name("rl_hostile", tests, NULL, NULL);
}
