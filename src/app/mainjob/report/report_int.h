/* shoal mainjob, report/: what moved (summary.json), the push tree's
 * picture and every plot of the project's reports (the main job's, the RL
 * sweep's).  The report itself (mj_report_write) is in mainjob.h. */
#ifndef SHOAL_MJ_REPORT_INT_H
#define SHOAL_MJ_REPORT_INT_H

#include <stddef.h>
#include <stdint.h>

#include "shoal/common.h"
#include "shoal/rl.h"
#include "app/mainjob/mainjob.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

/* ---- What moved (summary.c) ----------------------------------------------
 * mj_summary: RUN/summary.json's object (docs/mainjob.md) from
 * RUN/result.json and the push tree's log; the caller owns *out.
 * mj_tree_load: RUN/push/root.json (NULL when missing) and the lines of
 * RUN/push/tree.jsonl.  mj_tree_svg: the tree (who fed whom, and per
 * version) as an SVG appended to b.  mj_run_lines: a JSON-lines file as an
 * array (a missing file: empty). */
int mj_summary(const char *run, json_t **out);
int mj_tree_load(const char *run, json_t **root, json_t **lines);
int mj_tree_svg(const json_t *root, const json_t *lines, sh_buf *b);
int mj_run_lines(const char *path, json_t **out);

/* ---- Plots and the report (plot.c, report.c) -----------------------------
 * Every picture of the project's reports (the main job's report, the RL
 * sweep) is drawn here.  mj_plot appends one <svg> line plot of ns series
 * to b; mj_plot_lines is its short form (y from 0 up to ymax_fixed or a
 * round maximum); mj_plot_bars a bar chart.  Tick labels are plain numbers
 * (1.5k, 20k, 3M: never 1e+04).
 * mj_report_write writes RUN/summary.json and RUN/report.html from what the
 * run folder holds and hands back the summary (caller owns it). */
typedef struct mj_series {
    const char *name, *color; /* name NULL: no legend entry */
    double *x, *y;
    int n;
    const double *err; /* optional: +- error bar at each point */
    int dashed;
    double dx;         /* horizontal offset in pixels (series sharing a category) */
} mj_series;

typedef struct mj_axes {
    const char *title, *xlabel, *ylabel;
    double ymin, ymax;           /* ymin == ymax: from 0 to a round maximum of the data */
    const char *const *xcats;    /* categorical x axis: labels of x = 0..ncats-1 */
    int ncats;
    double width, height;        /* 0: 520 x 300 */
    const char *const *notes;    /* lines under the legend */
    int nnotes;
    int standalone;              /* a whole .svg file (xmlns, white background) */
} mj_axes;

void mj_plot(sh_buf *b, const mj_axes *a, const mj_series *s, int ns);
void mj_plot_lines(sh_buf *b, const char *title, const char *xl, const char *yl, const mj_series *s, int ns,
                   double ymax_fixed);
void mj_plot_bars(sh_buf *b, const char *title, const char *unit, const char *const *names, const double *v,
                  int n);


#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
