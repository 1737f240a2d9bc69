/* Properties of the RL trainer's checks that the generated mutants
 * (scripts/mutgen.py) found no test held (docs/testing.md):
 *  - a trajectory's reward is recomputed for every task kind: a claimed
 *    reward that is not its response's score is refused, whatever the task;
 *  - the version bounds are exact at the boundary: a trajectory that
 *    started at the request's min_version, or ended at the trainer's
 *    newest version, is taken; one version past either is refused; and the
 *    same for REFUSE and BYE;
 *  - an async run's staleness bound is exact: no step trains on a
 *    trajectory more than max_lag versions old, and the bound is reached
 *    (the trainer does not hold the workers to a stricter one);
 *  - a sync run trains only on trajectories of the version it trains
 *    (staleness 0 at every step: no round is asked for while a step trains);
 *  - a remote connection is sent nothing before its HELLO (a sync round's
 *    requests go to the workers that said HELLO only); one whose first
 *    frame's header is not a HELLO's is closed on the header alone; a
 *    HELLO that comes one byte at a time is put together;
 *  - a remote worker's HELLO is bounded exactly: a printable ASCII name
 *    (0x20..0x7e), a speed in (0,1], a price in [0,1e6];
 *  - a paced run evaluates after steps k, 2k, ... (k = eval_every) and the
 *    last one.
 * The reward, version and HELLO checks are pure (rl__trajs_check, the
 * task's reward, rl__hello_parse); the staleness tests run `shoal rl
 * train`, the schedule rl_paced_run in process. */
#include "testutil.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rl/engine/wire_int.h"
#include "shoal/rl.h"

#define SEED 4242

/* One trajectory answering problem p of group g with response `resp`
 * (terminated with EOS unless open), claiming reward r. */
static void make_traj(const rl_problem *p, int g, const char *resp, int open, float r, rl_traj *t)
{
    memset(t, 0, sizeof *t);
    int n = 0;
    t->tokens[n++] = RL_BOS;
    for (const char *c = p->prompt; *c; c++) t->tokens[n++] = rl_tok(*c);
    t->plen = n;
    for (const char *c = resp; *c; c++) t->blogp[n] = -0.5f, t->tokens[n++] = rl_tok(*c);
    if (!open) t->blogp[n] = -0.5f, t->tokens[n++] = RL_EOS;
    t->len = n;
    t->reward = r;
    t->group = g;
    t->problem = p->id;
    t->vstart = t->vend = 2;
}

static int check_one(const rl_problem *p, int g, const rl_traj *t, int minv, int maxv)
{
    uint8_t buf[sizeof(rl_wire_trajs) + sizeof(rl_traj)];
    rl_wire_trajs th = {.worker = 0, .count = 1};
    memcpy(buf, &th, sizeof th);
    memcpy(buf + sizeof th, t, sizeof *t);
    rl__ask a = {.group0 = g, .nprompts = 1, .group = 1, .min_version = minv, .max_version = maxv,
                 .probs = p, .max_len = RL_MAX_T, .max_new = RL_MAX_T};
    rl_traj out;
    return rl__trajs_check(&a, "w", buf, sizeof buf, &out);
}

/* For each task and many problems: the right answer scores 1 and is taken
 * with reward 1, refused with any other; a wrong answer (one character
 * changed), an unterminated one and an empty one score below 1, and a
 * claim of 1 for them is refused. */
