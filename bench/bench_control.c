/* shoal bench control: the control plane's latency, throughput and cycle
 * time, each beside a baseline measured in the same run.
 *
 *  1. gang start: submit-to-running of a 4-node gang on a local fleet (this
 *     process's server, four `shoal agent` processes, sandboxed launches),
 *     against a 1-GPU function on the same fleet;
 *  2. submits: accepted job submissions per second from concurrent
 *     keep-alive clients on loopback, against GET /healthz on the same
 *     connections (the HTTP floor);
 *  3. cycle: one scheduling cycle with 10,000 registered nodes that places
 *     a batch of new jobs, against an idle cycle on the same state.
 *
 * With --db postgresql://..., the gang starts and the submits are measured
 * again on PostgreSQL, beside SQLite's in the same run (each phase in a
 * schema of its own, shoal_bench_PID_TAG, dropped after it). */
#include <float.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "cli/cli_int.h"
#include "shoal/client.h"
#include "shoal/server.h"

const char cli_bench_help_control[] = "control plane: gang start latency, submits/s, 10k-node cycle [--json]";

static const char usage[] =
    "usage: shoal bench control [--starts N] [--seconds S] [--clients C] [--nodes N] [--db URL] [--json]\n\n"
    "  --starts N    gang (and function) launches to time (default 30)\n"
    "  --seconds S   length of the submit load (default 3)\n"
    "  --clients C   concurrent keep-alive clients (default 8)\n"
    "  --nodes N     registered nodes for the cycle measurement (default 10000)\n"
    "  --db URL      also measure on this PostgreSQL database (postgresql://...; a\n"
    "                scratch one: the bench creates and drops schemas in it)\n";

static const char *pg_db; /* --db */

typedef struct bench_srv {
    srv *s;
    char dir[256], url[64];
    char pg[1200], schema[96]; /* PostgreSQL: the URL with its own search_path */
} bench_srv;

static int pg_exec(const char *url, const char *sql)
{
    PGconn *c = PQconnectdb(url);
    PGresult *r = c && PQstatus(c) == CONNECTION_OK ? PQexec(c, sql) : NULL;
    int rc = r && PQresultStatus(r) == PGRES_COMMAND_OK
                 ? SH_OK
                 : sh_err(SH_EIO, "bench: %s: %s", sql, c ? PQerrorMessage(c) : "out of memory");
    PQclear(r);
    PQfinish(c);
    return rc;
}

