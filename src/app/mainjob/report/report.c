/* The main job's HTML report (RUN/report.html) and RUN/summary.json.
 *
 * It reads what the run directory holds (docs/mainjob.md): the trainer's
 * events.jsonl (one JSON object per step and evaluation) and result.json,
 * the push tree's log (push/root.json, push/tree.jsonl), fleet-cost.json
 * when the cost experiment ran, and costs.jsonl, which `shoal rl report
 * --watch` appends to from the server's billing once a second.  The report
 * is one self-contained HTML page with inline SVG plots (plot.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "report_int.h"

static json_t *load_lines(const char *path)
{
    json_t *a = NULL;
    if (mj_run_lines(path, &a) < 0) return json_array();
    return a;
}

static json_t *load_json(const char *dir, const char *name)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    json_t *j = NULL;
    if (sh_path_exists(p)) sh_json_load_file(p, 64 << 20, &j);
    return j;
}

static double num(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

/* Dollars billed by wall time t, interpolated between cost samples. */
static double cost_at(const json_t *costs, double t)
{
    size_t n = json_array_size(costs);
    if (!n) return 0;
    double pt = 0, pc = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(costs, i);
        double st = num(s, "t"), sc = num(s, "total");
        if (st >= t) return i == 0 ? sc : pc + (sc - pc) * (t - pt) / (st - pt > 0 ? st - pt : 1);
        pt = st, pc = sc;
    }
    return pc;
}

typedef struct run_data {
    json_t *events, *costs, *result, *fleet_cost;
    json_t *summary, *tree_root, *tree_lines; /* what moved, and the push tree's log */
} run_data;

static void series_from(json_t *events, const char *kind, const char *xkey, const char *ykey, double t0,
                        const json_t *costs, mj_series *s)
{
    size_t n = json_array_size(events), k = 0;
    s->x = calloc(n + 1, sizeof(double)), s->y = calloc(n + 1, sizeof(double));
    for (size_t i = 0; i < n && s->x && s->y; i++) {
        json_t *e = json_array_get(events, i);
        if (strcmp(json_string_value(json_object_get(e, "event")) ?: "", kind)) continue;
        double x = !strcmp(xkey, "cost") ? cost_at(costs, num(e, "t")) : !strcmp(xkey, "t") ? num(e, "t") - t0 : num(e, xkey);
        s->x[k] = x, s->y[k++] = num(e, ykey);
    }
    s->n = (int)k;
}

/* "L4:1 L40S:3 A100:4": prompts per request per GPU type. */
static void per_type(sh_buf *b, const json_t *p)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)json_object_get(p, "per_type"), k, v) {
        long long n = json_integer_value(json_object_get(v, "request_prompts"));
        sh_buf_printf(b, "%s: %lld prompt%s, %lld at once<br>", k, n, n == 1 ? "" : "s",
                      (long long)json_integer_value(json_object_get(v, "concurrency")));
    }
}