static void test_reward_recomputed_every_task(void **state)
{
    const int tasks[] = {RL_TASK_CODE, RL_TASK_ARITH};
    for (int ti = 0; ti < 2; ti++) {
        int wrong_scored = 0;
        for (int g = 0; g < 40; g++) {
            rl_problem p;
            rl__group_problem(SEED, tasks[ti], g, &p);
            assert_int_equal(p.task, tasks[ti]);
            const char *task = rl_task_name(tasks[ti]);
            int n = (int)strlen(p.answer);
            if (rl_reward(&p, p.answer, n, 1) != 1.0f)
                fail_msg("%s: %s -> %s scores %g, not 1", task, p.prompt, p.answer, (double)rl_reward(&p, p.answer, n, 1));
            if (rl_reward(&p, p.answer, n, 0) != 0.0f) fail_msg("%s: an unterminated response scores", task);
            rl_traj t;
            make_traj(&p, g, p.answer, 0, 1.0f, &t);
            if (check_one(&p, g, &t, 1, 3) < 0) fail_msg("%s: the right answer refused: %s", task, sh_errmsg());
            const float lies[] = {0.0f, 0.5f, 0.99f};
            for (int k = 0; k < 3; k++) {
                make_traj(&p, g, p.answer, 0, lies[k], &t);
                TU_ERR(check_one(&p, g, &t, 1, 3), SH_EFORMAT, "but its response scores 1");
            }
            /* One character changed: a digit for another (the code task's
             * constants and the sum's digits), else an operator. */
            char bad[32];
            snprintf(bad, sizeof bad, "%s", p.answer);
            char *c = bad + n - 1;
            while (c > bad && !(*c >= '0' && *c <= '9')) c--;
            *c = *c >= '0' && *c <= '9' ? (char)('0' + (*c - '0' + 3) % 10) : (*c == '+' ? '-' : '+');
            float w = rl_reward(&p, bad, n, 1);
            if (w < 1.0f) {
                wrong_scored++;
                make_traj(&p, g, bad, 0, 1.0f, &t);
                TU_ERR(check_one(&p, g, &t, 1, 3), SH_EFORMAT, "but its response scores");
                make_traj(&p, g, bad, 0, w, &t);
                if (check_one(&p, g, &t, 1, 3) < 0) fail_msg("%s: an honest partial reward refused: %s", task, sh_errmsg());
            }
            make_traj(&p, g, p.answer, 1, 1.0f, &t);
            TU_ERR(check_one(&p, g, &t, 1, 3), SH_EFORMAT, "reward 1, but its response scores 0");
            make_traj(&p, g, "", 0, 1.0f, &t);
            TU_ERR(check_one(&p, g, &t, 1, 3), SH_EFORMAT, "reward 1, but its response scores 0");
        }
        /* Changing one character almost always breaks the answer. */
        if (wrong_scored < 30) fail_msg("%s: only %d of 40 wrong answers score below 1", rl_task_name(tasks[ti]), wrong_scored);
    }
}

/* The version bounds, exact: vstart >= min_version (0 when the request's
 * is below 0), vstart <= vend, vend <= the trainer's newest version. */
static void test_version_bounds_exact(void **state)
{
    rl_problem p;
    rl__group_problem(SEED, RL_TASK_ARITH, 3, &p);
    rl_traj t;
    for (int minv = -2; minv <= 4; minv++) {
        int vmin = minv > 0 ? minv : 0, maxv = vmin + 3;
        make_traj(&p, 3, p.answer, 0, 1.0f, &t);
        t.vstart = vmin, t.vend = vmin;
        TU_OK(check_one(&p, 3, &t, minv, maxv));
        t.vstart = vmin - 1;
        TU_ERR(check_one(&p, 3, &t, minv, maxv), SH_EFORMAT, "older than the request's min_version");
        t.vstart = maxv, t.vend = maxv;
        TU_OK(check_one(&p, 3, &t, minv, maxv));
        t.vend = maxv + 1;
        TU_ERR(check_one(&p, 3, &t, minv, maxv), SH_EFORMAT, "newer than the trainer's version");
        t.vstart = vmin + 1, t.vend = vmin;
        TU_ERR(check_one(&p, 3, &t, minv, maxv), SH_EFORMAT, "> vend");
        t.vstart = vmin, t.vend = vmin + 1;
        TU_OK(check_one(&p, 3, &t, minv, maxv));
    }
    /* REFUSE: a worker refuses only while it holds a version below what
     * the request needs (or none). */
    for (int minv = -1; minv <= 3; minv++) {
        int need = minv > 0 ? minv : 0;
        rl__ask a = {.group0 = 8, .nprompts = 2, .group = 4, .min_version = minv};
        rl_wire_refuse f = {.version = need - 1, .min_version = minv, .group0 = 8, .nprompts = 2}, got;
        if (need - 1 >= -1) TU_OK(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got));
        f.version = need;
        TU_ERR(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got), SH_EFORMAT, "REFUSE while holding");
        f.version = -2;
        TU_ERR(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got), SH_EFORMAT, "REFUSE while holding");
        f.version = -1, f.min_version = minv + 1;
        TU_ERR(rl__refuse_check(&a, "w", (uint8_t *)&f, sizeof f, &got), SH_EFORMAT, "but the request asked");
    }
    /* BYE: versions -1..max. */
    for (int maxv = 0; maxv < 3; maxv++) {
        rl_wire_bye b = {.version = maxv}, got;
        TU_OK(rl__bye_check(maxv, "w", (uint8_t *)&b, sizeof b, &got));
        b.version = -1;
        TU_OK(rl__bye_check(maxv, "w", (uint8_t *)&b, sizeof b, &got));
        b.version = maxv + 1;
        TU_ERR(rl__bye_check(maxv, "w", (uint8_t *)&b, sizeof b, &got), SH_EFORMAT, "BYE names version");
        b.version = -2;
        TU_ERR(rl__bye_check(maxv, "w", (uint8_t *)&b, sizeof b, &got), SH_EFORMAT, "BYE names version");
    }
}

