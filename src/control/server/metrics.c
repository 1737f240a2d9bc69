/* GET /metrics: the Prometheus text (docs/server-api.md).  The gang-start
 * and queue-wait histograms it prints are hist.c's. */
#include "srv_int.h"
#include "state_int.h"
#include "handlers_int.h"

/* Per-tenant cost counters: the ledger's closed rows plus the core's open
 * places, which only grow (a place's open cost becomes its ledger row).
 * tenant NULL: every tenant; "": none (no token); else that tenant's. */
static void print_costs(srv *s, sh_buf *b, const char *tenant)
{
    if (tenant && !*tenant) {
        sh_buf_printf(b, "# shoal_cost_dollars_total and shoal_gpu_seconds_total need a token: the admin's for"
                         " every tenant, a tenant's for its own\n");
        return;
    }
    json_t *c = srv__costs(s, tenant);
    const char *t, *g;
    json_t *by, *v;
    sh_buf_printf(b, "# HELP shoal_cost_dollars_total Dollars billed, by tenant and GPU type.\n"
                     "# TYPE shoal_cost_dollars_total counter\n");
    json_object_foreach(json_object_get(c, "by_tenant"), t, by) json_object_foreach(by, g, v)
        sh_buf_printf(b, "shoal_cost_dollars_total{tenant=\"%s\",gpu_type=\"%s\"} %.6f\n", t, g,
                      json_real_value(json_object_get(v, "dollars")));
    sh_buf_printf(b, "# HELP shoal_gpu_seconds_total GPU-seconds billed, by tenant and GPU type.\n"
                     "# TYPE shoal_gpu_seconds_total counter\n");
    json_object_foreach(json_object_get(c, "by_tenant"), t, by) json_object_foreach(by, g, v)
        sh_buf_printf(b, "shoal_gpu_seconds_total{tenant=\"%s\",gpu_type=\"%s\"} %.3f\n", t, g,
                      json_real_value(json_object_get(v, "gpu_seconds")));
    json_decref(c);
}

void srv__metrics(srv *s, sh_buf *b, const char *tenant)
{
    int nodes[3] = {0}, gpus = 0, used = 0;
    for (int i = 0; i < s->nnodes; i++) {
        nodes[s->nodes[i].state]++;
        if (s->nodes[i].state == NODE_ALIVE) {
            gpus += s->nodes[i].gpus;
            used += srv__node_used(s, i);
        }
    }
    int64_t jobs[J_NSTATES] = {0};
    for (int64_t i = 1; i <= s->njobs; i++)
        if (s->jobs[i]) jobs[s->jobs[i]->state]++;
    static const char *const ns[] = {"alive", "dead", "gone"};
    sh_buf_printf(b, "# HELP shoal_build_info The running server's version.\n# TYPE shoal_build_info gauge\n"
                     "shoal_build_info{version=\"%s\"} 1\n", SHOAL_VERSION);
    sh_buf_printf(b, "# HELP shoal_nodes Registered nodes by state.\n# TYPE shoal_nodes gauge\n");
    for (int i = 0; i < 3; i++) sh_buf_printf(b, "shoal_nodes{state=\"%s\"} %d\n", ns[i], nodes[i]);
    /* used + free = the GPUs of alive nodes, so sum(shoal_gpus) is the total. */
    sh_buf_printf(b, "# HELP shoal_gpus GPUs on alive nodes, used and free.\n# TYPE shoal_gpus gauge\n"
                     "shoal_gpus{state=\"used\"} %d\nshoal_gpus{state=\"free\"} %d\n", used, gpus - used);
    sh_buf_printf(b, "# HELP shoal_jobs Jobs by state.\n# TYPE shoal_jobs gauge\n");
    for (int i = 0; i < J_NSTATES; i++)
        sh_buf_printf(b, "shoal_jobs{state=\"%s\"} %lld\n", srv__job_state_name(i), (long long)jobs[i]);
    sh_buf_printf(b, "# HELP shoal_jobs_submitted_total Jobs accepted since the server started.\n"
                     "# TYPE shoal_jobs_submitted_total counter\nshoal_jobs_submitted_total %llu\n"
                     "# HELP shoal_jobs_rejected_total Jobs rejected as never fitting.\n"
                     "# TYPE shoal_jobs_rejected_total counter\nshoal_jobs_rejected_total %llu\n"
                     "# HELP shoal_agent_polls_total Agent polls served.\n"
                     "# TYPE shoal_agent_polls_total counter\nshoal_agent_polls_total %llu\n"
                     "# HELP shoal_sched_cycle_seconds Duration of the last scheduling cycle.\n"
                     "# TYPE shoal_sched_cycle_seconds gauge\nshoal_sched_cycle_seconds %.6f\n",
                  (unsigned long long)s->submits, (unsigned long long)s->rejects,
                  (unsigned long long)s->polls, s->last_cycle_s);
    sched_stats ss;
    sched_stats_get(s->sc, &ss);
    sh_buf_printf(b, "# HELP shoal_sched_jobs Jobs the scheduling core holds (queued or running).\n"
                     "# TYPE shoal_sched_jobs gauge\nshoal_sched_jobs %zu\n"
                     "# HELP shoal_sched_jobs_forgotten_total Ended jobs the core has dropped.\n"
                     "# TYPE shoal_sched_jobs_forgotten_total counter\nshoal_sched_jobs_forgotten_total %llu\n",
                  ss.queued + ss.running, (unsigned long long)ss.forgotten);
    srv__hist_print(b, "shoal_gang_start_seconds", "Seconds from placement to every rank running, by gang size in nodes.",
               s->h_start, 0);
    srv__hist_print(b, "shoal_queue_wait_seconds", "Seconds from submission to first placement, by gang size in nodes.",
               s->h_wait, 1);
    print_costs(s, b, tenant);
    sh_buf_printf(b, "# HELP shoal_http_responses_total HTTP responses by status class.\n"
                     "# TYPE shoal_http_responses_total counter\n");
    for (int i = 2; i <= 5; i++)
        sh_buf_printf(b, "shoal_http_responses_total{class=\"%dxx\"} %llu\n", i,
                      (unsigned long long)__atomic_load_n(&s->http_req[i], __ATOMIC_RELAXED));
}
