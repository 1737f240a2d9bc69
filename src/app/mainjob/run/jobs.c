/* The main job's control-plane jobs (docs/mainjob.md): their files, their
 * submission, and what is said when one fails. */
#include <stdlib.h>
#include <string.h>

#include "run_int.h"

/* The same options reach the workers through the store's trainer.json. */
static const char *const rl_opts[] = {"--warm", "70", "--eval-every", "5", "--eval-n", "48", "--max-lag", "2",
                                      "--loss", "decoupled", "--gen-cost", "12", "--ordered"};

static json_t *strings(const char *const *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_string(v[i]));
    return a;
}

static json_t *trainer_job(const mj_run_paths *p)
{
    char ev[4300], res[4300], steps[16];
    snprintf(ev, sizeof ev, "%s/events.jsonl", p->dir);
    snprintf(res, sizeof res, "%s/result.json", p->dir);
    snprintf(steps, sizeof steps, "%d", p->steps);
    const char *head[] = {p->bin, "rl", "trainer", "--store", p->store, "--events", ev, "--result", res,
                          "--steps", steps};
    json_t *cmd = strings(head, 11), *opts = strings(rl_opts, (int)(sizeof rl_opts / sizeof *rl_opts));
    json_array_extend(cmd, opts);
    json_decref(opts);
    return json_pack("{s:s,s:s,s:i,s:i,s:[s],s:i,s:s,s:[s],s:s,s:o}", "name", "rl-trainer", "kind", "gang",
                     "nodes", 2, "gpus_per_node", 1, "gpu_types", "H100", "priority", 10, "on_failure", "fail",
                     "writable", p->dir, "run", MJ_RUN_NAME, "command", cmd);
}

/* Every GPU type of the fleet with its declared speed: where the elastic
 * rollouts may grow, cheapest per unit of throughput first. */
static json_t *rollouts_job(const mj_run_paths *p)
{
    mj_fleet f;
    if (mj_fleet_load(p->fleet, p->speeds, &f) < 0) return NULL;
    json_t *types = json_array(), *speeds = json_object();
    for (int i = 0; i < f.n; i++)
        if (!json_object_get(speeds, f.nodes[i].gpu_type)) {
            json_array_append_new(types, json_string(f.nodes[i].gpu_type));
            json_object_set_new(speeds, f.nodes[i].gpu_type, json_real(f.nodes[i].speed));
        }
    mj_fleet_free(&f);
    const char *argv[] = {p->bin, "rl", "worker", "--store", p->store, "--fleet", p->fleet, "--speeds", p->speeds,
                          "--push", p->pdir};
    return json_pack("{s:s,s:s,s:i,s:i,s:i,s:o,s:o,s:[s],s:s,s:o}", "name", "rl-rollouts", "kind", "elastic",
                     "min_nodes", 1, "max_nodes", 7, "gpus_per_node", 1, "gpu_types", types, "gpu_speeds", speeds,
                     "writable", p->dir, "run", MJ_RUN_NAME, "command",
                     strings(argv, p->direct ? 9 : 11));
}

/* One rank that serves the store to the workers.  The scheduling core
 * gives every rank at least one GPU, so it takes one of the fleet's
 * cheapest type (billed like any other); it reads its zone from its node. */
static json_t *push_root_job(const mj_run_paths *p)
{
    mj_fleet f;
    if (mj_fleet_load(p->fleet, p->speeds, &f) < 0) return NULL;
    char cheapest[32] = "";
    double price = 0;
    for (int i = 0; i < f.n; i++)
        if (!cheapest[0] || f.nodes[i].price < price)
            snprintf(cheapest, sizeof cheapest, "%s", f.nodes[i].gpu_type), price = f.nodes[i].price;
    mj_fleet_free(&f);
    const char *argv[] = {p->bin, "rl", "push-root", "--store", p->store, "--fleet", p->fleet, "--push", p->pdir};
    return json_pack("{s:s,s:s,s:i,s:i,s:[s],s:i,s:s,s:[s],s:s,s:o}", "name", "rl-push-root", "kind", "gang",
                     "nodes", 1, "gpus_per_node", 1, "gpu_types", cheapest, "priority", 5, "on_failure", "fail",
                     "writable", p->dir, "run", MJ_RUN_NAME, "command", strings(argv, 9));
}