static void test_staleness_bound_exact(void **state)
{
    for (int lag = 1; lag <= 2; lag++) {
        char *out = NULL;
        int rc = tu_run(&out, "%s rl train --mode async --max-lag %d --steps 6 --warm 0 --eval-every 100 --eval-n 1 "
                        "--prompts 4 --gen-cost 1 --quiet --json 2>/dev/null", tu_shoal(), lag);
        if (rc != 0) fail_msg("rl train --max-lag %d: exit %d", lag, rc);
        json_t *j = NULL;
        TU_OK(sh_json_parse(out, strlen(out), "rl train", &j));
        free(out);
        json_t *h = json_object_get(j, "staleness_hist"), *steps = json_object_get(j, "step_stats");
        assert_int_equal(json_array_size(h), lag + 1);
        long total = 0;
        for (size_t i = 0; i < json_array_size(h); i++) total += (long)json_integer_value(json_array_get(h, i));
        assert_int_equal(total, 6 * 4 * 8); /* steps x prompts x group */
        assert_int_equal(json_array_size(steps), 6);
        long top = 0;
        for (size_t i = 0; i < 6; i++) {
            long m = (long)json_integer_value(json_object_get(json_array_get(steps, i), "staleness_max"));
            if (m > lag) fail_msg("--max-lag %d: step %zu trained on a trajectory %ld versions old", lag, i + 1, m);
            if (m > top) top = m;
        }
        if (top != lag) fail_msg("--max-lag %d: no step reached the bound (at most %ld)", lag, top);
        if (!json_integer_value(json_array_get(h, (size_t)lag)))
            fail_msg("--max-lag %d: no trajectory of staleness %d", lag, lag);
        json_decref(j);
    }
}

/* Sync: every step's batch comes from the round asked for once the step
 * before was trained, so no trajectory is older than the trained version. */
static void test_sync_fresh(void **state)
{
    char *out = NULL;
    int rc = tu_run(&out, "timeout 60 %s rl train --mode sync --steps 2 --warm 0 --eval-every 100 --eval-n 1 --prompts 2 "
                    "--group 4 --gen-cost 1 --quiet --json 2>/dev/null", tu_shoal());
    if (rc != 0) fail_msg("rl train --mode sync: exit %d", rc);
    json_t *j = NULL;
    TU_OK(sh_json_parse(out, strlen(out), "rl train", &j));
    free(out);
    json_t *steps = json_object_get(j, "step_stats");
    assert_int_equal(json_array_size(steps), 2);
    for (size_t i = 0; i < 2; i++) {
        long m = (long)json_integer_value(json_object_get(json_array_get(steps, i), "staleness_max"));
        if (m != 0) fail_msg("sync: step %zu trained on a trajectory %ld versions old", i + 1, m);
    }
    json_decref(j);
}

