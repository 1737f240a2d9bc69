/* The main job, end to end (`shoal run`, `make run`; docs/mainjob.md): a
 * local mixed fleet started through the library (include/shoal/fleet.h);
 * the RL trainer as a 2-node H100 gang, the rollout workers as an elastic
 * job the scheduler grows by price per unit of throughput, and the push
 * tree's root as a rank of its own, all three jobs of the control plane;
 * live progress and billing while they run; then the fleet-cost
 * experiment, the report and its summary.  Everything it started is stopped
 * before it returns; when a job fails it stops at once with the job's
 * reason and its failed ranks' last log lines. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "shoal/fleet.h"
#include "shoal/net.h"
#include "run_int.h"

static void say(const mj_run_opts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const mj_run_opts *o, const char *fmt, ...)
{
    if (!o->say) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->say(o->arg, line);
}

/* A port another process listens on (a second `make run`?) stops this one
 * before it touches the run folder, which may be the other run's. */
static int port_free(const mj_run_opts *o)
{
    if (!o->port) return 0;
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (s < 0) return sh_err_errno(errno, "socket");
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = bind(s, (struct sockaddr *)&a, sizeof a);
    close(s);
    if (rc == 0) return 0;
    return sh_err(SH_EEXIST, "port %d is in use (another make run?): --port P (SHOAL_RUN_PORT=P) picks another port, "
                             "and --dir DIR (SHOAL_RUN_DIR=DIR) another folder than %s", o->port, o->dir);
}

static int copy_file(const char *from, const char *to, unsigned mode)
{
    char *data = NULL;
    size_t len = 0;
    SH_TRY(sh_read_file(from, (size_t)1 << 31, &data, &len));
    int rc = sh_write_atomic_mode(to, data, len, mode);
    free(data);
    return rc;
}

/* Everything the ranks run or read lives in the run folder, wherever the
 * source tree is: the binaries (the client and shoal-core beside it) and
 * the fleet's files. */
static int prepare(const mj_run_opts *o, mj_run_paths *p)
{
    if (!strncmp(o->dir, "/tmp/", 5) || !strcmp(o->dir, "/tmp"))
        return sh_err(SH_EINVAL, "run folder %s: must be outside /tmp (ranks get a private /tmp)", o->dir);
    SH_TRY(port_free(o));
    /* Every GPU type of the fleet needs a speed: the rollouts' job file and
     * the workers read them.  Checked before anything starts. */
    mj_fleet f;
    SH_TRY(mj_fleet_load(o->fleet, o->speeds, &f));
    mj_fleet_free(&f);
    char core[4200];
    const char *slash = strrchr(o->bin, '/');
    if (o->core) snprintf(core, sizeof core, "%s", o->core);
    else snprintf(core, sizeof core, "%.*s/shoal-core", slash ? (int)(slash - o->bin) : 1, slash ? o->bin : ".");
    *p = (mj_run_paths){.steps = o->steps, .direct = o->direct};
    snprintf(p->dir, sizeof p->dir, "%s", o->dir);
    snprintf(p->bin, sizeof p->bin, "%s/bin/shoal", o->dir);
    snprintf(p->store, sizeof p->store, "%s/store", o->dir);
    snprintf(p->pdir, sizeof p->pdir, "%s/push", o->dir);
    snprintf(p->fleet, sizeof p->fleet, "%s/fleet.csv", o->dir);
    snprintf(p->speeds, sizeof p->speeds, "%s/speeds.csv", o->dir);
    char bindir[4200];
    snprintf(bindir, sizeof bindir, "%s/bin", o->dir);
    sh_rm_rf(o->dir);
    /* store/ and push/ are the ranks' to make: the agent gives the run
     * folder (a "writable") to the tenant's uid, and what lies in it should
     * be the tenant's too. */
    SH_TRY(sh_mkdir_p(bindir, 0755));
    SH_TRY(copy_file(o->bin, p->bin, 0755));
    snprintf(bindir, sizeof bindir, "%s/bin/shoal-core", o->dir);
    SH_TRY(copy_file(core, bindir, 0755));
    SH_TRY(copy_file(o->fleet, p->fleet, 0644));
    SH_TRY(copy_file(o->speeds, p->speeds, 0644));
    return 0;
}

static int start_fleet(const mj_run_opts *o, const mj_run_paths *p, fleet **f)
{
    char db[4300], log[4300], core[4300];
    snprintf(db, sizeof db, "%s/fleet/shoal.db", p->dir);
    snprintf(log, sizeof log, "%s/up.log", p->dir);
    snprintf(core, sizeof core, "%s/bin/shoal-core", p->dir);
    fleet_opts fo = {.fleet_csv = p->fleet, .exe = core, .agent_log = log, .sandbox = o->sandbox};
    fo.server.db_path = db, fo.server.port = o->port, fo.server.web_dir = o->web_dir;
    fo.server.writable_allow = p->dir; /* the jobs write the run folder: as the fleet's admin, allow it */
    fo.server.max_priority = "default=10"; /* and let its trainer gang preempt rollouts */
    say(o, "starting the fleet (%s) on port %d; logs in %s", o->fleet, o->port, p->dir);
    SH_TRY(fleet_start(&fo, f));
    if (fleet_registered(*f) < fleet_nodes(*f))
        return sh_err(SH_ETIMEDOUT, "%d of the fleet's %d agents registered in 20 s: see %s", fleet_registered(*f),
                      fleet_nodes(*f), log);
    return 0;
}

