/* The agents' side of the API: registration, polls and logs
 * (docs/agent-protocol.md).  All functions run with srv.mu held. */
#include "srv_int.h"
#include "db_int.h"
#include "seam_int.h"
#include "state_int.h"
#include "files_int.h"
#include "handlers_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const reg_keys[] = {"name",   "gpu_type", "gpus",    "zone",          "fabric",
                                       "addr",   "price_per_gpu_hour",  "sandbox", "from_provider",
                                       NULL};

static int copy_str(const json_t *b, const char *key, int req, char *dst, size_t cap, const char *def)
{
    const char *v = def;
    SH_TRY(sh_json_get_str(b, key, req, "register", &v));
    if (strlen(v) >= cap) return sh_err(SH_EFORMAT, "register: field \"%s\": longer than %zu", key, cap - 1);
    /* Shown on the admin's terminal (shoal nodes, shoal job): a node's
     * text must not drive it. */
    if (sh_control_at(v) >= 0)
        return sh_err(SH_EFORMAT, "register: field \"%s\": holds a control character at byte %ld; use printable"
                                  " text", key, sh_control_at(v));
    snprintf(dst, cap, "%s", v);
    return SH_OK;
}

static int node_slot(srv *s)
{
    if (s->nnodes == s->cap_nodes) {
        int cap = s->cap_nodes ? 2 * s->cap_nodes : 64;
        srv_node *nn = realloc(s->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return sh_err(SH_ENOMEM, "node table");
        s->nodes = nn;
        s->cap_nodes = cap;
    }
    memset(&s->nodes[s->nnodes], 0, sizeof s->nodes[0]);
    return s->nnodes++;
}

/* A fresh credential: 20 random bytes as hex. */
static int new_credential(char *out, size_t cap)
{
    unsigned char r[20];
    if (cap < 2 * sizeof r + 1) return sh_err(SH_EINTERNAL, "credential buffer");
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) return sh_err_errno(errno, "getrandom");
    for (size_t i = 0; i < sizeof r; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
    return SH_OK;
}

int srv__agent_register(srv *s, json_t *b, json_t **reply)
{
    SH_TRY(sh_json_check_keys(b, reg_keys, "register"));
    srv_node n = {0};
    int64_t gpus = 0;
    int prov = 0;
    SH_TRY(copy_str(b, "name", 1, n.name, sizeof n.name, ""));
    if (!n.name[0] || strchr(n.name, '/')) return sh_err(SH_EFORMAT, "register: field \"name\": empty or has '/'");
    SH_TRY(copy_str(b, "gpu_type", 1, n.gpu_type, sizeof n.gpu_type, ""));
    SH_TRY(copy_str(b, "zone", 0, n.zone, sizeof n.zone, "local"));
    SH_TRY(copy_str(b, "fabric", 0, n.fabric, sizeof n.fabric, "tcp"));
    SH_TRY(copy_str(b, "addr", 0, n.addr, sizeof n.addr, "127.0.0.1"));
    SH_TRY(copy_str(b, "sandbox", 0, n.sandbox, sizeof n.sandbox, "none"));
    SH_TRY(sh_json_get_i64(b, "gpus", 1, "register", &gpus));
    SH_TRY(sh_json_get_num(b, "price_per_gpu_hour", 0, "register", &n.price));
    SH_TRY(sh_json_get_bool(b, "from_provider", 0, "register", &prov));
    if (gpus < 0 || gpus > 64) return sh_err(SH_ERANGE, "register: field \"gpus\": %lld is outside 0..64", (long long)gpus);
    if (n.price < 0) return sh_err(SH_ERANGE, "register: field \"price_per_gpu_hour\": negative");
    n.gpus = (int)gpus;
    n.from_provider = prov;
    int idx = srv__node_find(s, n.name);
    if (idx >= 0 && s->nodes[idx].state == NODE_ALIVE) {
        /* A node that registers again has a fresh agent: whatever ran under
         * the old one died with it (agents launch with PDEATHSIG). */
        SH_TRY(srv__node_dead(s, idx, "its agent restarted"));
    }
    if (idx < 0) idx = node_slot(s);
    if (idx < 0) return idx;
    /* The node gets its credential once, in this reply; the server keeps
     * its hash. */
    char cred[48];
    SH_TRY(new_credential(cred, sizeof cred));
    srv__secret_hash(cred, n.cred);
    srv_node *d = &s->nodes[idx];
    n.version = d->version + 1;
    n.state = NODE_ALIVE;
    n.last_seen = sh_now_mono();
    *d = n;
    SH_TRY(srv__seam_node(s, idx, SEAM_UP));
    SH_TRY(srv__db_node(s, d));
    SH_TRY(srv__db_event(s, 0, d->name, "node_registered", "%d x %s in %s/%s, $%.2f/GPU-hour, sandbox %s",
                         d->gpus, d->gpu_type, d->zone, d->fabric, d->price, d->sandbox));
    srv__changed(s);
    /* "protect": paths the agent hides from members (the server's state
     * directory, for agents on this host). */
    *reply = json_pack("{s:s,s:s,s:f,s:i,s:[s],s:I}", "node", d->name, "credential", cred, "heartbeat_timeout",
                       s->cfg.heartbeat_timeout, "poll_wait_ms", 250, "protect", s->state_dir, "max_body",
                       (json_int_t)s->cfg.max_body);
    return SH_OK;
}

/* Bytes of tenant's rank logs on disk, from the files: every rank of each
 * of its jobs (a job's ranks are at most its "nodes"). */
static uint64_t tenant_log_count(srv *s, const char *tenant)
{
    uint64_t n = 0;
    for (int64_t id = 1; id <= s->njobs; id++) {
        const srv_job *j = s->jobs[id];
        if (!j || strcmp(j->tenant, tenant)) continue;
        for (int r = 0; r < j->nodes && r < 64; r++) {
            char path[4200];
            struct stat st;
            snprintf(path, sizeof path, "%s/logs/%lld/%d.log", s->dir, (long long)id, r);
            if (stat(path, &st) == 0) n += (uint64_t)st.st_size;
        }
    }
    return n;
}

/* The count of tenant's logs (NULL without memory: its budget is then not
 * enforced, the rank's limit still is). */
static srv_tlog *tenant_log(srv *s, const char *tenant)
{
    for (int i = 0; i < s->ntlog; i++)
        if (!strcmp(s->tlog[i].tenant, tenant)) return &s->tlog[i];
    if (s->ntlog == s->cap_tlog) {
        int cap = s->cap_tlog ? 2 * s->cap_tlog : 16;
        srv_tlog *t = realloc(s->tlog, (size_t)cap * sizeof *t);
        if (!t) return NULL;
        s->tlog = t;
        s->cap_tlog = cap;
    }
    srv_tlog *t = &s->tlog[s->ntlog++];
    snprintf(t->tenant, sizeof t->tenant, "%s", tenant);
    t->bytes = tenant_log_count(s, tenant);
    t->counted = sh_now_mono();
    return t;
}

/* Appends to rank's log; the first append by this process repairs the file.
 * Logs are best effort: the job's state is what must not tear.
 *
 * The logs share a disk with the database, and output without end must
 * not fill it (the server would then refuse every change).  So a log file
 * stops growing at max_log bytes on disk, and all of one tenant's logs
 * together at max_tenant_log: many ranks, each under its own limit, would
 * fill the disk as well.  The append that reaches a limit keeps what fits,
 * cut at a character, and says so in the log (and, for the tenant's, in an
 * event of the job); later output is dropped. */
/* Keeps the last bytes of a member's output in memory (srv_member.tail). */
static void tail_keep(srv_member *m, const char *data, size_t len)
{
    const size_t cap = sizeof m->tail;
    if (len >= cap) {
        memcpy(m->tail, data + len - cap, cap);
        m->tail_len = (int)cap;
        return;
    }
    size_t keep = (size_t)m->tail_len + len > cap ? cap - len : (size_t)m->tail_len;
    memmove(m->tail, m->tail + m->tail_len - keep, keep);
    memcpy(m->tail + keep, data, len);
    m->tail_len = (int)(keep + len);
}

static void log_append(srv *s, srv_job *j, int rank, const char *data, size_t len)
{
    char path[4200], note[300];
    if (rank < 0 || rank >= 64 || srv__log_path(s, j->id, rank, path, sizeof path) < 0) return;
    struct stat st;
    uint64_t size = stat(path, &st) == 0 ? (uint64_t)st.st_size : 0, cap = s->cfg.max_log;
    if (size >= cap) return; /* full: the note was written when it filled */
    srv_tlog *t = tenant_log(s, j->tenant);
    uint64_t tcap = s->cfg.max_tenant_log;
    if (t && t->bytes + len > tcap && sh_now_mono() - t->counted >= SRV_TLOG_RECOUNT_S) {
        t->bytes = tenant_log_count(s, j->tenant); /* old logs may have been removed */
        t->counted = sh_now_mono();
    }
    uint64_t room = cap - size, troom = !t ? UINT64_MAX : t->bytes < tcap ? tcap - t->bytes : 0;
    uint64_t bit = 1ull << rank;
    if (troom == 0 && (j->log_tenant_full & bit)) return;
    int full = len > room ? 1 : 0;
    if (len > troom) full = 2;
    if (full) {
        len = (size_t)(full == 1 ? room : troom);
        while (len > 0 && ((unsigned char)data[len] & 0xC0) == 0x80) len--; /* not inside a character */
    }
    int repair = !(j->log_checked & bit);
    int rc = len ? srv__log_append(path, data, len, repair) : SH_OK;
    if (rc == SH_OK && full == 1) {
        int n = snprintf(note, sizeof note, "\nshoal: this rank's log reached the server's limit of %llu bytes;"
                                            " later output is dropped\n", (unsigned long long)cap);
        rc = srv__log_append(path, note, (size_t)n, repair && !len);
    } else if (rc == SH_OK && full == 2) {
        int n = snprintf(note, sizeof note, "\nshoal: the logs of tenant %s reached the server's limit of %llu bytes"
                                            " for one tenant (--max-tenant-log); later output of its ranks is"
                                            " dropped\n", j->tenant, (unsigned long long)tcap);
        rc = srv__log_append(path, note, (size_t)n, repair && !len);
        if (rc == SH_OK && !j->log_tenant_full &&
            srv__db_event(s, j->id, NULL, "log_budget", "the logs of tenant %s reached the server's limit of %llu"
                          " bytes (--max-tenant-log): output of its ranks is dropped", j->tenant,
                          (unsigned long long)tcap) < 0)
            sh_warn("job %lld: event: %s", (long long)j->id, sh_errmsg());
        if (rc == SH_OK) j->log_tenant_full |= bit;
    }
    if (t && stat(path, &st) == 0 && (uint64_t)st.st_size > size) t->bytes += (uint64_t)st.st_size - size;
    if (rc < 0) {
        sh_warn("job %lld rank %d: log: %s", (long long)j->id, rank, sh_errmsg());
        return;
    }
    j->log_checked |= bit;
    if (rank < j->nmem) tail_keep(&j->mem[rank], data, len);
}

static void log_note(srv *s, srv_job *j, int rank, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0) log_append(s, j, rank, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* A node spoke for a member placed elsewhere: refuse the whole poll and
 * keep the attempt on record (outside the poll's transaction, which is
 * rolled back). */
static int forged(srv *s, int idx, const srv_job *j, int rank, const char *what)
{
    sh_warn("node %s sent %s for job %lld rank %d, which runs on node %s: refused", s->nodes[idx].name, what,
            (long long)j->id, rank, s->nodes[j->mem[rank].node].name);
    s->forged_job = j->id;
    snprintf(s->forged_msg, sizeof s->forged_msg, "node %s sent %s for rank %d, placed on node %s: refused",
             s->nodes[idx].name, what, rank, s->nodes[j->mem[rank].node].name);
    return sh_err(SH_EPERM, "poll: node %s may only report its own members; job %lld rank %d is not on it",
                  s->nodes[idx].name, (long long)j->id, rank);
}

/* Applies one member report from node idx. */
static int apply_report(srv *s, int idx, const json_t *r)
{
    int64_t id = 0, attempt = 0, rank = -1, code = -1, disk = 0;
    double ended = 0;
    const char *st = "";
    SH_TRY(sh_json_get_i64(r, "job", 1, "poll: member", &id));
    SH_TRY(sh_json_get_i64(r, "attempt", 1, "poll: member", &attempt));
    SH_TRY(sh_json_get_i64(r, "rank", 1, "poll: member", &rank));
    SH_TRY(sh_json_get_str(r, "state", 1, "poll: member", &st));
    SH_TRY(sh_json_get_i64(r, "exit_code", 0, "poll: member", &code));
    SH_TRY(sh_json_get_i64(r, "disk_bytes", 0, "poll: member", &disk));
    SH_TRY(sh_json_get_num(r, "ended_at", 0, "poll: member", &ended));
    srv_job *j = srv__job(s, id);
    /* Reports about members the server no longer wants are stale: the
     * desired list in the reply tells the agent to stop them. */
    if (!j || j->attempt != attempt || rank < 0 || rank >= j->nmem || j->state > J_RUNNING) return SH_OK;
    srv_member *m = &j->mem[rank];
    if (m->node != idx) return forged(s, idx, j, (int)rank, "a report");
    if (disk > 0) m->disk_bytes = disk;
    if (m->state > M_RUNNING) return SH_OK;
    if (!strcmp(st, "ready") && m->state == M_ASSIGNED) m->state = M_READY;
    else if (!strcmp(st, "running") && m->state < M_RUNNING) {
        m->state = M_RUNNING;
        m->t_start = sh_now_wall();
        log_note(s, j, (int)rank, "--- attempt %d on node %s ---\n", j->attempt, s->nodes[idx].name);
    } else if (!strcmp(st, "exited")) {
        if (m->state < M_RUNNING) m->t_start = 0;
        SH_TRY(srv__member_end(s, j, m, M_EXITED, (int)code));
        /* The agent's clock orders failures (first_failed); a time far
         * from the server's is ignored. */
        m->t_exit = ended > m->t_end - 600 && ended < m->t_end + 600 ? ended : 0;
        SH_TRY(srv__db_event(s, id, s->nodes[idx].name, "exited", "rank %d exited with status %d",
                             (int)rank, (int)code));
    } else return SH_OK;
    return srv__db_members(s, j); /* srv__agent_poll evaluates the job after the poll's output */
}

int srv__log_path(srv *s, int64_t job, int rank, char *out, size_t cap)
{
    char d[4200];
    snprintf(d, sizeof d, "%s/logs/%lld", s->dir, (long long)job);
    SH_TRY(sh_mkdir_p(d, 0700));
    if ((size_t)snprintf(out, cap, "%s/%d.log", d, rank) >= cap) return sh_err(SH_ERANGE, "log path too long");
    return SH_OK;
}

/* Whether member m of j may still take output from its node: while it
 * lives, and for log_drain seconds after it ended, the time its agent has
 * to send what the rank wrote last.  Past that its log is closed: a node
 * credential can no longer write into the logs of every job that once ran
 * on the node. */
static int output_open(srv *s, const srv_job *j, const srv_member *m)
{
    if (j->state >= J_STARTING && j->state <= J_RUNNING && m->state <= M_RUNNING) return 1;
    double drain = s->cfg.log_drain_s > 0 ? s->cfg.log_drain_s : SRV_LOG_DRAIN;
    return m->t_end > 0 && sh_now_wall() - m->t_end <= drain;
}

/* Appends the output of the node's own members of current attempts;
 * output for a member placed elsewhere is a forgery.  Output for one of
 * its own members whose log has closed is dropped, not refused: an agent
 * that fell behind must not have every later poll refused for it. */
static int apply_logs(srv *s, int idx, const json_t *logs)
{
    size_t i;
    json_t *c;
    json_array_foreach(logs, i, c) {
        int64_t id = 0, rank = 0, attempt = -1;
        const char *data = NULL;
        if (sh_json_get_i64(c, "job", 1, "log", &id) || sh_json_get_i64(c, "rank", 1, "log", &rank) ||
            sh_json_get_i64(c, "attempt", 0, "log", &attempt) || sh_json_get_str(c, "data", 1, "log", &data))
            return sh_err(SH_EFORMAT, "poll: logs[%zu]: %s", i, sh_errmsg());
        srv_job *j = srv__job(s, id);
        if (!j || rank < 0 || rank >= j->nmem || (attempt >= 0 && attempt != j->attempt)) continue; /* stale */
        if (j->mem[rank].node != idx) return forged(s, idx, j, (int)rank, "output");
        if (!output_open(s, j, &j->mem[rank])) {
            sh_warn("node %s sent output for job %lld rank %d, which ended %.0f s ago: dropped", s->nodes[idx].name,
                    (long long)j->id, (int)rank, sh_now_wall() - j->mem[rank].t_end);
            continue;
        }
        size_t len = json_string_length(json_object_get(c, "data"));
        if (len) log_append(s, j, (int)rank, data, len);
    }
    return SH_OK;
}

/* The rendezvous port (MASTER_PORT) of j's current attempt: the first port
 * from a (job, attempt) hash in 20000..32767 that no other active job holds,
 * so that no two running attempts share one.  The range ends below Linux's
 * default ephemeral ports (32768-60999): a port there can be held by any
 * outgoing connection on the node, and torchrun's rank 0 then cannot bind
 * it (seen in test_torchrun).  Chosen once per attempt; a restarted server
 * chooses again for the attempts it restores. */
#define RDZV_LO 20000
#define RDZV_N 12768
static int rdzv_port(srv *s, srv_job *j)
{
    if (j->rdzv_port) return j->rdzv_port;
    int p = (int)(((uint64_t)j->id * 7919u + (uint64_t)j->attempt * 104729u) % RDZV_N);
    for (int tries = 0; tries < RDZV_N; tries++, p = (p + 1) % RDZV_N) {
        int taken = 0;
        for (int64_t a = 0; a < s->nactive && !taken; a++) {
            const srv_job *k = srv__job(s, s->active[a]);
            taken = k && k != j && k->rdzv_port == RDZV_LO + p;
        }
        if (!taken) break;
    }
    return j->rdzv_port = RDZV_LO + p;
}

static json_t *member_env(srv *s, srv_job *j, const srv_member *m)
{
    json_t *env = json_object();
    json_t *user = json_object_get(j->spec, "env");
    if (user) json_object_update(env, user);
    char b[64];
    int port = rdzv_port(s, j);
#define SETI(k, v) (snprintf(b, sizeof b, "%lld", (long long)(v)), json_object_set_new(env, k, json_string(b)))
    SETI("SHOAL_JOB_ID", j->id);
    SETI("SHOAL_RANK", m->rank);
    SETI("SHOAL_WORLD_SIZE", j->nmem);
    SETI("SHOAL_ATTEMPT", j->attempt);
    SETI("WORLD_SIZE", j->nmem);
    SETI("RANK", m->rank);
    SETI("NODE_RANK", m->rank);
    SETI("LOCAL_RANK", 0);
    SETI("LOCAL_WORLD_SIZE", 1);
    SETI("MASTER_PORT", port);
    /* torchrun's node-level arguments, so that a plain `torchrun train.py`
     * starts one process per GPU on every node (docs/job-format.md). */
    int nproc = j->gpus_per_node > 0 ? j->gpus_per_node : 1;
    SETI("NNODES", j->nmem);
    SETI("NPROC_PER_NODE", nproc);
    SETI("PET_NNODES", j->nmem);
    SETI("PET_NODE_RANK", m->rank);
    SETI("PET_NPROC_PER_NODE", nproc);
    SETI("PET_MASTER_PORT", port);
#undef SETI
    json_object_set_new(env, "SHOAL_JOB_NAME", json_string(j->name));
    json_object_set_new(env, "SHOAL_TENANT", json_string(j->tenant));
    json_object_set_new(env, "SHOAL_NODE", json_string(s->nodes[m->node].name));
    json_object_set_new(env, "MASTER_ADDR", json_string(s->nodes[j->mem[0].node].addr));
    json_object_set_new(env, "PET_MASTER_ADDR", json_string(s->nodes[j->mem[0].node].addr));
    sh_buf g = {0};
    for (int i = 0; i < 64; i++)
        if (m->gpu_mask & (1ull << i)) sh_buf_printf(&g, "%s%d", g.len ? "," : "", i);
    json_object_set_new(env, "CUDA_VISIBLE_DEVICES", json_string(g.data ? (char *)g.data : ""));
    sh_buf_free(&g);
    /* Debian 12's torch 1.13 torchrun cannot parse its own default
     * `--redirects 0` (AttributeError on NoneType): these make a plain
     * `torchrun train.py` start there; newer PyTorch reads them as asked
     * (workers' output prefixed "[default0]:").  A job's env may override. */
    srv__run_env(s, j, env); /* SHOAL_RUN, SHOAL_RUN_SECRET, SHOAL_RUN_TOKEN (runs.c) */
    static const char *const torch13[][2] = {{"PET_REDIRECTS", "1"}, {"PET_TEE", "1"}};
    for (int k = 0; k < 2; k++)
        if (!json_object_get(user, torch13[k][0])) json_object_set_new(env, torch13[k][0], json_string(torch13[k][1]));
    return env;
}

/* The members node idx should be running now (docs/agent-protocol.md). */
static json_t *desired(srv *s, int idx)
{
    json_t *out = json_array();
    for (int64_t a = 0; a < s->nactive; a++) {
        srv_job *j = srv__job(s, s->active[a]);
        if (!j || j->state < J_STARTING || j->state > J_RUNNING) continue;
        for (int i = 0; i < j->nmem; i++) {
            const srv_member *m = &j->mem[i];
            if (m->node != idx || m->state > M_RUNNING) continue;
            json_t *d = json_pack("{s:I,s:i,s:i,s:i,s:b,s:O,s:o,s:s}", "job", (json_int_t)j->id,
                                  "attempt", j->attempt, "rank", m->rank, "world", j->nmem, "go",
                                  j->go, "command", json_object_get(j->spec, "command"), "env",
                                  member_env(s, j, m), "name", j->name);
            /* The tenant's number: the agent runs the member as a uid of
             * its own, the same for all of one tenant's members. */
            json_object_set_new(d, "uid", json_integer(json_integer_value(json_object_get(s->tenant_num, j->tenant))));
            json_object_set_new(d, "gpus", json_integer(j->gpus_per_node));
            const char *extra[] = {"writable", "memory_mb", "pids_max", "disk_mb", "workdir"};
            for (int k = 0; k < 5; k++) {
                json_t *v = json_object_get(j->spec, extra[k]);
                if (v) json_object_set(d, extra[k], v);
            }
            json_array_append_new(out, d);
        }
    }
    return out;
}

static const char *const poll_keys[] = {"node", "members", "logs", "version", "wait_ms", NULL};

int srv__agent_poll(srv *s, int idx, json_t *b, json_t **reply)
{
    SH_TRY(sh_json_check_keys(b, poll_keys, "poll"));
    const char *name = "";
    int64_t version = -1, wait_ms = 0;
    SH_TRY(sh_json_get_str(b, "node", 1, "poll", &name));
    SH_TRY(sh_json_get_i64(b, "version", 0, "poll", &version));
    SH_TRY(sh_json_get_i64(b, "wait_ms", 0, "poll", &wait_ms));
    if (idx < 0 || idx >= s->nnodes) return sh_err(SH_ENOENT, "node \"%s\" is not registered; register it first", name);
    if (strcmp(name, s->nodes[idx].name)) {
        sh_warn("the credential of node %s polled as node \"%s\": refused", s->nodes[idx].name, name);
        SH_TRY(srv__db_event(s, 0, s->nodes[idx].name, "refused", "its credential was used to poll as node \"%s\"", name));
        return sh_err(SH_EPERM, "poll: this credential belongs to node %s, not \"%s\"", s->nodes[idx].name, name);
    }
    if (s->nodes[idx].state == NODE_GONE)
        return sh_err(SH_EEXIST, "node \"%s\" was removed from the fleet; its agent should stop", name);
    srv_node *n = &s->nodes[idx];
    n->last_seen = sh_now_mono();
    s->polls++;
    SH_TRY(srv__db_begin(s));
    srv_undo u;
    srv__undo_begin(s, &u);
    int rc = srv__undo_node(s, &u, idx);
    json_t *mem = json_object_get(b, "members");
    size_t i;
    json_t *r;
    json_array_foreach(mem, i, r) {
        srv_job *j = srv__job(s, json_integer_value(json_object_get(r, "job")));
        if (rc == SH_OK && j) rc = srv__undo_job(s, &u, j);
    }
    if (rc == SH_OK && n->state == NODE_DEAD) {
        n->state = NODE_ALIVE;
        n->version++;
        rc = srv__seam_node(s, idx, SEAM_UP);
        if (rc == SH_OK) rc = srv__db_node(s, n);
        if (rc == SH_OK) rc = srv__db_event(s, 0, n->name, "node_recovered", "polled again");
        srv__changed(s);
    }
    s->forged_job = 0;
    json_array_foreach(mem, i, r) if (rc == SH_OK) rc = apply_report(s, idx, r);
    json_t *logs = json_object_get(b, "logs");
    if (rc == SH_OK && json_is_array(logs)) rc = apply_logs(s, idx, logs);
    /* After the output, so that a failure's reason holds its last lines. */
    json_array_foreach(mem, i, r) {
        srv_job *j = srv__job(s, json_integer_value(json_object_get(r, "job")));
        if (rc == SH_OK && j) rc = srv__job_eval(s, j);
    }
    if (rc == SH_OK) rc = srv__seam_prebill(s);
    if (rc == SH_OK) rc = srv__commit(s);
    if (rc < 0) srv__rollback(s);
    srv__undo_end(s, &u, rc == SH_OK);
    if (s->forged_job) {
        int e = srv__db_event(s, s->forged_job, n->name, "refused", "%s", s->forged_msg);
        if (e < 0) sh_warn("event: %s", sh_errmsg());
        s->forged_job = 0;
    }
    SH_TRY(rc);
    /* Long poll: hold the reply until this node's desired list changes, so
     * that an assignment or an opened barrier reaches the agent at once. */
    if (wait_ms > 0 && (uint64_t)version == n->version) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double until = ts.tv_sec + ts.tv_nsec * 1e-9 + (wait_ms > 5000 ? 5000 : wait_ms) / 1000.0;
        ts.tv_sec = (time_t)until;
        ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
        while (!s->stopping && !s->failed[0] && (uint64_t)version == s->nodes[idx].version)
            if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT) break;
        if (s->failed[0]) return sh_err(SH_EIO, "%s", s->failed); /* the state is gone */
        n = &s->nodes[idx]; /* the table may have moved while we waited */
        n->last_seen = sh_now_mono();
    }
    *reply = json_pack("{s:I,s:o}", "version", (json_int_t)n->version, "members", desired(s, idx));
    return SH_OK;
}