static int bad_fd[3], bad_open_at_step[3] = {-1, -1, -1};

/* At the first trained step: are the connections whose first frame was
 * bad still open? */
static void first_step(const json_t *ev, void *ctx)
{
    const char *e = json_string_value(json_object_get(ev, "event"));
    if (!e || strcmp(e, "step") || bad_open_at_step[0] >= 0) return;
    for (int k = 0; k < 3; k++) {
        char b;
        ssize_t n = recv(bad_fd[k], &b, 1, MSG_DONTWAIT | MSG_PEEK);
        bad_open_at_step[k] = n != 0; /* 0: closed by the trainer */
    }
}

static int tcp_to(const struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (const struct sockaddr *)sa, sizeof *sa) < 0) return -1;
    return fd;
}

/* A remote sync run: an honest worker; a worker whose HELLO comes one byte
 * at a time (then it leaves); a connection that never says anything; and
 * three whose first frame's header is not a HELLO's: a HELLO of 64 MiB,
 * another message of a HELLO's size, a HELLO with a wrong magic (headers
 * only, nothing after them).  The run trains; the silent connection was
 * sent nothing (no request naming the run's problems: a sync round goes
 * to the workers that said HELLO); the three bad ones were closed on
 * their header alone, before the first step (not after RL_HELLO_S, waiting
 * for bytes that never come); the slow HELLO was put together and the
 * worker joined. */
static void test_remote_first_frames(void **state)
{
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(lfd, 16), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
    int quiet = tcp_to(&sa);
    assert_true(quiet >= 0);
    const rl_wire_hdr bad[3] = {{RL_WIRE_MAGIC, RL_MSG_HELLO, 64u << 20},
                                {RL_WIRE_MAGIC, RL_MSG_TRAJS, sizeof(rl_wire_hello)},
                                {RL_WIRE_MAGIC ^ 1, RL_MSG_HELLO, sizeof(rl_wire_hello)}};
    for (int k = 0; k < 3; k++) {
        bad_fd[k] = tcp_to(&sa);
        assert_true(bad_fd[k] >= 0);
        assert_int_equal(send(bad_fd[k], &bad[k], sizeof bad[k], 0), (ssize_t)sizeof bad[k]);
        bad_open_at_step[k] = -1;
    }
    rl_config c;
    rl_config_default(&c);
    c.mode = RL_MODE_SYNC;
    c.warm_steps = 0, c.steps = 2, c.eval_every = 2, c.eval_n = 1;
    c.prompts_per_step = 2, c.group = 2, c.minibatches = 1;
    c.gen_cost = 1, c.drain_s = 5, c.quiet = 1;
    pid_t kids[2];
    int go[2]; /* the honest worker connects once the slow HELLO is sent */
    assert_int_equal(pipe(go), 0);
    for (int k = 0; k < 2; k++) {
        fflush(stdout), fflush(stderr);
        kids[k] = fork();
        assert_true(kids[k] >= 0);
        if (kids[k]) continue;
        close(lfd), close(quiet);
        for (int b = 0; b < 3; b++) close(bad_fd[b]);
        if (k == 0) {
            close(go[1]);
            struct pollfd pf = {.fd = go[0], .events = POLLIN};
            poll(&pf, 1, 10000);
        } else {
            close(go[0]);
        }
        int fd = tcp_to(&sa);
        if (fd < 0) _exit(3);
        if (k == 0) {
            rl_worker_spec me = {.name = "good", .speed = 1, .price = 1};
            rl_worker_serve(&c, &me, fd);
        }
        struct {
            rl_wire_hdr h;
            rl_wire_hello b;
        } m = {{RL_WIRE_MAGIC, RL_MSG_HELLO, sizeof(rl_wire_hello)},
               {.name = "dribble", .speed = 1, .price = 1, .pid = (int32_t)getpid()}};
        for (size_t i = 0; i < sizeof m; i++) {
            if (send(fd, (const char *)&m + i, 1, MSG_NOSIGNAL) != 1) _exit(4);
            sh_sleep(0.002);
        }
        sh_sleep(0.1);
        close(go[1]);
        sh_sleep(0.3);
        _exit(0);
    }
    close(go[0]), close(go[1]);
    c.remote = 1, c.listen_fd = lfd;
    alarm(60);
    json_t *res = NULL;
    int rc = rl_run(&c, first_step, NULL, &res);
    alarm(0);
    close(lfd);
    for (int k = 0; k < 2; k++) {
        int st;
        for (int i = 0; i < 500 && waitpid(kids[k], &st, WNOHANG) == 0; i++) sh_sleep(0.02);
        if (waitpid(kids[k], &st, WNOHANG) == 0) kill(kids[k], SIGKILL), waitpid(kids[k], &st, 0);
    }
    for (int k = 0; k < 3; k++) close(bad_fd[k]);
    if (rc < 0) fail_msg("the run failed: %s", sh_errmsg());
    assert_int_equal(json_integer_value(json_object_get(res, "steps")), 2);
    int dribbled = 0;
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(res, "workers"), i, w)
        dribbled |= !strcmp(json_string_value(json_object_get(w, "name")), "dribble");
    json_decref(res);
    uint8_t b[64];
    ssize_t n = recv(quiet, b, sizeof b, MSG_DONTWAIT);
    close(quiet);
    if (n > 0) {
        rl_wire_hdr h = {0};
        memcpy(&h, b, (size_t)n < sizeof h ? (size_t)n : sizeof h);
        fail_msg("a connection that never said HELLO was sent %zd bytes (message type %u)", n, h.type);
    }
    const char *what[3] = {"a HELLO of 64 MiB", "a TRAJS first", "a wrong magic"};
    for (int k = 0; k < 3; k++)
        if (bad_open_at_step[k] != 0)
            fail_msg("the connection that sent %s was %s at the first step", what[k],
                     bad_open_at_step[k] < 0 ? "not checked" : "still open");
    if (!dribbled) fail_msg("the worker whose HELLO came one byte at a time did not join");
}

