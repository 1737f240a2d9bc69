/* The agent's loop: register, then poll; each poll is the heartbeat, carries
 * the members' states and output, and brings back the members the server
 * wants on this node (docs/agent-protocol.md). */
#include "agent_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int agent_detect_gpus(char *gpu_type, size_t cap, int *gpus)
{
    FILE *p = popen("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null", "r");
    if (!p) return sh_err(SH_ENOENT, "nvidia-smi: cannot run");
    char line[256];
    int n = 0;
    while (fgets(line, sizeof line, p)) {
        if (!n) {
            /* "NVIDIA H100 80GB HBM3" -> "H100": the first word with a digit. */
            char *tok = strtok(line, " \n");
            const char *pickw = tok;
            for (; tok; tok = strtok(NULL, " \n"))
                if (strpbrk(tok, "0123456789")) {
                    pickw = tok;
                    break;
                }
            snprintf(gpu_type, cap, "%s", pickw ? pickw : "GPU");
        }
        n++;
    }
    int st = pclose(p);
    if (st != 0 || n == 0) return sh_err(SH_ENOENT, "nvidia-smi is absent or lists no GPU");
    *gpus = n;
    return SH_OK;
}

/* What one character costs in a JSON string as jansson writes it: '"',
 * '\\' and the short escapes two bytes, other control characters six
 * (\u00XX), the rest themselves. */
static size_t json_cost(const uint8_t *c, int len)
{
    if (len > 1) return (size_t)len;
    if (*c == '"' || *c == '\\' || *c == '\b' || *c == '\f' || *c == '\n' || *c == '\r' || *c == '\t') return 2;
    return *c < 0x20 ? 6 : 1;
}

/* Copies bytes as UTF-8, replacing invalid sequences with '?', so that any
 * program output can travel in a JSON string; stops before the JSON text
 * would pass `budget` bytes.  With `more` (the member's pipe is open), a
 * character whose last bytes have not been read yet is left for the next
 * poll rather than sent as '?'s: a pipe read cuts output anywhere.  *used
 * gets the bytes of p it took, *cost the JSON text's length. */
static json_t *utf8_string(const uint8_t *p, size_t n, int more, size_t budget, size_t *used, size_t *cost_out)
{
    if (more) n -= sh_utf8_tail(p, n);
    char *o = malloc(n + 1);
    *used = *cost_out = 0;
    if (!o) return json_string("");
    size_t k = 0, cost = 0;
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = len > 0 && i + len <= n && c != 0;
        for (int j = 1; ok && j < len; j++) ok = (p[i + j] & 0xC0) == 0x80;
        if (!ok) len = 1;
        size_t add = ok ? json_cost(p + i, len) : 1;
        if (cost + add > budget) break;
        cost += add;
        if (ok) memcpy(o + k, p + i, (size_t)len);
        else o[k] = '?';
        k += (size_t)len;
        i += (size_t)len;
    }
    *used = i;
    *cost_out = cost;
    json_t *s = json_stringn(o, k);
    if (!s) { /* overlong forms or surrogates: fall back to ASCII */
        for (size_t x = 0; x < k; x++) if ((uint8_t)o[x] >= 0x80) o[x] = '?';
        s = json_stringn(o, k);
    }
    free(o);
    return s ? s : json_string("");
}