/* Watches the training until its result: progress and billing each
 * second, and each job's state (a failed one ends the run). */
static int watch(const mj_run_opts *o, client_conn *c, const int64_t *ids)
{
    mj_watch w = {o->dir, c, o->say, o->arg};
    double end = sh_now_mono() + (o->timeout_s > 0 ? o->timeout_s : 900);
    for (;;) {
        if (o->stop && *o->stop) return sh_err(SH_EAGAIN, "interrupted: stopped everything");
        for (int i = 0; i < MJ_NJOBS; i++)
            if (ids[i] >= 0 && mj_run_check(c, ids[i], o->say, o->arg) < 0) {
                say(o, "%s; stopping everything; the logs are in %s", sh_errmsg(), o->dir);
                return SH_EIO;
            }
        int rc = mj_watch_step(&w);
        if (rc) return rc < 0 ? rc : 0;
        if (sh_now_mono() > end)
            return sh_err(SH_ETIMEDOUT, "no result in %s after %.0f s: see %s/up.log and the jobs' logs", o->dir,
                          o->timeout_s > 0 ? o->timeout_s : 900, o->dir);
        sh_sleep(1.0);
    }
}

/* The training part: the fleet, the jobs, the watch; the fleet is stopped
 * before it returns. */
static int train(const mj_run_opts *o, const mj_run_paths *p)
{
    fleet *f = NULL;
    client_conn *c = NULL;
    json_t *jobs[MJ_NJOBS] = {0};
    int64_t ids[MJ_NJOBS] = {-1, -1, -1};
    int rc = start_fleet(o, p, &f);
    if (!rc) rc = client_new(fleet_url(f), fleet_token(f, "default"), &c);
    if (!rc) rc = mj_run_jobs(p, jobs);
    for (int i = 0; !rc && i < MJ_NJOBS; i++)
        if (jobs[i]) rc = mj_run_submit(c, jobs[i], &ids[i]);
    if (!rc)
        say(o, "submitted the trainer (job %lld), the rollouts (job %lld) and %s", (long long)ids[0],
            (long long)ids[1], p->direct ? "no push root (direct transport)" : "the push root");
    if (!rc) rc = watch(o, c, ids);
    if (c) {
        mj_run_save(c, "/v1/jobs", p->dir, "jobs.json");
        mj_run_save(c, "/v1/nodes", p->dir, "nodes.json");
        for (int i = 0; i < MJ_NJOBS; i++)
            if (ids[i] >= 0) mj_run_cancel(c, ids[i]);
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sh_errmsg());
    client_free(c);
    fleet_stop(f); /* its agents end their ranks */
    for (int i = 0; i < MJ_NJOBS; i++) json_decref(jobs[i]);
    if (rc) sh_err(rc, "%s", msg);
    return rc;
}

static int fleet_cost(const mj_run_opts *o, const mj_run_paths *p)
{
    mj_fleetcost_opts fo;
    rl_config base;
    mj_fleetcost_default(&fo, &base);
    fo.fleet = p->fleet, fo.speeds = p->speeds;
    if (o->fc_seeds > 0) fo.seeds = o->fc_seeds;
    say(o, "the fleet-cost experiment: uniform H100 vs mixed vs per-type tuned pools, %d seeds each", fo.seeds);
    json_t *out = NULL;
    SH_TRY(mj_fleet_cost(&fo, &base, o->fc_progress, o->fc_arg, &out));
    char path[4300];
    snprintf(path, sizeof path, "%s/fleet-cost.json", p->dir);
    int rc = sh_json_write_atomic(path, out);
    json_decref(out);
    return rc;
}

int mj_run(const mj_run_opts *o, json_t **summary)
{
    *summary = NULL;
    if (!o->bin || !o->fleet || !o->speeds || !o->dir || o->steps < 1)
        return sh_err(SH_EINVAL, "main job: the binary, the fleet and speed files, the run folder and steps >= 1 "
                                 "are required");
    mj_run_paths p;
    SH_TRY(prepare(o, &p));
    SH_TRY(train(o, &p));
    if (o->stop && *o->stop) return sh_err(SH_EAGAIN, "interrupted");
    if (o->fleet_cost) SH_TRY(fleet_cost(o, &p));
    SH_TRY(mj_report_write(o->dir, summary));
    return 0;
}
