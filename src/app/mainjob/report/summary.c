/* What moved in a main job: RUN/summary.json from the trainer's result and
 * the push tree's log, and the tree as a picture.
 *
 * Inputs (docs/mainjob.md, "Run folder"): RUN/result.json (the trainer's),
 * RUN/push/root.json ({"name", "zone", "addr"} of the push root) and
 * RUN/push/tree.jsonl (one line per replica activation, src/app/mainjob/
 * weights.c).  A copy of a version crosses a zone when the replica that got
 * it is in another zone than the node it got it from.  The picture of the
 * tree is plot.c's. */
#include <stdlib.h>
#include <string.h>

#include "report_int.h"

static double num(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }
static const char *str(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

int mj_run_lines(const char *path, json_t **out)
{
    json_t *a = json_array();
    *out = a;
    if (!sh_path_exists(path)) return 0;
    char *text;
    size_t len;
    SH_TRY(sh_read_file(path, 256 << 20, &text, &len));
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        json_t *j = json_loads(l, 0, NULL);
        if (j) json_array_append_new(a, j); /* a torn last line (a killed writer) is skipped */
    }
    free(text);
    return 0;
}

/* addr -> zone of every node of the tree: the root and each replica. */
static json_t *zones_by_addr(const json_t *root, const json_t *lines)
{
    json_t *z = json_object();
    if (root) json_object_set_new(z, str(root, "addr"), json_string(str(root, "zone")));
    size_t i;
    json_t *l;
    json_array_foreach(lines, i, l)
        if (str(l, "addr")[0]) json_object_set_new(z, str(l, "addr"), json_string(str(l, "zone")));
    return z;
}

int mj_tree_load(const char *run, json_t **root, json_t **lines)
{
    char p[4096];
    *root = NULL;
    snprintf(p, sizeof p, "%s/push/root.json", run);
    if (sh_path_exists(p)) SH_TRY(sh_json_load_file(p, 1 << 20, root));
    snprintf(p, sizeof p, "%s/push/tree.jsonl", run);
    int rc = mj_run_lines(p, lines);
    if (rc < 0) json_decref(*root), *root = NULL;
    return rc;
}

/* Copies that crossed a zone, per store version present in the log. */
static double cross_zone_mean(const json_t *root, const json_t *lines, long *nversions)
{
    json_t *z = zones_by_addr(root, lines), *seen = json_object();
    long cross = 0;
    size_t i;
    json_t *l;
    json_array_foreach(lines, i, l) {
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)json_integer_value(json_object_get(l, "store_version")));
        json_object_set_new(seen, v, json_true());
        const char *pz = json_string_value(json_object_get(z, str(l, "parent")));
        cross += !pz || strcmp(pz, str(l, "zone")) != 0; /* an unknown parent counts as crossing */
    }
    *nversions = (long)json_object_size(seen);
    json_decref(z), json_decref(seen);
    return *nversions ? (double)cross / (double)*nversions : 0;
}

int mj_summary(const char *run, json_t **out)
{
    char p[4096];
    *out = NULL;
    snprintf(p, sizeof p, "%s/result.json", run);
    json_t *res = NULL, *root = NULL, *lines = NULL;
    SH_TRY(sh_json_load_file(p, 64 << 20, &res));
    int rc = mj_tree_load(run, &root, &lines);
    if (rc < 0) {
        json_decref(res);
        return rc;
    }
    json_t *ws = json_object_get(res, "workers"), *w, *zones = json_object();
    const char *want = str(res, "final_image_xxh3");
    long final = (long)json_integer_value(json_object_get(res, "final_version"));
    long workers = (long)json_array_size(ws), push = 0, at_end = 0, identical = 0;
    size_t i;
    json_array_foreach(ws, i, w) {
        push += json_is_true(json_object_get(w, "push"));
        json_t *f = json_object_get(w, "final");
        if (!json_is_object(f)) continue; /* left before the end (killed) */
        at_end++;
        identical += json_integer_value(json_object_get(f, "version")) == final &&
                     !strcmp(str(f, "image_xxh3"), want);
    }
    json_array_foreach(lines, i, w) json_object_set_new(zones, str(w, "zone"), json_true());
    long nv = 0;
    double versions = num(res, "store_versions");
    double cross = cross_zone_mean(root, lines, &nv);
    double sent = versions > 0 ? (num(res, "store_bytes_total") + num(res, "weights_bytes_sent")) / versions : 0;
    double dmean = num(res, "weights_delta_bytes_mean");
    long nz = (long)json_object_size(zones);
    /* Counts are integers (versions, bytes, workers); means and rewards are
     * reals. */
    *out = json_pack("{s:I,s:i,s:i,s:i,s:i,s:f,s:I,s:f,s:f,s:i,s:b,s:I,s:I,s:f,s:f,s:i}",
                     "versions", (json_int_t)versions, "zones", (int)nz, "workers", (int)workers,
                     "workers_on_push_tree", (int)push, "workers_at_end", (int)at_end,
                     "delta_bytes_mean", dmean, "full_bytes", (json_int_t)num(res, "weights_image_bytes"),
                     "trainer_bytes_sent_per_version_mean", sent,
                     "cross_zone_copies_per_version_mean", cross, "versions_in_tree_log", (int)nv,
                     "workers_identical_at_end", at_end > 0 && identical == at_end, "dropped_stale",
                     json_integer_value(json_object_get(res, "dropped_stale")), "refused_requests",
                     json_integer_value(json_object_get(res, "refused_requests")), "reward_start",
                     num(res, "reward_start"), "reward_end", num(res, "reward_end"), "final_version",
                     (int)final);
    /* A direct worker got each version from the trainer itself: its copies
     * are in trainer_bytes_sent, not in the tree's log. */
    if (*out) json_object_set_new(*out, "workers_direct", json_integer(workers - push));
    if (*out)
        json_object_set_new(*out, "targets",
                            json_pack("{s:b,s:b,s:b}", "trainer_bytes",
                                      sent <= 1.1 * (double)(nz + 1) * dmean, "cross_zone",
                                      cross <= (double)nz, "identical",
                                      at_end > 0 && identical == at_end));
    json_decref(res), json_decref(root), json_decref(lines), json_decref(zones);
    return *out ? 0 : sh_err(SH_ENOMEM, "%s: summary", run);
}
