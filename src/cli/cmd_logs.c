/* shoal logs: a job's output (one rank or all), optionally followed until
 * it ends. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_int.h"
#include "ctl_int.h"

const char cli_help_logs[] = "print a job's output (one rank or all), -f to follow until it ends";

static const char usage[] =
    "usage: shoal logs ID [--rank R|all] [-f|--follow] [--raw] [--server URL] [--token T] [--json]\n\n"
    "Prints rank R's whole output so far (default rank 0).  --rank all prints\n"
    "every rank's, each line prefixed with \"[rank N] \": rank by rank for what\n"
    "was written so far, then, with --follow, interleaved as lines arrive.\n"
    "--follow waits for more until the job ends and then exits with the job's\n"
    "status, as `submit --wait` does (0 if it succeeded, the failed rank's exit\n"
    "code, else 1; the reason goes to stderr).  --json prints one object {job,\n"
    "rank, data, offset, done, state} at the end (with --rank all, {job, ranks:\n"
    "[{rank, data, offset}], done, state}).\n\n"
    "On a terminal, control characters of the output (escape sequences, other\n"
    "C0 and C1 controls, DEL) are shown as ^[, ^M, \\u009b and the like, so that\n"
    "a job cannot drive your terminal; newlines and tabs pass.  --raw prints\n"
    "the bytes as the job wrote them.  Into a pipe or a file the bytes always\n"
    "pass unchanged (--json escapes them as JSON does; on a terminal, as\n"
    "\\uXXXX for everything past ASCII).\n";

/* What one rank's log has given so far: the offset to ask from, and, with
 * --rank all, the line not yet ended (printed once it ends). */
typedef struct rank_log {
    long long off;
    sh_buf part, all;
} rank_log;

/* Set once per command: output goes to a terminal and is not --raw. */
static int escape;
static int write_failed;

/* Prints a chunk of output, made safe for a terminal when `escape`. */
static int put(const char *d, size_t n, int esc)
{
    if (!esc) return fwrite(d, 1, n, stdout) == n ? 0 : -1;
    sh_buf b = {0};
    int rc = cli_term_escape(d, n, &b);
    if (rc == 0 && b.len && fwrite(b.data, 1, b.len, stdout) != b.len) rc = -1;
    sh_buf_free(&b);
    return rc;
}

static void emit(const char *d, size_t n)
{
    if (n && put(d, n, escape) < 0 && !write_failed) write_failed = errno ? errno : EIO;
}

/* Prints data with each whole line prefixed by "[rank R] "; a last line
 * without its newline waits in r->part (flush: printed with one). */
static void emit_prefixed(rank_log *r, int rank, const char *d, size_t n, int flush)
{
    char pre[32];
    int np = snprintf(pre, sizeof pre, "[rank %d] ", rank);
    sh_buf_append(&r->part, d, n);
    size_t start = 0;
    for (size_t i = 0; i < r->part.len; i++) {
        if (r->part.data[i] != '\n') continue;
        emit(pre, (size_t)np);
        emit((char *)r->part.data + start, i + 1 - start);
        start = i + 1;
    }
    if (flush && start < r->part.len) {
        emit(pre, (size_t)np);
        emit((char *)r->part.data + start, r->part.len - start);
        emit("\n", 1);
        start = r->part.len;
    }
    memmove(r->part.data, r->part.data + start, r->part.len - start);
    r->part.len -= start;
}

/* Fetches one page of rank's log; *n gets its size, *done whether the job
 * has ended, *state its state (static storage). */
static int page(cli_ctl *x, int64_t id, int rank, rank_log *r, int all, size_t *n, int *done)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%lld/logs?rank=%d&offset=%lld", (long long)id, rank, r->off);
    json_t *j;
    int rc = cli_ctl_call(x, "GET", path, NULL, NULL, &j);
    if (rc) return rc;
    const char *d = json_string_value(json_object_get(j, "data"));
    *n = json_string_length(json_object_get(j, "data"));
    if (x->json) sh_buf_append(&r->all, d, *n);
    else if (all) emit_prefixed(r, rank, d, *n, 0);
    else emit(d, *n);
    fflush(stdout);
    r->off = json_integer_value(json_object_get(j, "offset"));
    *done = json_is_true(json_object_get(j, "done"));
    json_decref(j);
    return 0;
}

static json_t *text(const sh_buf *b) { return json_stringn(b->data ? (char *)b->data : "", b->len); }

/* One `shoal logs`: what was asked and what each rank's log gave. */
typedef struct logs_run {
    cli_ctl x;
    int64_t id, rank;
    int follow, all, raw, nranks;
    rank_log *logs;
} logs_run;

