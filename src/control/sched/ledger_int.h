/* The billing ledger (ledger.c): per-second bills of each allocation, the
 * totals by job, tenant and GPU type, and the journal of closed bills.
 * Above the model; placement bills each place it releases. */
#ifndef SHOAL_SCHED_LEDGER_INT_H
#define SHOAL_SCHED_LEDGER_INT_H

#include "model_int.h"

/* The ledger's state (sched.led). */
struct sledger {
    sched_bill *bills; /* closed bills kept for the caller (cfg.bill_journal) */
    size_t nbills, capbills;
    double *forgot_cost_t; /* final bills of forgotten jobs, by type index */
    size_t nforgot_cost;
};
int sched__ledger_new(sched *s);
void sched__ledger_free(sched *s);
/* Adds forgotten job j's bills to the totals of forgotten jobs. */
void sched__ledger_forget(sched *s, const sjob *j);
/* Closes the bill of place p of job j at now (a holding job's: nobody's). */
void sched__bill(sched *s, sjob *j, const splace *p, double now);
/* What place p has cost up to now (its seconds rounded up). */
double sched__place_cost(const sched *s, const splace *p, double now);
/* (*v)[type] += c, growing *v (of *n) as needed (best effort). */
void sched__add_cost(double **v, size_t *n, uint32_t type, double c);
/* c plus what the places job j holds now have cost so far (type NONE: any). */
double sched__open_cost(const sched *s, const sjob *j, uint32_t type, double now, double c);
/* Job j's closed bills and open places of GPU type `type` (NONE: any). */
double sched__job_cost(const sched *s, const sjob *j, uint32_t type, double now);

#endif