static void fleet_cost_table(sh_buf *b, const json_t *fc)
{
    if (!fc) {
        sh_buf_printf(b, "<p>The fleet-cost experiment did not run (<code>SHOAL_RUN_FLEET_COST=0</code>).</p>\n");
        return;
    }
    sh_buf_printf(b, "<h2>Fleet cost: the same training to the same reward on three rollout pools</h2>\n"
                     "<p><code>build/shoal rl fleet-cost --json</code>: %s.  Billing in emulated GPU seconds "
                     "counted from the work done (docs/mainjob.md); means over seeds, min..max in brackets.</p>\n"
                     "<table><tr><th>pool</th><th>workers</th><th>per type</th><th>rollout $/h</th>"
                     "<th>reached</th><th>steps</th><th>reward end</th><th>accepted traj</th><th>emulated s</th>"
                     "<th>rollout cost $</th><th>$ per 1k accepted</th><th>total $ (with trainer)</th>"
                     "<th>dropped as stale</th></tr>\n",
                  json_string_value(json_object_get(fc, "setup")) ?: "");
    const char *names[] = {"uniform", "mixed", "tuned"};
    double v[3];
    for (int i = 0; i < 3; i++) {
        json_t *p = json_object_get(fc, names[i]), *sp = json_object_get(json_object_get(p, "spread"), "cost");
        v[i] = num(p, "cost");
        if (!p) continue;
        sh_buf_printf(b, "<tr><td>%s</td><td>%s</td><td>", names[i], json_string_value(json_object_get(p, "workers")) ?: "");
        per_type(b, p);
        sh_buf_printf(b, "</td><td>%.2f</td><td>%lld/%lld</td><td>%.1f</td><td>%.3f</td><td>%.0f</td><td>%.1f</td>"
                         "<td>%.4f (%.4f..%.4f)</td><td>%.4f</td><td>%.4f</td><td>%.1f%%</td></tr>\n",
                      num(p, "rollout_per_h"), (long long)json_integer_value(json_object_get(p, "reached")),
                      (long long)json_integer_value(json_object_get(fc, "seeds")), num(p, "steps"),
                      num(p, "reward_end"), num(p, "trajectories"), num(p, "emulated_s"), v[i], num(sp, "min"),
                      num(sp, "max"), num(p, "cost_per_1k_trajectories"), num(p, "total_cost"),
                      100 * num(p, "dropped_stale_frac"));
    }
    sh_buf_printf(b, "</table><p>mixed saving (1 &minus; mixed/uniform rollout cost): <b>%.1f%%</b>; "
                     "tuned saving: <b>%.1f%%</b>; tuned against mixed: <b>%.1f%%</b>; on total cost (trainer "
                     "included): %.1f%% and %.1f%%.</p>\n",
                  100 * num(fc, "mixed_saving"), 100 * num(fc, "tuned_saving"), 100 * num(fc, "tuned_vs_mixed"),
                  100 * num(fc, "mixed_saving_total"), 100 * num(fc, "tuned_saving_total"));
    const json_t *mp = json_object_get(fc, "mixed_saving_paired"), *tp = json_object_get(fc, "tuned_vs_mixed_paired");
    if (mp && tp)
        sh_buf_printf(b, "<p>Paired by seed (each seed's runs compared, then averaged over %lld seeds): mixed saving "
                         "<b>%.1f%% &plusmn; %.1f%%</b> (standard error; per seed %.1f%%..%.1f%%), tuned against "
                         "mixed %.1f%% &plusmn; %.1f%%.</p>\n",
                      (long long)json_integer_value(json_object_get(mp, "n")), 100 * num(mp, "mean"),
                      100 * num(mp, "se"), 100 * num(mp, "min"), 100 * num(mp, "max"), 100 * num(tp, "mean"),
                      100 * num(tp, "se"));
    mj_plot_bars(b, "Fleet cost: rollout cost to the target reward, mean over seeds", "$", names, v, 3);
}