static int hello_ok(const rl_wire_hello *h)
{
    rl_wire_hello got;
    return rl__hello_parse("w", (const uint8_t *)h, sizeof *h, &got);
}

/* The HELLO's name goes into logs and the run's JSON: every byte outside
 * 0x20..0x7e is refused (a newline could forge a log line), the bounds
 * themselves taken; speed and price are checked at their exact bounds. */
static void test_hello_fields_exact(void **state)
{
    const rl_wire_hello h = {.name = "gpu", .speed = 1, .price = 1e6, .pid = 7};
    TU_OK(hello_ok(&h));
    const unsigned char bad[] = {0x01, 0x09, 0x0a, 0x1b, 0x1f, 0x7f, 0x80, 0xc3, 0xff};
    for (size_t k = 0; k < sizeof bad; k++)
        for (int at = 0; at < 3; at++) {
            rl_wire_hello e = h;
            e.name[at] = (char)bad[k];
            char want[64];
            snprintf(want, sizeof want, "byte 0x%02x at %d", bad[k], at);
            TU_ERR(hello_ok(&e), SH_EFORMAT, want);
        }
    rl_wire_hello e = h;
    snprintf(e.name, sizeof e.name, " ~x~ ");
    TU_OK(hello_ok(&e));
    const double speeds_ok[] = {1, 0.5, 1e-9}, speeds_bad[] = {0, -0.5, 1.0000001, 2};
    for (int k = 0; k < 3; k++) {
        e = h, e.speed = speeds_ok[k];
        TU_OK(hello_ok(&e));
    }
    for (int k = 0; k < 4; k++) {
        e = h, e.speed = speeds_bad[k];
        TU_ERR(hello_ok(&e), SH_EFORMAT, "must be in (0,1]");
    }
    const double prices_ok[] = {0, 1e6, 2.5}, prices_bad[] = {-0.01, 1e6 + 1};
    for (int k = 0; k < 3; k++) {
        e = h, e.price = prices_ok[k];
        TU_OK(hello_ok(&e));
    }
    for (int k = 0; k < 2; k++) {
        e = h, e.price = prices_bad[k];
        TU_ERR(hello_ok(&e), SH_EFORMAT, "price");
    }
}

