/* What moved in a main job: RUN/summary.json from the trainer's result and
 * the push tree's log, and the tree as a picture.
 *
 * Inputs (docs/mainjob.md, "Run folder"): RUN/result.json (the trainer's),
 * RUN/push/root.json ({"name", "zone", "addr"} of the push root) and
 * RUN/push/tree.jsonl (one line per replica activation, src/mainjob/
 * weights.c).  A copy of a version crosses a zone when the replica that got
 * it is in another zone than the node it got it from. */
#include <stdlib.h>
#include <string.h>

#include "shoal/mainjob.h"

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
    *out = json_pack("{s:f,s:i,s:i,s:i,s:i,s:f,s:f,s:f,s:f,s:i,s:b,s:I,s:I,s:f,s:f,s:i}",
                     "versions", versions, "zones", (int)nz, "workers", (int)workers,
                     "workers_on_push_tree", (int)push, "workers_at_end", (int)at_end,
                     "delta_bytes_mean", dmean, "full_bytes", num(res, "weights_image_bytes"),
                     "trainer_bytes_sent_per_version_mean", sent,
                     "cross_zone_copies_per_version_mean", cross, "versions_in_tree_log", (int)nv,
                     "workers_identical_at_end", at_end > 0 && identical == at_end, "dropped_stale",
                     json_integer_value(json_object_get(res, "dropped_stale")), "refused_requests",
                     json_integer_value(json_object_get(res, "refused_requests")), "reward_start",
                     num(res, "reward_start"), "reward_end", num(res, "reward_end"), "final_version",
                     (int)final);
    if (*out)
        json_object_set_new(*out, "targets",
                            json_pack("{s:b,s:b,s:b}", "trainer_bytes",
                                      sent <= 1.1 * (double)(nz + 1) * dmean, "cross_zone",
                                      cross <= (double)nz, "identical",
                                      at_end > 0 && identical == at_end));
    json_decref(res), json_decref(root), json_decref(lines), json_decref(zones);
    return *out ? 0 : sh_err(SH_ENOMEM, "%s: summary", run);
}

/* ---- The tree as a picture ------------------------------------------------ */

typedef struct tnode {
    const char *name, *zone, *addr;
    int col, row;
} tnode;

static int find_node(tnode *ns, int n, const char *addr)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(ns[i].addr, addr)) return i;
    return -1;
}

static int zone_col(const char **zones, int *nz, const char *z)
{
    for (int i = 0; i < *nz; i++)
        if (!strcmp(zones[i], z)) return i;
    zones[*nz] = z;
    return (*nz)++;
}

/* Nodes: the root, then each replica address in order of its first line. */
static int tree_nodes(const json_t *root, const json_t *lines, tnode *ns, int cap, const char **zones,
                      int *nz)
{
    int n = 0;
    int rows[64] = {0};
    *nz = 0;
    if (root) {
        ns[n] = (tnode){"root", str(root, "zone"), str(root, "addr"), 0, 0};
        zone_col(zones, nz, ns[n].zone);
        rows[0] = 1;
        n++;
    }
    size_t i;
    json_t *l;
    json_array_foreach(lines, i, l) {
        if (n == cap || !str(l, "addr")[0] || find_node(ns, n, str(l, "addr")) >= 0 || *nz == 64) continue;
        int c = zone_col(zones, nz, str(l, "zone"));
        ns[n] = (tnode){str(l, "name"), str(l, "zone"), str(l, "addr"), c, rows[c]++ + (c ? 1 : 0)};
        n++;
    }
    return n;
}