static void summary_table(sh_buf *b, const run_data *d)
{
    const json_t *r = d->result;
    sh_buf_printf(b, "<table><tr><th>trainer</th><td>%lld ranks (H100 gang), ranks' weights equal: %s, "
                     "ring all-reduce and batches: %.1f MiB sent by rank 0</td></tr>",
                  (long long)json_integer_value(json_object_get(r, "ranks")),
                  json_is_true(json_object_get(r, "ranks_in_sync")) ? "yes" : "NO",
                  num(r, "ring_bytes_sent_rank0") / 1048576.0);
    sh_buf_printf(b, "<tr><th>held-out reward</th><td>%.3f &rarr; %.3f in %lld steps, %.1f s</td></tr>",
                  num(r, "reward_start"), num(r, "reward_end"),
                  (long long)json_integer_value(json_object_get(r, "steps")), num(r, "wall_s"));
    json_t *h = json_object_get(r, "staleness_hist");
    sh_buf_printf(b, "<tr><th>staleness (versions behind, trajectories)</th><td>");
    for (size_t i = 0; i < json_array_size(h); i++)
        sh_buf_printf(b, "%zu: %lld &nbsp; ", i, (long long)json_integer_value(json_array_get(h, i)));
    sh_buf_printf(b, "(bound %lld; dropped stale %lld)</td></tr>", (long long)json_integer_value(json_object_get(r, "max_lag")),
                  (long long)json_integer_value(json_object_get(r, "dropped_stale")));
    sh_buf_printf(b, "<tr><th>weights</th><td>%lld versions in the store; deltas %.1f KiB in all vs %.1f KiB "
                     "as full images (%.1fx less)</td></tr>",
                  (long long)json_integer_value(json_object_get(r, "store_versions")),
                  num(r, "delta_bytes_total") / 1024, num(r, "full_bytes_total") / 1024,
                  num(r, "full_bytes_total") / fmax(num(r, "delta_bytes_total"), 1));
    const json_t *m = d->summary;
    if (m)
        sh_buf_printf(b, "<tr><th>what moved (summary.json)</th><td>%lld workers in %lld zones, %lld of them on "
                         "the push tree; per version the trainer sent %.1f KiB (delta %.1f KiB, full image "
                         "%.1f KiB; target &le; 1.1 &times; (zones + 1) &times; delta: %s); %.2f copies "
                         "crossed a zone per version (target &le; %lld: %s); workers identical at the end: "
                         "%s; requests refused and asked again: %lld</td></tr>",
                      (long long)json_integer_value(json_object_get(m, "workers")),
                      (long long)json_integer_value(json_object_get(m, "zones")),
                      (long long)json_integer_value(json_object_get(m, "workers_on_push_tree")),
                      num(m, "trainer_bytes_sent_per_version_mean") / 1024, num(m, "delta_bytes_mean") / 1024,
                      num(m, "full_bytes") / 1024,
                      json_is_true(json_object_get(json_object_get(m, "targets"), "trainer_bytes")) ? "met" : "MISSED",
                      num(m, "cross_zone_copies_per_version_mean"),
                      (long long)json_integer_value(json_object_get(m, "zones")),
                      json_is_true(json_object_get(json_object_get(m, "targets"), "cross_zone")) ? "met" : "MISSED",
                      json_is_true(json_object_get(m, "workers_identical_at_end")) ? "yes" : "NO",
                      (long long)json_integer_value(json_object_get(m, "refused_requests")));
    sh_buf_printf(b, "<tr><th>workers</th><td>");
    size_t i;
    json_t *w;
    int conv = 0, n = 0;
    json_array_foreach(json_object_get(r, "workers"), i, w) {
        json_t *f = json_object_get(w, "final");
        int ok = json_is_object(f) && json_integer_value(json_object_get(f, "version")) ==
                                          json_integer_value(json_object_get(r, "final_version"));
        conv += ok, n++;
        sh_buf_printf(b, "%s (%lld traj, final v%lld) &nbsp; ", json_string_value(json_object_get(w, "name")),
                      (long long)json_integer_value(json_object_get(w, "trajectories")),
                      json_is_object(f) ? (long long)json_integer_value(json_object_get(f, "version")) : -1LL);
    }
    sh_buf_printf(b, "<br>%d of %d at the last version (%lld)</td></tr></table>\n", conv, n,
                  (long long)json_integer_value(json_object_get(r, "final_version")));
}

