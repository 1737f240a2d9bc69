/* Watching a main job's run folder (`shoal rl report --watch`, `shoal run`):
 * one line per training step and evaluation from RUN/events.jsonl, and the
 * server's billing (GET /v1/costs) appended to RUN/costs.jsonl, which the
 * report then plots. */
#include <stdlib.h>
#include <string.h>

#include "app/mainjob/mainjob.h"
#include "app/mainjob/report/report_int.h"

static double num(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

/* One billing sample: total and per GPU type, appended to costs.jsonl. */
static void sample_cost(mj_watch *w)
{
    json_t *reply = NULL;
    int status = 0;
    if (!w->client || client_call(w->client, "GET", "/v1/costs", NULL, NULL, 5, &status, &reply) < 0 || !reply ||
        status != 200) {
        json_decref(reply);
        return;
    }
    json_t *by = json_object(), *ten, *types;
    const char *tn, *ty;
    json_object_foreach(json_object_get(reply, "by_tenant"), tn, ten) json_object_foreach(ten, ty, types) {
        double prev = json_number_value(json_object_get(by, ty));
        json_object_set_new(by, ty, json_real(prev + num(types, "dollars")));
    }
    w->total = num(reply, "total_dollars");
    json_t *s = json_pack("{s:f,s:f,s:o}", "t", sh_now_wall(), "total", w->total, "by_type", by);
    char p[4200], *line = json_dumps(s, JSON_COMPACT);
    snprintf(p, sizeof p, "%s/costs.jsonl", w->dir);
    FILE *f = fopen(p, "a");
    if (f && line) fprintf(f, "%s\n", line);
    if (f) fclose(f);
    free(line);
    json_decref(s), json_decref(reply);
}

static void say_event(const mj_watch *w, const json_t *e)
{
    char line[512], d[32], f[32], st[64] = "";
    const char *k = json_string_value(json_object_get(e, "event")) ?: "";
    if (strcmp(k, "step")) {
        snprintf(line, sizeof line, "eval  step %3lld  held-out reward %.3f",
                 (long long)json_integer_value(json_object_get(e, "step")), num(e, "reward"));
        w->say(w->arg, line);
        return;
    }
    json_t *h = json_object_get(e, "staleness");
    for (size_t i = 0, o = 0; i < json_array_size(h) && o < sizeof st - 12; i++)
        o += (size_t)snprintf(st + o, sizeof st - o, "%s%zu:%lld", i ? " " : "", i,
                              (long long)json_integer_value(json_array_get(h, i)));
    snprintf(line, sizeof line, "step %3lld  v%-3lld reward %.3f  staleness [%s]  delta %s vs full %s  cost $%.4f",
             (long long)json_integer_value(json_object_get(e, "step")),
             (long long)json_integer_value(json_object_get(e, "version")), num(e, "reward"), st,
             sh_fmt_bytes(num(e, "delta_bytes"), d, sizeof d), sh_fmt_bytes(num(e, "image_bytes"), f, sizeof f),
             w->total);
    w->say(w->arg, line);
}

int mj_watch_step(mj_watch *w)
{
    char ev[4200], res[4200], tj[4200];
    snprintf(ev, sizeof ev, "%s/events.jsonl", w->dir);
    snprintf(res, sizeof res, "%s/result.json", w->dir);
    snprintf(tj, sizeof tj, "%s/store/trainer.json", w->dir);
    int done = sh_path_exists(res);
    sample_cost(w);
    json_t *evs = NULL;
    if (mj_run_lines(ev, &evs) < 0) evs = json_array();
    for (; w->seen < json_array_size(evs); w->seen++)
        if (w->say) say_event(w, json_array_get(evs, w->seen));
    json_decref(evs);
    if (done) return 1;
    json_t *t = NULL;
    if (sh_path_exists(tj) && sh_json_load_file(tj, 1 << 20, &t) == 0) {
        const char *st = json_string_value(json_object_get(t, "state"));
        int failed = st && !strcmp(st, "failed");
        json_decref(t);
        if (failed) return sh_err(SH_EIO, "the trainer failed: see `shoal logs` of its job and %s", w->dir);
    }
    return 0;
}

int mj_watch_run(mj_watch *w, double timeout_s)
{
    double deadline = sh_now_mono() + timeout_s;
    if (w->say) w->say(w->arg, "waiting for the trainer gang and the rollout workers (warm start first)...");
    for (;;) {
        int rc = mj_watch_step(w);
        if (rc) return rc < 0 ? rc : 0;
        if (sh_now_mono() > deadline)
            return sh_err(SH_ETIMEDOUT, "no result in %s after %.0f s: see `shoal jobs` and `shoal logs`", w->dir,
                          timeout_s);
        sh_sleep(1.0);
    }
}