static int do_register(agent *a)
{
    json_t *b = json_pack("{s:s,s:s,s:i,s:s,s:s,s:s,s:f,s:s,s:b}", "name", a->cfg.name, "gpu_type",
                          a->gpu_type, "gpus", a->gpus, "zone", a->cfg.zone, "fabric", a->cfg.fabric,
                          "addr", a->cfg.addr, "price_per_gpu_hour", a->cfg.price, "sandbox",
                          a->sandbox, "from_provider", a->cfg.from_provider);
    int status = 0;
    json_t *reply = NULL;
    client_conn *join = NULL;
    int rc = client_new(a->cfg.server, a->cfg.token, &join);
    if (rc == SH_OK) rc = client_call(join, "POST", "/v1/agent/register", b, NULL, 10, &status, &reply);
    client_free(join);
    json_decref(b);
    if (rc == SH_OK && status != 200)
        rc = sh_err(status == 401 || status == 403 ? SH_EPERM : SH_EINVAL, "register node %s: HTTP %d: %s",
                    a->cfg.name, status, json_string_value(json_object_get(reply, "error")));
    const char *cred = json_string_value(json_object_get(reply, "credential"));
    if (rc == SH_OK && !cred)
        rc = sh_err(SH_EINVAL, "register node %s: the server issued no credential (an older server?)", a->cfg.name);
    /* Polls carry the node's own credential from now on (the join token
     * only registers). */
    if (rc == SH_OK) {
        client_free(a->cl);
        a->cl = NULL;
        rc = client_new(a->cfg.server, cred, &a->cl);
    }
    /* Output goes with each poll, within half the server's largest request
     * body: a poll the server refuses as too large would be sent again and
     * again, and the node would go dead for its members' output. */
    json_int_t body = json_integer_value(json_object_get(reply, "max_body"));
    a->log_budget = body > 0 ? (size_t)body / 2 : AGENT_LOG_BUDGET;
    a->nprotect = 0;
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(reply, "protect"), i, v)
        if (json_is_string(v) && a->nprotect < AGENT_MAX_PROTECT && json_string_length(v) < sizeof a->protect[0])
            snprintf(a->protect[a->nprotect++], sizeof a->protect[0], "%s", json_string_value(v));
    json_decref(reply);
    a->version = -1;
    return rc;
}

/* Reaps the cleaners that are done (all of them, waiting, with `all`). */
static void reap_cleaners(agent *a, int all)
{
    for (int i = a->ncleaners - 1; i >= 0; i--) {
        pid_t r;
        while ((r = waitpid(a->cleaners[i], NULL, all ? 0 : WNOHANG)) < 0 && errno == EINTR) {}
        if (r != 0) a->cleaners[i] = a->cleaners[--a->ncleaners];
    }
}

static agent_member *find(agent *a, int64_t job, int attempt, int rank)
{
    for (int i = 0; i < a->nm; i++)
        if (a->m[i].job == job && a->m[i].attempt == attempt && a->m[i].rank == rank) return &a->m[i];
    return NULL;
}

/* Reads what members wrote and reaps those that ended; returns 1 if
 * anything happened that the server should hear about at once. */
static void drain(agent_member *m)
{
    if (m->out_fd < 0) return;
    char buf[16384];
    ssize_t n = -1;
    while (m->log.len < (1 << 20) && (n = read(m->out_fd, buf, sizeof buf)) > 0)
        sh_buf_append(&m->log, buf, (size_t)n);
    if (n == 0) {
        close(m->out_fd);
        m->out_fd = -1;
    }
}

static int collect(agent *a, double now)
{
    int news = 0;
    reap_cleaners(a, 0);
    for (int i = 0; i < a->nm; i++) {
        agent_member *m = &a->m[i];
        drain(m);
        if (m->state == AM_EXITED) continue;
        agent__disk_check(a, m, now);
        if (m->stopping) agent__stop(a, m, now);
        int st;
        pid_t r = waitpid(m->pid, &st, WNOHANG);
        if (r == m->pid) {
            m->state = AM_EXITED;
            m->exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            m->ended_at = sh_now_wall();
            drain(m); /* what it wrote before exiting is in the pipe now */
            agent__disk_note_full(m);
            agent__limit_report(m);
            agent__cgroup_cleanup(m);
            news = 1;
        }
    }
    return news;
}

/* The members' states, and as much of their output as the poll's budget
 * holds (each member's m->sent bytes of it, dropped once the poll is
 * answered; the rest goes with the next polls). */
static json_t *reports(agent *a, json_t **logs)
{
    static const char *const names[] = {"ready", "running", "exited"};
    json_t *out = json_array();
    size_t budget = a->log_budget ? a->log_budget : AGENT_LOG_BUDGET;
    *logs = json_array();
    for (int i = 0; i < a->nm; i++) {
        agent_member *m = &a->m[i];
        json_t *r = json_pack("{s:I,s:i,s:i,s:s}", "job", (json_int_t)m->job, "attempt", m->attempt,
                              "rank", m->rank, "state", names[m->state]);
        if (m->disk_used) json_object_set_new(r, "disk_bytes", json_integer((json_int_t)m->disk_used));
        if (m->state == AM_EXITED) {
            json_object_set_new(r, "exit_code", json_integer(m->exit_code));
            if (m->ended_at > 0) json_object_set_new(r, "ended_at", json_real(m->ended_at));
            m->reported = 1;
        }
        json_array_append_new(out, r);
        m->sent = 0;
        if (!m->log.len || budget < 64) continue;
        size_t cost;
        json_t *data = utf8_string(m->log.data, m->log.len, m->out_fd >= 0, budget - 64, &m->sent, &cost);
        budget -= 64 + cost;
        json_array_append_new(*logs, json_pack("{s:I,s:i,s:i,s:o}", "job", (json_int_t)m->job, "attempt",
                                               m->attempt, "rank", m->rank, "data", data));
    }
    return out;
}

