/* A local fleet: the server in this process and one agent process per node
 * of a fleet file (include/shoal/fleet.h).  What `shoal up` and `shoal run`
 * start. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shoal/common.h"
#include "shoal/client.h"
#include "shoal/fleet.h"
#include "shoal/fleetfile.h"

struct fleet {
    fleet_opts o;
    sh_fleet_file ff;
    char dir[4096], tokens[4200], work[4200], envf[4200], top[4096], url[128];
    const char *new_tokens, *new_db; /* what a failed start removes */
    int lock;
    json_t *tok;
    srv *s;
    pid_t *pids;
    int registered;
};

static int make_tokens(const char *path)
{
    if (sh_path_exists(path)) return SH_OK;
    unsigned char r[48];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, r, sizeof r) != (ssize_t)sizeof r) {
        if (fd >= 0) close(fd);
        return sh_err_errno(errno, "/dev/urandom");
    }
    close(fd);
    char t[3][33];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 16; i++) snprintf(t[k] + 2 * i, 3, "%02x", r[16 * k + i]);
    json_t *j = json_pack("{s:s,s:s,s:{s:s}}", "admin", t[0], "agent", t[1], "tenants", "default", t[2]);
    char *text = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    if (!text) return sh_err(SH_ENOMEM, "%s", path);
    /* 0600 from the first byte: never chmod'ed after the fact. */
    int rc = sh_write_atomic_mode(path, text, strlen(text), 0600);
    free(text);
    return rc;
}

/* The first folder on dir's path that does not exist (the one mkdir -p
 * creates first) into out; empty when dir exists. */
static void first_missing(const char *dir, char *out, size_t cap)
{
    char p[4096];
    out[0] = 0;
    snprintf(p, sizeof p, "%s", dir);
    for (char *c = p + 1;; c++) {
        if (*c && *c != '/') continue;
        char was = *c;
        *c = 0;
        if (!sh_path_exists(p)) {
            snprintf(out, cap, "%s", p);
            return;
        }
        if (!was) return;
        *c = was;
    }
}

/* A failed start leaves nothing behind: the state folder when it made it,
 * else the tokens file and the database (with SQLite's side files) when
 * they were new.  Returns rc. */
static int undo(fleet *f, int rc)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sh_errmsg());
    if (f->top[0]) sh_rm_rf(f->top);
    else {
        if (f->new_tokens) unlink(f->new_tokens);
        static const char *const side[] = {"", "-wal", "-shm", "-journal"};
        for (int k = 0; f->new_db && k < 4; k++) {
            char p[4200];
            snprintf(p, sizeof p, "%s%s", f->new_db, side[k]);
            unlink(p);
        }
    }
    sh_err(rc, "%s", msg);
    return rc;
}

