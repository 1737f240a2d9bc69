/* libFuzzer target: drives the scheduling core with an arbitrary sequence
 * of events decoded from the input (nodes added, failed, recovered and
 * removed; jobs of every kind submitted, cancelled and finished; cycles
 * under every policy, with autoscaling, the reference search or not) and
 * aborts when sched_check finds a broken invariant, a decision names
 * something impossible, or a queued job lacks a wait reason or estimate. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/common.h"
#include "shoal/sched.h"

typedef struct rd {
    const uint8_t *p;
    size_t n;
} rd;

static unsigned byte(rd *r)
{
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}

static void check(sched *s, double now)
{
    if (sched_check(s, now)) {
        fprintf(stderr, "sched_check: %s\n", sh_errmsg());
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rd r = {data, size};
    static const char *const types[] = {"h100", "a100", "l4"};
    sched_quota q = {"z0", "f0", "h100", 8, 4, 2.0, 30};
    sched_config c;
    sched_config_default(&c, (sched_policy)(byte(&r) % 4));
    c.hold_timeout_s = 20, c.scale_up_wait_s = 15, c.scale_down_idle_s = 40;
    c.max_victims = 1 + (int)(byte(&r) % 8);
    unsigned flags = byte(&r);
    c.autoscale = flags & 1, c.quotas = &q, c.n_quotas = 1;
    c.reference = (flags >> 1) & 1, c.grow_queued = (flags >> 2) & 1;
    sched *s = sched_new(&c);
    sched_decisions d = {0};
    double now = 0;
    int nodes = 0, jobs = 0;
    while (r.n) {
        unsigned op = byte(&r) % 10, a = byte(&r), b = byte(&r);
        char id[32];
        now += (double)(a % 16);
        if (op == 0 && nodes < 64) {
            snprintf(id, sizeof id, "n%d", nodes++);
            char zone[8], fabric[8];
            snprintf(zone, sizeof zone, "z%u", a % 2);
            snprintf(fabric, sizeof fabric, "f%u", b % 2);
            sched_node_spec n = {id, zone, fabric, types[b % 3], 1 + (int)(a % 8), 1.0};
            sched_node_add(s, &n, now);
        } else if (op <= 3) {
            snprintf(id, sizeof id, "j%d", jobs++);
            sched_job_spec j;
            memset(&j, 0, sizeof j);
            j.id = id, j.kind = (sched_kind)(a % 3), j.nodes = 1 + (int)(b % 4);
            j.max_replicas = j.nodes + (int)(a % 3), j.gpus_per_node = 1 + (int)((a >> 2) % 8);
            j.priority = (int)(b >> 6), j.est_s = 1 + (b % 50);
            j.on_fail = (sched_on_fail)((a >> 5) & 1), j.replace_wait_s = (double)(b % 30);
            if (b & 0x80) j.n_types = 1, j.gpu_types[0] = types[a % 3], j.speed[0] = 0.5;
            j.tenant = (b & 1) ? "x" : "y";
            sched_job_submit(s, &j, now);
        } else if (op == 4 && nodes) {
            snprintf(id, sizeof id, "n%u", a % (unsigned)nodes);
            if (b & 1) sched_node_fail(s, id, now);
            else sched_node_recover(s, id, now);
        } else if (op == 5 && jobs) {
            snprintf(id, sizeof id, "j%u", a % (unsigned)jobs);
            if (b & 1) sched_job_finish(s, id, now);
            else sched_job_cancel(s, id, now);
            /* Often forget it too (refused unless it ended): its slot and
             * id are reused by later submissions. */
            if (b & 2) sched_job_forget(s, id);
        } else if (op == 7 && nodes && jobs) {
            /* A restore after a "restart": mostly refused, never corrupting. */
            char nid[4][16];
            sched_place pl[4];
            int n = 1 + (int)(a % 4);
            for (int k = 0; k < n; k++) {
                snprintf(nid[k], sizeof nid[k], "n%u", (b + (unsigned)k * (a % 3)) % (unsigned)nodes);
                pl[k] = (sched_place){nid[k], 0, 1 + (int)((b >> 3) % 8)};
            }
            snprintf(id, sizeof id, "j%u", b % (unsigned)jobs);
            sched_job_restore(s, id, pl, (size_t)n, now);
        } else if (op == 8 && jobs && (a & 1)) {
            /* A queued job always says why it waits and when it may start. */
            snprintf(id, sizeof id, "j%u", b % (unsigned)jobs);
            sched_job_info in;
            if (sched_job_info_get(s, id, now, &in) == 0 && (in.state == SCHED_QUEUED || in.state == SCHED_HOLDING) &&
                (in.wait == SCHED_WAIT_NONE || !in.wait_text[0] || !(in.est_start_s >= now))) {
                fprintf(stderr, "job %s: wait %d \"%s\" estimate %g at %g\n", id, in.wait, in.wait_text, in.est_start_s, now);
                abort();
            }
        } else if (op == 6 && nodes) {
            snprintf(id, sizeof id, "n%u", a % (unsigned)nodes);
            sched_node_remove(s, id, now);
        } else {
            int n = sched_step(s, now, &d);
            if (n < 0) abort();
            for (size_t i = 0; i < d.n; i++) {
                const sched_decision *x = &d.v[i];
                if (x->kind == SCHED_D_SCALE_UP) {
                    /* The provider delivers at once. */
                    for (int k = 0; k < x->n && nodes < 64; k++) {
                        snprintf(id, sizeof id, "n%d", nodes++);
                        sched_node_spec nn = {id, x->zone, x->fabric, x->gpu_type, 8, 2.0};
                        sched_node_add(s, &nn, now);
                    }
                } else if (x->kind == SCHED_D_SCALE_DOWN) {
                    if (sched_node_remove(s, x->node, now)) abort();
                } else if (!x->job || x->first + x->count > d.n_places) abort();
            }
        }
        check(s, now);
    }
    sched_decisions_free(&d);
    sched_free(s);
    return 0;
}
