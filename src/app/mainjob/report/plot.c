/* SVG plots for the main job's reports: line plots, bar charts and (in
 * summary.c) the push tree.  Every plot is one self-contained <svg> element
 * appended to an HTML buffer.  The push tree's picture reads the tree log
 * (summary.c, docs/mainjob.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report_int.h"

static double nice_max(double v)
{
    if (!(v > 0)) return 1;
    double p = pow(10, floor(log10(v)));
    for (double m = 1; m <= 10; m += m < 2 ? 1 : m < 5 ? 3 : 5)
        if (m * p >= v) return m * p;
    return 10 * p;
}

/* A tick label without exponents: 0.25, 12, 1.5k, 20k, 3M. */
static void tick(double v, char *out, size_t cap)
{
    double a = fabs(v);
    if (a >= 1e9) snprintf(out, cap, "%.3gG", v / 1e9);
    else if (a >= 1e6) snprintf(out, cap, "%.3gM", v / 1e6);
    else if (a >= 1e4) snprintf(out, cap, "%.3gk", v / 1e3);
    else if (a >= 100 || a == 0) snprintf(out, cap, "%.0f", v);
    else snprintf(out, cap, "%.3g", v);
}

void mj_plot(sh_buf *b, const mj_axes *a, const mj_series *s, int ns)
{
    const double W = a->width > 0 ? a->width : 520, H = a->height > 0 ? a->height : 300;
    const double L = 60, R = a->standalone ? 150 : 20, T = 30, B = 45;
    const double pw = W - L - R, ph = H - T - B;
    double xmax = 0, ymin = a->ymin, ymax = a->ymax;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++) {
            if (s[k].x[i] > xmax) xmax = s[k].x[i];
            if (a->ymin == a->ymax && s[k].y[i] > ymax) ymax = s[k].y[i];
        }
    if (a->ymin == a->ymax) ymin = 0, ymax = nice_max(ymax);
    if (!(ymax > ymin)) ymax = ymin + 1;
    xmax = a->ncats ? a->ncats : nice_max(xmax);