static int write_report(const char *dir, const run_data *d)
{
    sh_buf b = {0};
    sh_buf_printf(&b, "<!doctype html><html><head><meta charset='utf-8'><title>shoal main job</title><style>"
                      "body{font-family:sans-serif;margin:24px;max-width:1120px}svg{margin:6px;border:1px solid #eee}"
                      "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;"
                      "text-align:left;font-size:13px}</style></head><body>\n<h1>shoal: asynchronous RL on a mixed fleet</h1>\n");
    double t0 = 0;
    json_t *e0 = json_array_get(d->events, 0);
    if (e0) t0 = num(e0, "t") - num(e0, "wall_s");
    if (d->result) summary_table(&b, d);
    mj_series s[4] = {{"held-out reward", "#c0392b"}, {"batch reward", "#7fb3d5"}};
    series_from(d->events, "eval", "t", "reward", t0, d->costs, &s[0]);
    series_from(d->events, "step", "t", "reward", t0, d->costs, &s[1]);
    mj_series c[2] = {{"held-out reward", "#c0392b"}, {"batch reward", "#7fb3d5"}};
    series_from(d->events, "eval", "cost", "reward", t0, d->costs, &c[0]);
    series_from(d->events, "step", "cost", "reward", t0, d->costs, &c[1]);
    /* The held-out reward before RL (the result's reward_start) opens both curves. */
    if (d->result && s[0].x && c[0].x) {
        memmove(s[0].x + 1, s[0].x, sizeof(double) * (size_t)s[0].n);
        memmove(s[0].y + 1, s[0].y, sizeof(double) * (size_t)s[0].n);
        s[0].x[0] = 0, s[0].y[0] = num(d->result, "reward_start"), s[0].n++;
        memmove(c[0].x + 1, c[0].x, sizeof(double) * (size_t)c[0].n);
        memmove(c[0].y + 1, c[0].y, sizeof(double) * (size_t)c[0].n);
        c[0].x[0] = cost_at(d->costs, t0), c[0].y[0] = s[0].y[0], c[0].n++;
    }
    mj_plot_lines(&b, "Reward against wall-clock time", "seconds", "reward", s, 2, 1.0);
    mj_plot_lines(&b, "Reward against cost (fleet billing)", "dollars", "reward", c, 2, 1.0);
    /* Cost by GPU type: the last billing sample. */
    json_t *last = json_array_get(d->costs, json_array_size(d->costs) - 1);
    json_t *bt = json_object_get(last, "by_type");
    const char *names[16];
    double v[16];
    int n = 0;
    const char *k;
    json_t *x;
    json_object_foreach(bt, k, x) if (n < 16) names[n] = k, v[n++] = json_number_value(x);
    mj_plot_bars(&b, "Cost by GPU type (fleet billing)", "$", names, v, n);
    mj_series m[2] = {{"full images", "#999"}, {"deltas sent", "#27ae60"}};
    series_from(d->events, "step", "step", "full_bytes_total", t0, d->costs, &m[0]);
    series_from(d->events, "step", "step", "delta_bytes_total", t0, d->costs, &m[1]);
    for (int i = 0; i < m[0].n; i++) m[0].y[i] /= 1024;
    for (int i = 0; i < m[1].n; i++) m[1].y[i] /= 1024;
    mj_plot_lines(&b, "Bytes per worker per version, cumulative (KiB)", "step", "KiB", m, 2, 0);
    if (d->tree_lines && json_array_size(d->tree_lines)) mj_tree_svg(d->tree_root, d->tree_lines, &b);
    fleet_cost_table(&b, d->fleet_cost);
    sh_buf_printf(&b, "<p>Produced by <code>make run</code> (<code>shoal run</code>); regenerate with "
                      "<code>build/shoal rl report --dir %s</code>.</p></body></html>\n", dir);
    for (int i = 0; i < 2; i++) free(s[i].x), free(s[i].y), free(c[i].x), free(c[i].y), free(m[i].x), free(m[i].y);
    char p[4096];
    snprintf(p, sizeof p, "%s/report.html", dir);
    int rc = sh_write_atomic(p, b.data, b.len);
    sh_buf_free(&b);
    return rc;
}

int mj_report_write(const char *dir, json_t **summary_out)
{
    char p[4096];
    *summary_out = NULL;
    snprintf(p, sizeof p, "%s/events.jsonl", dir);
    run_data d = {.events = load_lines(p), .result = load_json(dir, "result.json"),
                  .fleet_cost = load_json(dir, "fleet-cost.json")};
    snprintf(p, sizeof p, "%s/costs.jsonl", dir);
    d.costs = load_lines(p);
    int rc = d.result ? 0 : sh_err(SH_ENOENT, "%s/result.json: no result yet (did the trainer finish?)", dir);
    if (!rc) rc = mj_tree_load(dir, &d.tree_root, &d.tree_lines);
    if (!rc) rc = mj_summary(dir, &d.summary);
    snprintf(p, sizeof p, "%s/summary.json", dir);
    if (!rc) rc = sh_json_write_atomic(p, d.summary);
    if (!rc) rc = write_report(dir, &d);
    json_decref(d.events), json_decref(d.result), json_decref(d.fleet_cost), json_decref(d.costs);
    json_decref(d.tree_root), json_decref(d.tree_lines);
    if (rc < 0) json_decref(d.summary);
    else *summary_out = d.summary;
    return rc;
}