static int bench_server(bench_srv *b, const char *tag, double hb, int manual, int pg)
{
    b->pg[0] = 0;
    snprintf(b->dir, sizeof b->dir, "%s/shoal-bench-control.%d.%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid(), tag);
    sh_rm_rf(b->dir);
    SH_TRY(sh_mkdir_p(b->dir, 0755));
    char tok[300], db[300];
    snprintf(tok, sizeof tok, "%s/tokens.json", b->dir);
    snprintf(db, sizeof db, "%s/state.db", b->dir);
    const char *t = "{\"admin\":\"a\",\"agent\":\"g\",\"tenants\":{\"bench\":\"t\"}}";
    SH_TRY(sh_write_atomic_mode(tok, t, strlen(t), 0600));
    srv_config c = {0};
    c.db_path = db;
    c.tokens_path = tok;
    c.heartbeat_timeout = hb;
    c.manual_cycles = manual;
    c.max_conns_per_ip = SRV_MAX_CONNS; /* every client of the bench is on loopback */
    if (pg) {
        snprintf(b->schema, sizeof b->schema, "shoal_bench_%d_%s", (int)getpid(), tag);
        snprintf(b->pg, sizeof b->pg, "%s%coptions=-csearch_path%%3D%s", pg_db, strchr(pg_db, '?') ? '&' : '?',
                 b->schema);
        char sql[200];
        snprintf(sql, sizeof sql, "CREATE SCHEMA %s", b->schema);
        SH_TRY(pg_exec(pg_db, sql));
        c.db_path = b->pg;
        c.state_dir = b->dir;
    }
    SH_TRY(srv_start(&c, &b->s));
    /* A PostgreSQL server stands by until it has won the election. */
    for (int k = 0; pg && !srv_leading(b->s) && k < 1000; k++) sh_sleep(0.01);
    if (pg && !srv_leading(b->s)) return sh_err(SH_ETIMEDOUT, "bench: the server did not become the leader in 10 s");
    snprintf(b->url, sizeof b->url, "http://127.0.0.1:%d", srv_port(b->s));
    return SH_OK;
}

static void bench_server_stop(bench_srv *b)
{
    srv_stop(b->s);
    if (b->pg[0]) {
        char sql[200];
        snprintf(sql, sizeof sql, "DROP SCHEMA %s CASCADE", b->schema);
        pg_exec(pg_db, sql);
    }
    sh_rm_rf(b->dir);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static int wait_state(client_conn *c, long long id, const char *state, double timeout)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", id);
    double until = sh_now_mono() + timeout;
    while (sh_now_mono() < until) {
        int st;
        json_t *j = NULL;
        SH_TRY(client_call(c, "GET", path, NULL, NULL, 5, &st, &j));
        const char *s = json_string_value(json_object_get(j, "state"));
        int done = s && !strcmp(s, state);
        json_decref(j);
        if (done) return SH_OK;
        sh_sleep(0.001);
    }
    return sh_err(SH_ETIMEDOUT, "job %lld did not reach %s in %.0f s", id, state, timeout);
}

/* Times submit -> running for `n` jobs of one body; cancels each after. */
static int time_starts(client_conn *c, const char *body, int n, double *out, sh_progress *p, int *done)
{
    for (int i = 0; i < n; i++) {
        double t0 = sh_now_mono();
        int st;
        json_t *j = NULL;
        json_t *req = json_loads(body, 0, NULL); /* client_call does not take it */
        int rc = client_call(c, "POST", "/v1/jobs", req, NULL, 5, &st, &j);
        json_decref(req);
        SH_TRY(rc);
        long long id = json_integer_value(json_object_get(j, "id"));
        json_decref(j);
        if (st != 201) return sh_err(SH_EIO, "bench: submit returned HTTP %d", st);
        SH_TRY(wait_state(c, id, "running", 30));
        out[i] = (sh_now_mono() - t0) * 1e3;
        char path[64];
        snprintf(path, sizeof path, "/v1/jobs/%lld/cancel", id);
        SH_TRY(client_call(c, "POST", path, NULL, NULL, 5, &st, &j));
        json_decref(j);
        sh_progress_update(p, (uint64_t)++*done);
    }
    return SH_OK;
}

static int gang_latency(int n, int pg, double *gang_p50, double *gang_p99, double *fn_p50)
{
    bench_srv b;
    SH_TRY(bench_server(&b, "gang", 5, 0, pg));
    pid_t agents[4];
    char work[300];
    snprintf(work, sizeof work, "%s/work", b.dir);
    for (int i = 0; i < 4; i++) {
        char name[16];
        snprintf(name, sizeof name, "h%d", i);
        if ((agents[i] = fork()) == 0) {
            char *argv[] = {"shoal", "agent", "--server", b.url, "--token", "g", "--name", name, "--gpu-type", "H100",
                            "--gpus", "8", "--zone", "z", "--fabric", "ib", "--work-dir", work, NULL};
            execv("/proc/self/exe", argv);
            _exit(127);
        }
    }
    client_conn *c;
    int rc = client_new(b.url, "t", &c);
    /* Wait for the fleet: a 4-node gang fits once all four registered. */
    for (int k = 0; rc == SH_OK && k < 400; k++) {
        int st;
        json_t *j = NULL;
        if ((rc = client_call(c, "GET", "/v1/nodes", NULL, NULL, 5, &st, &j)) < 0) break;
        size_t nn = json_array_size(json_object_get(j, "nodes"));
        json_decref(j);
        if (nn == 4) break;
        sh_sleep(0.025);
    }
    double *g = calloc((size_t)n, sizeof *g), *f = calloc((size_t)n, sizeof *f);
    sh_progress p;
    int done = 0;
    sh_progress_start(&p, "gang starts", (uint64_t)(2 * n), "launches");
    const char *gang = "{\"name\":\"bench-gang\",\"nodes\":4,\"gpus_per_node\":8,\"command\":[\"sleep\",\"60\"]}";
    const char *fn = "{\"name\":\"bench-fn\",\"kind\":\"function\",\"command\":[\"sleep\",\"60\"]}";
    if (rc == SH_OK) rc = time_starts(c, gang, n, g, &p, &done);
    if (rc == SH_OK) rc = time_starts(c, fn, n, f, &p, &done);
    sh_progress_finish(&p);
    if (rc == SH_OK) {
        *gang_p99 = pct(g, n, 0.99);
        *gang_p50 = pct(g, n, 0.5);
        *fn_p50 = pct(f, n, 0.5);
    }
    free(g);
    free(f);
    client_free(c);
    for (int i = 0; i < 4; i++) kill(agents[i], SIGTERM);
    for (int i = 0; i < 4; i++) waitpid(agents[i], NULL, 0);
    bench_server_stop(&b);
    return rc;
}

typedef struct load_arg {
    const char *url;
    double until;
    int healthz, id;
    uint64_t ok, errors;
} load_arg;

static void *load_thread(void *p)
{
    load_arg *a = p;
    client_conn *c;
    if (client_new(a->url, "t", &c) < 0) {
        a->errors++;
        return NULL;
    }
    char body[256];
    for (uint64_t i = 0; sh_now_mono() < a->until; i++) {
        int st = 0;
        char *r = NULL;
        size_t rl;
        int rc;
        if (a->healthz) rc = client_raw(c, "GET", "/healthz", NULL, 0, NULL, 5, &st, &r, &rl);
        else {
            int n = snprintf(body, sizeof body,
                             "{\"name\":\"load\",\"kind\":\"function\",\"command\":[\"true\"],\"idempotency_key\":\"%d-%llu\"}",
                             a->id, (unsigned long long)i);
            rc = client_raw(c, "POST", "/v1/jobs", body, (size_t)n, NULL, 5, &st, &r, &rl);
        }
        free(r);
        if (rc == 0 && (st == 200 || st == 201)) a->ok++;
        else a->errors++;
    }
    client_free(c);
    return NULL;
}

static int load(const char *url, int clients, double seconds, int healthz, double *per_s, uint64_t *errors)
{
    load_arg a[64];
    pthread_t t[64];
    double t0 = sh_now_mono();
    for (int i = 0; i < clients; i++) {
        a[i] = (load_arg){url, t0 + seconds, healthz, i, 0, 0};
        pthread_create(&t[i], NULL, load_thread, &a[i]);
    }
    uint64_t ok = 0;
    *errors = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(t[i], NULL);
        ok += a[i].ok;
        *errors += a[i].errors;
    }
    *per_s = (double)ok / (sh_now_mono() - t0);
    return SH_OK;
}