#define PX(v) (a->ncats ? L + pw * ((v) + 0.5) / xmax : L + pw * (v) / xmax)
#define PY(v) (T + ph - ph * (fmin(fmax((v), ymin), ymax) - ymin) / (ymax - ymin))
    if (a->standalone)
        sh_buf_printf(b, "<svg xmlns='http://www.w3.org/2000/svg' width='%g' height='%g' viewBox='0 0 %g %g' "
                         "font-family='sans-serif' font-size='11'><rect width='100%%' height='100%%' fill='white'/>",
                      W, H, W, H);
    else
        sh_buf_printf(b, "<svg width='%g' height='%g' viewBox='0 0 %g %g' font-family='sans-serif' font-size='11'>",
                      W, H, W, H);
    sh_buf_printf(b, "<text x='%g' y='18' font-size='13' font-weight='bold'>%s</text>", L, a->title);
    char lab[32];
    for (int t = 0; t <= 5; t++) {
        double v = ymin + (ymax - ymin) * t / 5;
        tick(v, lab, sizeof lab);
        sh_buf_printf(b, "<line x1='%g' y1='%.1f' x2='%g' y2='%.1f' stroke='#ddd'/>"
                         "<text x='%g' y='%.1f' text-anchor='end'>%s</text>",
                      L, PY(v), L + pw, PY(v), L - 5, PY(v) + 4, lab);
        if (!a->ncats) {
            tick(xmax * t / 5, lab, sizeof lab);
            sh_buf_printf(b, "<text x='%.1f' y='%g' text-anchor='middle'>%s</text>", PX(xmax * t / 5), T + ph + 15, lab);
        }
    }
    for (int c = 0; c < a->ncats; c++)
        sh_buf_printf(b, "<text x='%.1f' y='%g' text-anchor='middle'>%s</text>", PX((double)c), T + ph + 15,
                      a->xcats[c]);
    sh_buf_printf(b, "<line x1='%g' y1='%g' x2='%g' y2='%g' stroke='#333'/>"
                     "<line x1='%g' y1='%g' x2='%g' y2='%g' stroke='#333'/>"
                     "<text x='%g' y='%g' text-anchor='middle'>%s</text>"
                     "<text transform='translate(14,%g) rotate(-90)' text-anchor='middle'>%s</text>",
                  L, T + ph, L + pw, T + ph, L, T, L, T + ph, L + pw / 2, H - 8, a->xlabel, T + ph / 2, a->ylabel);
    int legend = 0;
    for (int k = 0; k < ns; k++) {
        const mj_series *q = &s[k];
        sh_buf_printf(b, "<polyline fill='none' stroke='%s' stroke-width='2'%s points='", q->color,
                      q->dashed ? " stroke-dasharray='5,3'" : "");
        for (int i = 0; i < q->n; i++) sh_buf_printf(b, "%.1f,%.1f ", PX(q->x[i]) + q->dx, PY(q->y[i]));
        sh_buf_printf(b, "'/>");
        for (int i = 0; q->err && i < q->n; i++) {
            double x = PX(q->x[i]) + q->dx;
            sh_buf_printf(b, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='%s'/>"
                             "<circle cx='%.1f' cy='%.1f' r='2.5' fill='%s'/>",
                          x, PY(q->y[i] - q->err[i]), x, PY(q->y[i] + q->err[i]), q->color, x, PY(q->y[i]), q->color);
        }
        if (!q->name) continue;
        double lx = a->standalone ? L + pw + 10 : L + pw - 150, ly = T + 4 + 15.0 * legend++;
        sh_buf_printf(b, "<rect x='%g' y='%g' width='10' height='10' fill='%s'/><text x='%g' y='%g'>%s</text>", lx, ly,
                      q->color, lx + 15, ly + 9, q->name);
    }
    for (int i = 0; i < a->nnotes; i++)
        sh_buf_printf(b, "<text x='%g' y='%g'>%s</text>", a->standalone ? L + pw + 10 : L + pw - 150,
                      T + 13 + 15.0 * (legend + 1 + i), a->notes[i]);
    sh_buf_printf(b, "</svg>\n");
#undef PX
#undef PY
}

void mj_plot_lines(sh_buf *b, const char *title, const char *xl, const char *yl, const mj_series *s, int ns,
                   double ymax_fixed)
{
    mj_axes a = {.title = title, .xlabel = xl, .ylabel = yl, .ymax = ymax_fixed};
    mj_plot(b, &a, s, ns);
}

void mj_plot_bars(sh_buf *b, const char *title, const char *unit, const char *const *names, const double *v, int n)
{
    const double W = 520, H = 300, L = 60, T = 30, B = 45;
    double vmax = 0;
    for (int i = 0; i < n; i++) vmax = v[i] > vmax ? v[i] : vmax;
    vmax = nice_max(vmax);
    sh_buf_printf(b, "<svg width='%g' height='%g' font-family='sans-serif' font-size='11'>"
                     "<text x='%g' y='18' font-size='13' font-weight='bold'>%s</text>", W, H, L, title);
    double bw = n ? (W - L - 20) / n : 0;
    char lab[32];
    for (int i = 0; i < n; i++) {
        double h = (H - T - B) * v[i] / vmax, x = L + bw * i + bw * 0.15;
        tick(v[i], lab, sizeof lab);
        sh_buf_printf(b, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='#4a7ebb'/>"
                         "<text x='%.1f' y='%.1f' text-anchor='middle'>%s</text>"
                         "<text x='%.1f' y='%.1f' text-anchor='middle'>%s%s</text>",
                      x, H - B - h, bw * 0.7, h, x + bw * 0.35, H - B + 15, names[i], x + bw * 0.35,
                      H - B - h - 4, unit, lab);
    }
    sh_buf_printf(b, "<line x1='%g' y1='%g' x2='%g' y2='%g' stroke='#333'/></svg>\n", L, H - B, W - 20, H - B);
}

static const char *str(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
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