/* Removes a finished member's work directory in a child process, at low
 * priority: the removal (iterative, sh_rm_rf) of a tree of any depth or
 * size never holds the loop, so heartbeats go on while it runs. */
static void remove_async(agent *a, const agent_member *m)
{
    if (a->ncleaners == (int)(sizeof a->cleaners / sizeof a->cleaners[0])) reap_cleaners(a, 1);
    pid_t p = fork();
    if (p == 0) {
        setpriority(PRIO_PROCESS, 0, 10);
        agent__disk_unmount(m); /* its image, if any: the tree goes with it */
        if (sh_rm_rf(m->workdir) < 0) sh_warn("agent: %s", sh_errmsg());
        _exit(0);
    }
    if (p < 0) {
        agent__disk_unmount(m);
        sh_rm_rf(m->workdir);
    } else a->cleaners[a->ncleaners++] = p;
}

static void forget(agent *a, int i)
{
    agent_member *m = &a->m[i];
    if (m->out_fd >= 0) close(m->out_fd);
    if (m->barrier_fd >= 0) close(m->barrier_fd);
    if (m->exec_fd >= 0) close(m->exec_fd);
    sh_buf_free(&m->log);
    agent__cgroup_cleanup(m);
    agent__disk_abort(m);
    remove_async(a, m);
    if (a->mode == SB_GVISOR) agent__gvisor_cleanup(a, m);
    a->m[i] = a->m[--a->nm];
}

static void start_member(agent *a, const json_t *d, int64_t job, int attempt, int rank)
{
    if (a->nm == a->cap) {
        int cap = a->cap ? 2 * a->cap : 8;
        agent_member *nm = realloc(a->m, (size_t)cap * sizeof *nm);
        if (!nm) return;
        a->m = nm;
        a->cap = cap;
    }
    agent_member *m = &a->m[a->nm];
    memset(m, 0, sizeof *m);
    m->job = job;
    m->attempt = attempt;
    m->rank = rank;
    m->out_fd = m->barrier_fd = m->exec_fd = m->disk_fd = -1;
    /* ---- pyrl: what a rank needs to reach its run's services (SHOAL_RUN_TOKEN
     * from the server; docs/job-format.md): the server as this agent reaches it. */
    json_t *env = json_object_get(d, "env");
    if (json_is_object(env) && json_object_get(env, "SHOAL_RUN_TOKEN"))
        json_object_set_new(env, "SHOAL_SERVER", json_string(a->cfg.server));
    if (agent__disk_init(a, m, d) < 0 || agent__launch(a, m, d) < 0) {
        sh_warn("agent %s: job %lld rank %d: %s", a->cfg.name, (long long)job, rank, sh_errmsg());
        m->state = AM_EXITED;
        m->exit_code = 126;
        sh_buf_printf(&m->log, "shoal agent: cannot launch: %s\n", sh_errmsg());
    }
    a->nm++;
}

/* Makes the local members match the server's list; returns 1 when a state
 * changed that the server should hear about at once. */