int mj_tree_svg(const json_t *root, const json_t *lines, sh_buf *b)
{
    enum { CAP = 128, CW = 190, RH = 56, TOP = 40 };
    tnode ns[CAP];
    const char *zones[64];
    int nz, n = tree_nodes(root, lines, ns, CAP, zones, &nz), maxrow = 1;
    for (int i = 0; i < n; i++)
        if (ns[i].row > maxrow) maxrow = ns[i].row;
    /* Edges: (parent, child) -> versions received that way. */
    int cnt[CAP][CAP];
    memset(cnt, 0, sizeof cnt);
    int64_t vmin = INT64_MAX, vmax = 0;
    size_t i;
    json_t *l;
    json_array_foreach(lines, i, l) {
        int c = find_node(ns, n, str(l, "addr")), p = find_node(ns, n, str(l, "parent"));
        int64_t v = json_integer_value(json_object_get(l, "version"));
        if (v < vmin) vmin = v;
        if (v > vmax) vmax = v;
        if (c >= 0 && p >= 0) cnt[p][c]++;
    }
    int nv = n > 1 && vmax >= vmin ? (int)(vmax - vmin + 1) : 0;
    int W = nz * CW + 40, treeh = TOP + (maxrow + 1) * RH + 20, cell = nv ? (W - 200) / nv : 0;
    if (cell > 14) cell = 14;
    if (nv && cell < 2) cell = 2;
    int H = treeh + (nv ? 40 + (n - 1) * 16 + 30 : 0);
    SH_TRY(sh_buf_printf(b, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-family='sans-serif' font-size='11'>\n", W, H));
    SH_TRY(sh_buf_printf(b, "<text x='10' y='16' font-size='13'>The push tree: who fed whom (edge: versions received that way; red: across zones)</text>\n"));
    for (int z = 0; z < nz; z++)
        SH_TRY(sh_buf_printf(b, "<rect x='%d' y='%d' width='%d' height='%d' fill='#f4f6fa' stroke='#ccd'/><text x='%d' y='%d' fill='#556'>%s</text>\n",
                             20 + z * CW, TOP - 14, CW - 16, (maxrow + 1) * RH + 10, 26 + z * CW, TOP - 2, zones[z]));
    for (int p = 0; p < n; p++)
        for (int c = 0; c < n; c++) {
            if (!cnt[p][c]) continue;
            int x1 = 20 + ns[p].col * CW + 80, y1 = TOP + ns[p].row * RH + 30;
            int x2 = 20 + ns[c].col * CW + 80, y2 = TOP + ns[c].row * RH + 10;
            int cross = strcmp(ns[p].zone, ns[c].zone) != 0;
            SH_TRY(sh_buf_printf(b, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='%s' stroke-width='%.1f' opacity='0.7'/>"
                                 "<text x='%d' y='%d' fill='%s'>%d</text>\n",
                                 x1, y1, x2, y2, cross ? "#c33" : "#36c", 1 + 3.0 * cnt[p][c] / (nv ? nv : 1),
                                 (x1 + x2) / 2 + 3, (y1 + y2) / 2, cross ? "#c33" : "#36c", cnt[p][c]));
        }
    for (int k = 0; k < n; k++)
        SH_TRY(sh_buf_printf(b, "<rect x='%d' y='%d' width='160' height='20' rx='4' fill='%s' stroke='#445'/><text x='%d' y='%d'>%s</text>\n",
                             20 + ns[k].col * CW, TOP + ns[k].row * RH + 10, k || !root ? "#fff" : "#ffe9a8",
                             24 + ns[k].col * CW, TOP + ns[k].row * RH + 24, ns[k].name));
    if (!nv) return sh_buf_printf(b, "</svg>\n");
    /* The grid: a row per replica, a column per version; the cell's colour
     * says where that version came from. */
    int y0 = treeh + 20;
    SH_TRY(sh_buf_printf(b, "<text x='10' y='%d' font-size='13'>Per version (v%lld..v%lld): red from another zone, blue from this zone, blank not received</text>\n",
                         y0 - 4, (long long)vmin, (long long)vmax));
    for (int k = root ? 1 : 0; k < n; k++)
        SH_TRY(sh_buf_printf(b, "<text x='10' y='%d'>%s</text>\n", y0 + 12 + (k - 1) * 16, ns[k].name));
    json_array_foreach(lines, i, l) {
        int c = find_node(ns, n, str(l, "addr")), p = find_node(ns, n, str(l, "parent"));
        if (c < 1) continue;
        int64_t v = json_integer_value(json_object_get(l, "version"));
        int cross = p < 0 || strcmp(ns[p].zone, ns[c].zone) != 0;
        SH_TRY(sh_buf_printf(b, "<rect x='%d' y='%d' width='%d' height='12' fill='%s'><title>v%lld from %s</title></rect>\n",
                             180 + (int)(v - vmin) * cell, y0 + 2 + (c - 1) * 16, cell > 2 ? cell - 1 : cell,
                             cross ? "#c33" : "#36c", (long long)v, p >= 0 ? ns[p].name : str(l, "parent")));
    }
    return sh_buf_printf(b, "</svg>\n");
}
