/* The gang-start and queue-wait histograms of /metrics, by gang size: what
 * the handlers and the state observe into and metrics.c prints.  They call
 * nothing of the server. */
#include "srv_int.h"

/* Histogram bounds in seconds: starts take milliseconds to a minute, waits
 * seconds to days. */
static const double start_le[SRV_HBUCKETS] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800};
static const double wait_le[SRV_HBUCKETS] = {1, 5, 15, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 86400, 7 * 86400};
static const char *const size_label[SRV_SIZE_CLASSES] = {"1", "2-4", "5-16", "17-64", "65+"};

int srv__size_class(int nodes)
{
    return nodes <= 1 ? 0 : nodes <= 4 ? 1 : nodes <= 16 ? 2 : nodes <= 64 ? 3 : 4;
}

static void observe(srv_hist *h, const double *le, double v)
{
    int i = 0;
    while (i < SRV_HBUCKETS && v > le[i]) i++;
    h->bucket[i]++, h->n++, h->sum += v < 0 ? 0 : v;
}

void srv__observe_start(srv *s, int nodes, double seconds)
{
    observe(&s->h_start[srv__size_class(nodes)], start_le, seconds);
}

void srv__observe_wait(srv *s, int nodes, double seconds)
{
    observe(&s->h_wait[srv__size_class(nodes)], wait_le, seconds);
}

void srv__hist_print(sh_buf *b, const char *name, const char *help, const srv_hist *h, int wait)
{
    const double *le = wait ? wait_le : start_le;
    sh_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int c = 0; c < SRV_SIZE_CLASSES; c++) {
        uint64_t cum = 0;
        for (int i = 0; i <= SRV_HBUCKETS; i++) {
            cum += h[c].bucket[i];
            if (i < SRV_HBUCKETS)
                sh_buf_printf(b, "%s_bucket{nodes=\"%s\",le=\"%g\"} %llu\n", name, size_label[c], le[i],
                              (unsigned long long)cum);
            else
                sh_buf_printf(b, "%s_bucket{nodes=\"%s\",le=\"+Inf\"} %llu\n", name, size_label[c],
                              (unsigned long long)cum);
        }
        sh_buf_printf(b, "%s_sum{nodes=\"%s\"} %.6f\n%s_count{nodes=\"%s\"} %llu\n", name, size_label[c], h[c].sum,
                      name, size_label[c], (unsigned long long)h[c].n);
    }
}