/* Parses the options and the job id into L: -1, or the status to exit with. */
static int parse(logs_run *L, int argc, char **argv)
{
    static const struct option opts[] = {{"rank", required_argument, 0, 'r'}, {"follow", no_argument, 0, 'f'},
                                         {"raw", no_argument, 0, 'R'}, {0}};
    cli_ctl_defaults(&L->x, "logs");
    cli_args a = {"logs", usage, opts, &L->x, NULL, "f"}; /* -f, as tail spells it */
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        if (c == 'f') L->follow = 1;
        else if (c == 'R') L->raw = 1;
        else if (c != 'r') return a.rc;
        else if (!strcmp(optarg, "all")) L->all = 1;
        else if (sh_parse_i64(optarg, &L->rank, "--rank") < 0 || L->rank < 0)
            return cli_usage("logs", "--rank: expected a rank number or \"all\", got \"%s\"", optarg);
    }
    int rc = cli_ctl_job_id("logs", argc, argv, &L->id);
    return rc ? rc : -1;
}

static void job_path(const logs_run *L, char *path, size_t n) { snprintf(path, n, "/v1/jobs/%lld", (long long)L->id); }

/* The ranks a job can have: a gang's nodes, an elastic job's max_nodes. */
static int count_ranks(logs_run *L)
{
    L->nranks = 1;
    if (L->all) {
        char path[64];
        json_t *job;
        job_path(L, path, sizeof path);
        int rc = cli_ctl_call(&L->x, "GET", path, NULL, NULL, &job);
        if (rc) return rc;
        L->nranks = (int)json_integer_value(json_object_get(job, "nodes"));
        if (L->nranks < 1 || L->nranks > 64) L->nranks = 1;
        json_decref(job);
    }
    L->logs = calloc((size_t)L->nranks, sizeof *L->logs);
    return L->logs ? 0 : cli_fail("logs", SH_ENOMEM);
}

/* Each rank is read until a page comes back empty (a page holds at most
 * 1 MiB); with --follow, rounds go on until the job has ended and a round
 * after that found nothing new. */
static int read_logs(logs_run *L)
{
    int rc = 0, done = 0;
    for (int round = 0;; round++) {
        size_t got = 0;
        int ended = 0;
        for (int r = 0; r < L->nranks && !rc; r++) {
            size_t n;
            do {
                rc = page(&L->x, L->id, L->all ? r : (int)L->rank, &L->logs[r], L->all, &n, &ended);
                got += n;
                if (!rc && write_failed) rc = cli_fail("logs", sh_err_errno(write_failed, "writing the output"));
            } while (!rc && n > 0 && (round == 0 || !L->follow));
            /* Without --follow a rank's output is whole once read. */
            if (!rc && L->all && !L->follow && !L->x.json) emit_prefixed(&L->logs[r], r, "", 0, 1);
        }
        if (rc || !L->follow || (done && !got)) break;
        done = ended;
        if (!got && !done) sh_sleep(0.3);
    }
    for (int r = 0; L->all && !L->x.json && !rc && r < L->nranks; r++) emit_prefixed(&L->logs[r], r, "", 0, 1);
    fflush(stdout);
    return rc;
}

static void print_json(const logs_run *L, const json_t *job)
{
    json_t *o = json_pack("{s:I,s:b,s:s}", "job", (json_int_t)L->id, "done", cli_job_ended(job), "state",
                          json_string_value(json_object_get(job, "state")));
    if (L->all) {
        json_t *ranks = json_array();
        for (int r = 0; r < L->nranks; r++)
            json_array_append_new(ranks, json_pack("{s:i,s:o,s:I}", "rank", r, "data", text(&L->logs[r].all),
                                                   "offset", (json_int_t)L->logs[r].off));
        json_object_set_new(o, "ranks", ranks);
    } else {
        json_object_set_new(o, "rank", json_integer(L->rank));
        json_object_set_new(o, "data", text(&L->logs[0].all));
        json_object_set_new(o, "offset", json_integer(L->logs[0].off));
    }
    if (escape) {
        /* Past ASCII as \uXXXX: no C1 control reaches the terminal. */
        char *t = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
        if (t) printf("%s\n", t);
        free(t);
    } else sh_json_print(o);
    json_decref(o);
}

int cli_cmd_logs(int argc, char **argv)
{
    logs_run L = {.id = -1};
    int rc = parse(&L, argc, argv);
    if (rc >= 0) return rc;
    if ((rc = cli_ctl_connect(&L.x))) return rc;
    escape = !L.raw && isatty(STDOUT_FILENO);
    write_failed = 0;
    json_t *job = NULL;
    rc = count_ranks(&L);
    if (!rc) rc = read_logs(&L);
    /* The job's end: its state for --json, and with --follow its status. */
    if (!rc && (L.follow || L.x.json)) {
        char path[64];
        job_path(&L, path, sizeof path);
        rc = cli_ctl_call(&L.x, "GET", path, NULL, NULL, &job);
    }
    cli_ctl_free(&L.x);
    if (!rc && L.x.json) print_json(&L, job);
    if (!rc && L.follow) rc = cli_job_report("logs", job);
    json_decref(job);
    for (int r = 0; L.logs && r < L.nranks; r++) sh_buf_free(&L.logs[r].part), sh_buf_free(&L.logs[r].all);
    free(L.logs);
    return rc;
}