static int apply(agent *a, const json_t *want)
{
    int news = 0;
    for (int i = 0; i < a->nm; i++) a->m[i].stopping = 1;
    size_t k;
    json_t *d;
    json_array_foreach(want, k, d) {
        int64_t job = json_integer_value(json_object_get(d, "job"));
        int attempt = (int)json_integer_value(json_object_get(d, "attempt"));
        int rank = (int)json_integer_value(json_object_get(d, "rank"));
        agent_member *m = find(a, job, attempt, rank);
        if (!m) {
            start_member(a, d, job, attempt, rank);
            m = &a->m[a->nm - 1];
            news = 1;
        }
        m->stopping = m->over; /* a member over a limit stays stopped (quota.c) */
        if (m->state == AM_READY && json_is_true(json_object_get(d, "go"))) {
            int e = agent__release(a, m);
            if (e) sh_buf_printf(&m->log, "shoal agent: cannot run the command: %s\n", strerror(e));
            news = 1;
        }
    }
    double now = sh_now_mono();
    for (int i = a->nm - 1; i >= 0; i--) {
        agent_member *m = &a->m[i];
        if (!m->stopping) continue;
        /* An exited member stays until the last of its output is sent. */
        if (m->state == AM_EXITED && ((m->reported && !m->log.len) || m->exit_code == 125)) forget(a, i);
        else if (m->state != AM_EXITED) agent__stop(a, m, now);
    }
    return news;
}

static int poll_once(agent *a, int wait_ms)
{
    json_t *logs, *mem = reports(a, &logs);
    json_t *b = json_pack("{s:s,s:I,s:i,s:o,s:o}", "node", a->cfg.name, "version", (json_int_t)a->version,
                          "wait_ms", wait_ms, "members", mem, "logs", logs);
    int status = 0;
    json_t *reply = NULL;
    int rc = client_call(a->cl, "POST", "/v1/agent/poll", b, NULL, 10 + wait_ms / 1000.0, &status, &reply);
    json_decref(b);
    if (rc < 0) return rc;
    if (status == 404 || status == 410 || status == 401) {
        json_decref(reply);
        /* Unknown node or credential (a server that lost its state, or an
         * admin who revoked it): register again. */
        return status != 410 ? SH_ENOENT : sh_err(SH_EEXIST, "node %s was removed from the fleet", a->cfg.name);
    }
    if (status != 200 || !reply) {
        rc = sh_err(SH_EIO, "poll: HTTP %d: %s", status, json_string_value(json_object_get(reply, "error")));
        json_decref(reply);
        return rc;
    }
    for (int i = 0; i < a->nm; i++) {
        agent_member *m = &a->m[i];
        if (m->sent) memmove(m->log.data, m->log.data + m->sent, m->log.len - m->sent);
        m->log.len -= m->sent;
        m->sent = 0;
    }
    a->version = json_integer_value(json_object_get(reply, "version"));
    int news = apply(a, json_object_get(reply, "members"));
    json_decref(reply);
    return news;
}

static int setup(agent *a, const agent_config *cfg)
{
    a->cfg = *cfg;
    if (!a->cfg.zone) a->cfg.zone = "local";
    if (!a->cfg.fabric) a->cfg.fabric = "tcp";
    if (!a->cfg.addr) a->cfg.addr = "127.0.0.1";
    if (!a->cfg.work_dir) a->cfg.work_dir = "/tmp/shoal-agent";
    if (!a->cfg.sandbox) a->cfg.sandbox = "auto";
    if (a->cfg.grace_s <= 0) a->cfg.grace_s = 2;
    if (!a->cfg.name || !*a->cfg.name) return sh_err(SH_EINVAL, "agent: a node name is required (--name)");
    a->pid = getpid();
    a->gpus = cfg->gpus;
    snprintf(a->gpu_type, sizeof a->gpu_type, "%s", cfg->gpu_type ? cfg->gpu_type : "");
    if (!cfg->gpu_type || cfg->gpus < 0) {
        char t[64];
        int n = 0;
        if (agent_detect_gpus(t, sizeof t, &n) < 0)
            return sh_err(SH_EINVAL, "agent %s: no nvidia-smi here: declare the GPUs with --gpu-type and --gpus",
                          a->cfg.name);
        if (!cfg->gpu_type) snprintf(a->gpu_type, sizeof a->gpu_type, "%s", t);
        if (cfg->gpus < 0) a->gpus = n;
    }
    /* A new work root is private: members reach their own directory through
     * the jail's binds, never by walking the root. */
    SH_TRY(sh_mkdir_p(a->cfg.work_dir, 0700));
    /* Members chdir and bind-mount it: it must be absolute. */
    if (!realpath(a->cfg.work_dir, a->work_abs)) return sh_err_errno(errno, "agent: work dir %s", a->cfg.work_dir);
    a->cfg.work_dir = a->work_abs;
    int b = agent_probe_sandbox(a->cfg.sandbox, a->sandbox, sizeof a->sandbox);
    if (b < 0) return b;
    a->mode = b;
    static const char *const ctl[3] = {"memory", "pids", "cpu"};
    for (int k = 0; k < 3; k++) {
        agent__cgroup_root(ctl[k], a->cg_root[k], sizeof a->cg_root[k]);
        agent__cgroup_sweep(a->cg_root[k]);
    }
    agent__disk_probe(a);
    a->ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    /* A /proc file's size reads as 0: read it as a stream. */
    FILE *fm = fopen("/proc/sys/fs/file-max", "r");
    unsigned long long fmax = 0;
    if (fm && fscanf(fm, "%llu", &fmax) != 1) fmax = 0;
    if (fm) fclose(fm);
    a->file_max = fmax;
    if (a->file_max < 65536 || a->file_max > (1ull << 40)) a->file_max = a->file_max < 65536 ? 65536 : 1ull << 40;
    a->mem_mb = (long long)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE) >> 20;
    if (a->ncpu < 1) a->ncpu = 1;
    return SH_OK;
}