int mj_run_jobs(const mj_run_paths *p, json_t *jobs[MJ_NJOBS])
{
    jobs[0] = trainer_job(p);
    jobs[1] = rollouts_job(p);
    jobs[2] = p->direct ? NULL : push_root_job(p);
    int rc = jobs[0] && jobs[1] && (p->direct || jobs[2]) ? 0 : sh_err(SH_ENOMEM, "main job: the job files");
    for (int i = 0; !rc && i < MJ_NJOBS; i++) {
        if (!jobs[i]) continue;
        char path[4300];
        snprintf(path, sizeof path, "%s/%s.json", p->dir, json_string_value(json_object_get(jobs[i], "name")));
        rc = sh_json_write_atomic(path, jobs[i]);
    }
    if (rc)
        for (int i = 0; i < MJ_NJOBS; i++) json_decref(jobs[i]), jobs[i] = NULL;
    return rc;
}

int mj_run_submit(client_conn *c, const json_t *job, int64_t *id)
{
    json_t *reply = NULL;
    int status = 0, rc = client_call(c, "POST", "/v1/jobs", job, NULL, 30, &status, &reply);
    const char *name = json_string_value(json_object_get(job, "name"));
    if (!rc && (status != 200 && status != 201))
        rc = sh_err(SH_EIO, "main job: submitting %s: %s (HTTP %d)", name,
                    json_string_value(json_object_get(reply, "error")) ?: "refused", status);
    if (!rc) *id = json_integer_value(json_object_get(reply, "id"));
    json_decref(reply);
    return rc;
}

/* The last `keep` lines of rank r's log, each said with an indent. */
static void say_tail(client_conn *c, int64_t id, int r, int keep, mj_say_fn say, void *arg)
{
    char path[128], line[640];
    snprintf(path, sizeof path, "/v1/jobs/%lld/logs?rank=%d&offset=0", (long long)id, r);
    json_t *reply = NULL;
    int status = 0;
    if (client_call(c, "GET", path, NULL, NULL, 10, &status, &reply) < 0 || status != 200) {
        json_decref(reply);
        return;
    }
    const char *d = json_string_value(json_object_get(reply, "data")) ?: "", *p = d + strlen(d);
    for (int n = 0; p > d && n <= keep; p--) n += p[-1] == '\n' && p != d + strlen(d);
    snprintf(line, sizeof line, "last lines of job %lld rank %d:", (long long)id, r);
    say(arg, line);
    for (const char *q = p; *q;) {
        size_t n = strcspn(q, "\n");
        snprintf(line, sizeof line, "    %.*s", (int)(n < 600 ? n : 600), q);
        say(arg, line);
        q += n + (q[n] == '\n');
    }
    json_decref(reply);
}

int mj_run_check(client_conn *c, int64_t id, mj_say_fn say, void *arg)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)id);
    json_t *j = NULL;
    int status = 0;
    if (client_call(c, "GET", path, NULL, NULL, 10, &status, &j) < 0 || status != 200) {
        json_decref(j);
        return 0; /* asked again in a second */
    }
    const char *st = json_string_value(json_object_get(j, "state")) ?: "";
    if (strcmp(st, "failed") && strcmp(st, "cancelled")) {
        json_decref(j);
        return 0;
    }
    const char *reason = json_string_value(json_object_get(j, "reason")) ?: "";
    /* The rank the reason names first, then others that exited with an
     * error of their own (not those stopped by a signal when the job failed). */
    int ranks[3], n = 0;
    const char *rk = strstr(reason, "rank ");
    if (rk) ranks[n++] = atoi(rk + 5);
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(j, "members"), i, m) {
        int ec = (int)json_integer_value(json_object_get(m, "exit_code")), r = (int)json_integer_value(json_object_get(m, "rank"));
        if (n < 3 && ec > 0 && ec < 128 && !(n && ranks[0] == r)) ranks[n++] = r;
    }
    for (int k = 0; say && k < n; k++) say_tail(c, id, ranks[k], 15, say, arg);
    int rc = sh_err(SH_EIO, "job %lld (%s) %s: %s", (long long)id, json_string_value(json_object_get(j, "name")) ?: "",
                    st, reason);
    json_decref(j);
    return rc;
}

void mj_run_cancel(client_conn *c, int64_t id)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/cancel", (long long)id);
    json_t *reply = NULL;
    int status;
    client_call(c, "POST", path, NULL, NULL, 10, &status, &reply);
    json_decref(reply);
}

void mj_run_save(client_conn *c, const char *path, const char *dir, const char *name)
{
    json_t *reply = NULL;
    int status = 0;
    char p[4300];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (client_call(c, "GET", path, NULL, NULL, 10, &status, &reply) == 0 && status == 200 &&
        sh_json_write_atomic(p, reply) < 0)
        sh_warn("%s", sh_errmsg());
    json_decref(reply);
}