/* The submit load runs against a one-GPU fleet whose only GPU is busy, so
 * that every accepted job queues: the measure is the API and the durable
 * write, not process launches. */
static int submit_rate(int clients, double seconds, int pg, double *submits, double *healthz, uint64_t *errors)
{
    bench_srv b;
    SH_TRY(bench_server(&b, "load", 1e9, 0, pg));
    int rc = srv_add_bench_nodes(b.s, 1, "H100", 1);
    uint64_t herr = 0;
    if (rc == SH_OK) rc = load(b.url, clients, seconds, 1, healthz, &herr);
    if (rc == SH_OK) rc = load(b.url, clients, seconds, 0, submits, errors);
    *errors += herr;
    bench_server_stop(&b);
    return rc;
}

static int cycle_time(int nodes, double *busy_ms, double *idle_ms)
{
    bench_srv b;
    SH_TRY(bench_server(&b, "cycle", 1e9, 1, 0));
    int rc = srv_add_bench_nodes(b.s, nodes, "H100", 8);
    client_conn *c = NULL;
    if (rc == SH_OK) rc = client_new(b.url, "t", &c);
    double worst = 0, idle = 1e9;
    const char *bodies[] = {
        "{\"name\":\"g\",\"nodes\":4,\"gpus_per_node\":8,\"command\":[\"true\"]}",
        "{\"name\":\"e\",\"kind\":\"elastic\",\"min_nodes\":1,\"max_nodes\":4,\"gpus_per_node\":2,\"command\":[\"true\"]}",
        "{\"name\":\"f\",\"kind\":\"function\",\"command\":[\"true\"]}"};
    srv_cycle_for_bench(b.s); /* settle the registrations */
    for (int round = 0; rc == SH_OK && round < 5; round++) {
        for (int k = 0; rc == SH_OK && k < 100; k++) {
            int st;
            json_t *j = NULL;
            json_t *req = json_loads(bodies[k % 3], 0, NULL);
            rc = client_call(c, "POST", "/v1/jobs", req, NULL, 5, &st, &j);
            json_decref(req);
            json_decref(j);
        }
        double t = srv_cycle_for_bench(b.s);
        if (t < 0) rc = (int)t;
        else if (t * 1e3 > worst) worst = t * 1e3;
        double ti = srv_cycle_for_bench(b.s);
        if (ti >= 0 && ti * 1e3 < idle) idle = ti * 1e3;
    }
    *busy_ms = worst;
    *idle_ms = idle;
    client_free(c);
    bench_server_stop(&b);
    return rc;
}