/* A paced run's evaluations: after steps k, 2k, ... and the last, besides
 * the one before training (step 0). */
static void test_paced_eval_schedule(void **state)
{
    rl_config c;
    rl_config_default(&c);
    c.mode = RL_MODE_ASYNC, c.max_lag = 1;
    c.warm_steps = 0, c.steps = 5, c.eval_every = 2, c.eval_n = 1;
    c.prompts_per_step = 2, c.group = 2, c.req_prompts = 1;
    c.step_s = 0.01, c.seq_cost = 0.1, c.train_s = 0.6;
    c.quiet = 1;
    json_t *r = NULL;
    TU_OK(rl_paced_run(&c, NULL, NULL, &r));
    json_t *curve = json_object_get(r, "curve");
    const int want[] = {0, 2, 4, 5};
    if (json_array_size(curve) != 4) fail_msg("%zu evaluations, want 4 (steps 0, 2, 4, 5)", json_array_size(curve));
    for (size_t i = 0; i < 4; i++) {
        int step = (int)json_integer_value(json_object_get(json_array_get(curve, i), "step"));
        if (step != want[i]) fail_msg("evaluation %zu after step %d, want %d", i, step, want[i]);
    }
    json_decref(r);
}

/* A paced async run with a fast worker and one so slow that each of its
 * groups is past the staleness bound when it lands: the run drops whole
 * groups that are too old and only those, so everything dropped is the
 * slow worker's (the fast one's groups, fresh, stay). */
static void test_paced_drops_only_stale_groups(void **state)
{
    rl_config c;
    rl_config_default(&c);
    c.mode = RL_MODE_ASYNC, c.max_lag = 1;
    c.warm_steps = 0, c.steps = 8, c.eval_every = 8, c.eval_n = 1;
    c.prompts_per_step = 2, c.group = 2, c.req_prompts = 1;
    c.step_s = 0.01, c.seq_cost = 0.1, c.train_s = 0.6;
    c.quiet = 1;
    c.nworkers = 2;
    c.workers[0] = (rl_worker_spec){.name = "fast", .speed = 1, .price = 1};
    c.workers[1] = (rl_worker_spec){.name = "slow", .speed = 0.02, .price = 1};
    json_t *r = NULL;
    TU_OK(rl_paced_run(&c, NULL, NULL, &r));
    long dropped = (long)json_integer_value(json_object_get(r, "dropped_stale"));
    json_t *w = json_object_get(r, "workers");
    long fast = (long)json_integer_value(json_object_get(json_array_get(w, 0), "trajectories"));
    long slow = (long)json_integer_value(json_object_get(json_array_get(w, 1), "trajectories"));
    print_message("dropped %ld, fast %ld, slow %ld\n", dropped, fast, slow);
    if (dropped <= 0) fail_msg("nothing was dropped: the slow worker's groups were not stale (%ld of its)", slow);
    if (dropped > slow) fail_msg("%ld trajectories dropped as stale, but only %ld were the slow worker's", dropped, slow);
    json_decref(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reward_recomputed_every_task),
        cmocka_unit_test(test_version_bounds_exact),
        cmocka_unit_test(test_staleness_bound_exact),
        cmocka_unit_test(test_sync_fresh),
        cmocka_unit_test(test_remote_first_frames),
        cmocka_unit_test(test_hello_fields_exact),
        cmocka_unit_test(test_paced_eval_schedule),
        cmocka_unit_test(test_paced_drops_only_stale_groups),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