int agent_run(const agent_config *cfg, volatile sig_atomic_t *stop)
{
    agent a = {0};
    int rc = setup(&a, cfg);
    if (rc < 0) {
        client_free(a.cl);
        return rc;
    }
    sh_info("agent %s: %d x %s, sandbox %s", a.cfg.name, a.gpus, a.gpu_type, a.sandbox);
    if (a.mke2fs[0])
        sh_info("agent %s: work directories are file systems of each rank's disk share (loop-mounted ext4 images,"
                " kernel-enforced)", a.cfg.name);
    else
        sh_warn("agent %s: work directories are measured every %.1f s, not kernel-enforced (a fast writer can pass"
                " its disk share between two looks): no loop-mounted images because %s", a.cfg.name,
                AGENT_DISK_EVERY, a.loop_why);
    int registered = 0, news = 1, unreachable = 0;
    double backoff = 0.05;
    while (!*stop) {
        if (!registered) {
            rc = do_register(&a);
            if (rc == SH_EPERM || rc == SH_EINVAL) break; /* retrying cannot help */
            if (rc < 0) {
                /* Once per outage, so that an agent pointed at the wrong
                 * server does not wait in silence. */
                if (!unreachable++) sh_warn("agent %s: cannot register: %s; retrying", a.cfg.name, sh_errmsg());
                sh_sleep(backoff);
                backoff = backoff < 1 ? backoff * 2 : 1;
                continue;
            }
            if (unreachable) sh_warn("agent %s: registered after %d tries", a.cfg.name, unreachable + 1);
            registered = 1;
            unreachable = 0;
            backoff = 0.05;
        }
        news |= collect(&a, sh_now_mono());
        int any_live = 0;
        for (int i = 0; i < a.nm; i++) any_live |= a.m[i].state != AM_EXITED || a.m[i].out_fd >= 0;
        int r = poll_once(&a, news ? 0 : any_live ? 100 : 250);
        if (r == SH_ENOENT) registered = 0;
        else if (r == SH_EEXIST) {
            sh_info("agent %s: %s; stopping", a.cfg.name, sh_errmsg());
            break; /* removed (scaled down): stop, do not register again */
        }
        else if (r < 0) {
            /* The server is down or restarting: keep the members running and
             * retry; they are reconciled when it answers again. */
            sh_debug("agent %s: %s", a.cfg.name, sh_errmsg());
            sh_sleep(backoff);
            backoff = backoff < 0.5 ? backoff * 2 : 0.5;
            news = 1;
            continue;
        } else backoff = 0.05;
        news = r > 0;
    }
    /* Stopping the agent stops its members: they must not outlive the node's
     * heartbeat, or the server would run them twice. */
    double until = sh_now_mono() + a.cfg.grace_s + 1;
    for (;;) {
        int live = 0;
        for (int i = 0; i < a.nm; i++) {
            a.m[i].stopping = 1;
            live |= a.m[i].state != AM_EXITED;
        }
        if (!live || sh_now_mono() > until) break;
        collect(&a, sh_now_mono());
        sh_sleep(0.02);
    }
    while (a.nm) forget(&a, a.nm - 1);
    reap_cleaners(&a, 1);
    free(a.m);
    client_free(a.cl);
    return rc == SH_EPERM || rc == SH_EINVAL ? rc : SH_OK;
}