/* One database's figures: gang and function start, submit and healthz rate. */
typedef struct figs {
    double g50, g99, f50, subs, hz;
    uint64_t errors;
} figs;

typedef struct copts {
    int json, starts, clients, nodes;
    double seconds;
} copts;

/* Parses the options into o (and pg_db): -1, or the status to exit with. */
static int parse(int argc, char **argv, copts *o)
{
    static const struct option opts[] = {{"starts", required_argument, 0, 's'}, {"seconds", required_argument, 0, 'S'},
                                         {"clients", required_argument, 0, 'c'}, {"nodes", required_argument, 0, 'n'},
                                         {"json", no_argument, 0, 'j'},          {"db", required_argument, 0, 'd'},
                                         {0}};
    cli_args a = {"bench control", usage, opts, NULL};
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        int64_t x;
        switch (c) {
        case 'j': o->json = 1; break;
        case 'd':
            if (strncmp(optarg, "postgresql://", 13) && strncmp(optarg, "postgres://", 11))
                return cli_usage(a.cmd, "--db %s: expected a PostgreSQL URL postgresql://USER@HOST[:PORT]/DB", optarg);
            pg_db = optarg;
            break;
        case 's':
            if (cli_int(a.cmd, "--starts", optarg, 1, 100000, &x)) return CLI_USAGE;
            o->starts = (int)x;
            break;
        case 'c':
            if (cli_int(a.cmd, "--clients", optarg, 1, 64, &x)) return CLI_USAGE;
            o->clients = (int)x;
            break;
        case 'n':
            if (cli_int(a.cmd, "--nodes", optarg, 1, 10000000, &x)) return CLI_USAGE;
            o->nodes = (int)x;
            break;
        case 'S':
            if (cli_real(a.cmd, "--seconds", optarg, DBL_TRUE_MIN, 86400, "seconds in (0, 86400]", &o->seconds))
                return CLI_USAGE;
            break;
        default: return a.rc;
        }
    }
    if (optind < argc) return cli_usage(a.cmd, "unexpected argument \"%s\"", argv[optind]);
    return -1;
}