static void db_dir(const char *db, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s", db);
    char *slash = strrchr(dir, '/');
    if (slash == dir) slash[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(dir, cap, ".");
}

static int prepare(fleet *f)
{
    int rc;
    if ((rc = sh_fleet_load(f->o.fleet_csv, NULL, &f->ff)) < 0) return rc;
    db_dir(f->o.server.db_path, f->dir, sizeof f->dir);
    snprintf(f->tokens, sizeof f->tokens, "%s/tokens.json", f->dir);
    snprintf(f->work, sizeof f->work, "%s/work", f->dir);
    snprintf(f->envf, sizeof f->envf, "%s/env", f->dir);
    f->new_db = sh_path_exists(f->o.server.db_path) ? NULL : f->o.server.db_path;
    first_missing(f->dir, f->top, sizeof f->top);
    /* The state folder is private: the agents hide it from members and bind
     * each member's own work folder back in. */
    if ((rc = sh_mkdir_p(f->dir, 0700)) < 0 ||
        (chmod(f->dir, 0700) < 0 && (rc = sh_err_errno(errno, "chmod %s", f->dir))))
        return undo(f, rc);
    /* One fleet per state folder: a second would share its database, tokens,
     * env file and work folders (and rewrite env to its own port). */
    char lockf[4200];
    snprintf(lockf, sizeof lockf, "%s/up.lock", f->dir);
    long held;
    if ((rc = sh_lock_pid(lockf, &f->lock, &held)) == SH_EEXIST) {
        f->top[0] = 0, f->new_db = NULL; /* the other fleet's */
        return sh_err(SH_EEXIST, "another shoal up (pid %ld) runs on %s (its database, tokens and env): stop it, "
                                 "or give this one its own folder with --db DIR/shoal.db", held, f->dir);
    }
    if (rc < 0) return undo(f, rc);
    if (!f->o.server.tokens_path) {
        if (!sh_path_exists(f->tokens)) f->new_tokens = f->tokens;
        if ((rc = make_tokens(f->tokens)) < 0) return undo(f, rc);
        f->o.server.tokens_path = f->tokens;
    }
    if ((rc = sh_json_load_file(f->o.server.tokens_path, 1 << 20, &f->tok)) < 0) return undo(f, rc);
    /* A fleet of one tenant (the tokens shoal up made): its jobs may use
     * every priority, since there is no other tenant to preempt.  With
     * more tenants the operator says what each may ask (--max-priority). */
    json_t *tenants = json_object_get(f->tok, "tenants");
    if (!f->o.server.max_priority && json_object_size(tenants) == 1 && json_object_get(tenants, "default"))
        f->o.server.max_priority = "default=1000";
    return 0;
}

int fleet_prepare(const fleet_opts *o, fleet **out)
{
    *out = NULL;
    if (!o->fleet_csv || !o->server.db_path) return sh_err(SH_EINVAL, "local fleet: a fleet file and a database path are required");
    fleet *f = calloc(1, sizeof *f);
    if (!f) return sh_err(SH_ENOMEM, "local fleet");
    f->o = *o;
    f->lock = -1;
    f->registered = -1;
    int rc = prepare(f);
    if (rc < 0) {
        fleet_stop(f);
        return rc;
    }
    *out = f;
    return 0;
}

static pid_t spawn_agent(const fleet *f, const sh_fleet_node *n, int log)
{
    char gpus[16], price[32];
    snprintf(gpus, sizeof gpus, "%d", n->gpus);
    snprintf(price, sizeof price, "%.6g", n->price_per_gpu_hour);
    const char *token = json_string_value(json_object_get(f->tok, "agent"));
    const char *exe = f->o.exe ? f->o.exe : "/proc/self/exe";
    pid_t parent = getpid();
    pid_t p = fork();
    if (p != 0) return p;
    /* The server lives in this process: its agents end with it, even on kill -9. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    if (log >= 0) dup2(log, 1), dup2(log, 2);
    setenv("SHOAL_TOKEN", token ? token : "", 1);
    char *argv[] = {"shoal", "agent", "--server", (char *)f->url, "--name", (char *)n->name, "--gpu-type",
                    (char *)n->gpu_type, "--gpus", gpus, "--zone", (char *)n->zone, "--fabric",
                    (char *)n->fabric, "--price", price, "--work-dir", (char *)f->work, "--sandbox",
                    (char *)(f->o.sandbox ? f->o.sandbox : "auto"), NULL};
    execv(exe, argv);
    _exit(127);
}

/* How many of the fleet's nodes the server holds alive, polled until all
 * are or `limit` seconds passed; -1 when the server could not be asked. */
static int wait_registered(const fleet *f, double limit)
{
    client_conn *c;
    const char *admin = fleet_token(f, "admin");
    if (!admin || client_new(f->url, admin, &c) < 0) return -1;
    int alive = -1, n = (int)f->ff.n;
    for (double end = sh_now_mono() + limit; alive < n && sh_now_mono() < end;) {
        int st;
        json_t *j = NULL;
        if (client_call(c, "GET", "/v1/nodes", NULL, NULL, 5.0, &st, &j) == 0 && st == 200) {
            json_t *v;
            size_t i;
            alive = 0;
            json_array_foreach(json_object_get(j, "nodes"), i, v) {
                const char *state = json_string_value(json_object_get(v, "state"));
                alive += state && !strcmp(state, "alive");
            }
        }
        json_decref(j);
        if (alive < n) sh_sleep(0.1);
    }
    client_free(c);
    return alive;
}

int fleet_launch(fleet *f)
{
    int rc = srv_start(&f->o.server, &f->s);
    if (rc < 0) return undo(f, rc);
    snprintf(f->url, sizeof f->url, "http://%s:%d", f->o.server.bind_addr ? f->o.server.bind_addr : "127.0.0.1",
             srv_port(f->s));
    int log = f->o.agent_log ? open(f->o.agent_log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
    if (f->o.agent_log && log < 0) return undo(f, sh_err_errno(errno, "open %s", f->o.agent_log));
    f->pids = calloc(f->ff.n ? f->ff.n : 1, sizeof *f->pids);
    if (!f->pids) return undo(f, sh_err(SH_ENOMEM, "local fleet"));
    for (size_t i = 0; i < f->ff.n; i++) f->pids[i] = spawn_agent(f, &f->ff.nodes[i], log);
    if (log >= 0) close(log);
    /* The env file first: clients may submit at once (jobs queue until the
     * nodes come). */
    const char *tenant = fleet_token(f, "default");
    char env[512];
    int el = snprintf(env, sizeof env, "export SHOAL_SERVER=%s\nexport SHOAL_TOKEN=%s\n", f->url, tenant ? tenant : "");
    if (sh_write_atomic_mode(f->envf, env, (size_t)el, 0600) < 0) sh_warn("%s", sh_errmsg());
    f->registered = wait_registered(f, f->o.register_s > 0 ? f->o.register_s : 20.0);
    return 0;
}

int fleet_start(const fleet_opts *o, fleet **out)
{
    int rc = fleet_prepare(o, out);
    if (rc < 0) return rc;
    if ((rc = fleet_launch(*out)) < 0) {
        fleet_stop(*out);
        *out = NULL;
    }
    return rc;
}

int fleet_lock_fd(const fleet *f) { return f->lock; }
const char *fleet_dir(const fleet *f) { return f->dir; }
const char *fleet_url(const fleet *f) { return f->s ? f->url : NULL; }
const char *fleet_tokens_path(const fleet *f) { return f->o.server.tokens_path; }
const char *fleet_env_path(const fleet *f) { return f->envf; }
int fleet_nodes(const fleet *f) { return (int)f->ff.n; }
int fleet_registered(const fleet *f) { return f->registered; }

const char *fleet_token(const fleet *f, const char *who)
{
    if (!strcmp(who, "admin") || !strcmp(who, "agent")) return json_string_value(json_object_get(f->tok, who));
    return json_string_value(json_object_get(json_object_get(f->tok, "tenants"), who));
}

void fleet_reap(fleet *f)
{
    for (size_t i = 0; f->pids && i < f->ff.n; i++)
        if (f->pids[i] > 0 && waitpid(f->pids[i], NULL, WNOHANG) == f->pids[i]) f->pids[i] = 0;
}

void fleet_stop(fleet *f)
{
    if (!f) return;
    for (size_t i = 0; f->pids && i < f->ff.n; i++)
        if (f->pids[i] > 0) kill(f->pids[i], SIGTERM);
    for (size_t i = 0; f->pids && i < f->ff.n; i++)
        if (f->pids[i] > 0) waitpid(f->pids[i], NULL, 0);
    if (f->s) srv_stop(f->s);
    if (f->lock >= 0) close(f->lock);
    json_decref(f->tok);
    free(f->pids);
    sh_fleet_free(&f->ff);
    free(f);
}