static void print_json(const copts *o, const figs *sq, const figs *pg, double busy, double idle)
{
    json_t *j = json_pack("{s:f,s:f,s:f,s:f,s:f,s:I,s:f,s:f,s:i,s:i,s:i}", "gang_start_p50_ms", sq->g50,
                          "gang_start_p99_ms", sq->g99, "function_start_p50_ms", sq->f50, "submits_per_s", sq->subs,
                          "healthz_per_s", sq->hz, "errors", (json_int_t)sq->errors, "cycle_ms_10k_nodes", busy,
                          "idle_cycle_ms", idle, "nodes", o->nodes, "clients", o->clients, "starts", o->starts);
    if (pg_db)
        json_object_set_new(j, "postgresql",
                            json_pack("{s:f,s:f,s:f,s:f,s:I,s:f}", "gang_start_p50_ms", pg->g50, "gang_start_p99_ms",
                                      pg->g99, "function_start_p50_ms", pg->f50, "submits_per_s", pg->subs, "errors",
                                      (json_int_t)pg->errors, "submits_vs_sqlite", sq->subs > 0 ? pg->subs / sq->subs : 0));
    sh_json_print(j);
    json_decref(j);
}

static void print_text(const copts *o, const figs *sq, const figs *pg, double busy, double idle)
{
    printf("control plane (loopback, %d starts, %d clients, %d nodes)\n", o->starts, o->clients, o->nodes);
    printf("  gang (4 nodes) start p50   %8.1f ms   p99 %.1f ms   (target p50 <= 300, p99 <= 1000)\n", sq->g50,
           sq->g99);
    printf("  function start p50         %8.1f ms   gang/function %.2fx\n", sq->f50,
           sq->f50 > 0 ? sq->g50 / sq->f50 : 0);
    printf("  submits                    %8.0f /s   errors %llu   (target >= 2000/s, 0 errors)\n", sq->subs,
           (unsigned long long)sq->errors);
    printf("  GET /healthz               %8.0f /s   submits/healthz %.2f\n", sq->hz,
           sq->hz > 0 ? sq->subs / sq->hz : 0);
    printf("  cycle, %d nodes, 100 new jobs %6.2f ms   idle cycle %.2f ms   (target <= 50 ms)\n", o->nodes, busy,
           idle);
    if (pg_db) {
        printf("PostgreSQL state (same run)\n");
        printf("  gang (4 nodes) start p50   %8.1f ms   p99 %.1f ms   (SQLite p50 %.1f ms)\n", pg->g50, pg->g99,
               sq->g50);
        printf("  submits                    %8.0f /s   errors %llu   %.2fx SQLite's (target >= 0.5x and >= 1000/s)\n",
               pg->subs, (unsigned long long)pg->errors, sq->subs > 0 ? pg->subs / sq->subs : 0);
    }
}

int cli_bench_control(int argc, char **argv)
{
    copts o = {0, 30, 8, 10000, 3};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    signal(SIGPIPE, SIG_IGN);
    figs sq = {0}, pg = {0};
    double busy = 0, idle = 0;
    rc = gang_latency(o.starts, 0, &sq.g50, &sq.g99, &sq.f50);
    if (rc == SH_OK) rc = submit_rate(o.clients, o.seconds, 0, &sq.subs, &sq.hz, &sq.errors);
    if (rc == SH_OK && pg_db) rc = gang_latency(o.starts, 1, &pg.g50, &pg.g99, &pg.f50);
    if (rc == SH_OK && pg_db) rc = submit_rate(o.clients, o.seconds, 1, &pg.subs, &pg.hz, &pg.errors);
    if (rc == SH_OK) rc = cycle_time(o.nodes, &busy, &idle);
    if (rc < 0) return cli_fail("bench control", rc);
    if (o.json) print_json(&o, &sq, &pg, busy, idle);
    else print_text(&o, &sq, &pg, busy, idle);
    return 0;
}
