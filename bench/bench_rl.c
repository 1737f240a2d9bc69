/* shoal bench rl: rollout and trainer throughput of the policy on one core,
 * against the machine's matrix-product peak measured in the same run (one
 * thread of OpenBLAS sgemm), and against the plain-C reference path. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_int.h"
#include "shoal/nn.h"
#include "shoal/rl.h"

const char cli_bench_help_rl[] =
    "policy rollout and trainer tokens/s per core vs the measured sgemm peak [--json]";

static const char usage[] =
    "usage: shoal bench rl [--reps N] [--json]\n\n"
    "The policy's rollout and trainer tokens/s on one core, each beside the\n"
    "sgemm peak measured in the same run, the reference path and a rollout\n"
    "without the KV cache.  --reps N steps per measurement (default 20, 1..10000).\n";

/* GFLOP/s of a single-threaded n x n x n sgemm, best of a few. */
static double sgemm_peak(int n)
{
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n),
          *c = calloc((size_t)n * n, sizeof(float));
    for (int i = 0; i < n * n; i++) a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f;
    double best = 0;
    /* Best of many: other processes on the machine only ever slow it. */
    for (int rep = 0; rep < 30; rep++) {
        double t0 = sh_now_mono();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double g = 2.0 * n * n * n / (sh_now_mono() - t0) / 1e9;
        if (g > best) best = g;
    }
    free(a), free(b), free(c);
    return best;
}

typedef struct tput {
    double gen_tok_s, gen_gflops, train_tok_s, train_gflops;
} tput;

/* Rollouts: `reps` batches of 8 prompts x 8 samples; training: `reps`
 * steps on them.  FLOPs count 2 per parameter per token processed forward
 * and 6 forward+backward (attention's small T^2 term left out): with the
 * KV cache each token is processed once, without it (no_cache) the whole
 * prefix is recomputed at each step. */
static int measure(int reference, int no_cache, int reps, tput *t)
{
    nn_config cfg = nn_config_default(rl_vocab());
    rl_trainer tr = {.loss = rl_loss_defaults(RL_LOSS_DECOUPLED), .temperature = 1, .minibatches = 2};
    SH_TRY(nn_new(&cfg, 1, &tr.model));
    nn_set_reference(tr.model, reference);
    int rc = nn_adamw_init(&tr.opt, tr.model, 1e-3f);
    double P = (double)nn_num_params(tr.model);
    rl_problem p[8];
    rl_traj traj[64];
    rl_sampling s = {.temperature = 1, .top_p = 1, .max_new = 8, .no_kv_cache = no_cache};
    uint64_t rng = 3;
    double gen_s = 0, train_s = 0, gen_tok = 0, gen_proc = 0, train_tok = 0, train_proc = 0;
    for (int r = 0; r < reps && !rc; r++) {
        for (int i = 0; i < 8; i++) rl_problem_draw(RL_TASK_CODE, 0, &rng, &p[i]);
        double t0 = sh_now_mono();
        rc = rl_generate(tr.model, p, 8, 8, 0, &s, &rng, 0, NULL, NULL, traj);
        double t1 = sh_now_mono();
        for (int i = 0; i < 64 && !rc; i++) {
            traj[i].reward = (float)(i % 3) / 2;
            int n = traj[i].len - traj[i].plen;
            gen_tok += n;
            if (no_cache)
                for (int k = 0; k < n; k++) gen_proc += traj[i].plen + k; /* prefix recomputed */
            else
                gen_proc += traj[i].plen + n - 1;
            train_tok += n;
            train_proc += traj[i].len;
        }
        rl_step_stats st;
        if (!rc) rc = rl_train_step(&tr, traj, 64, &st);
        gen_s += t1 - t0;
        train_s += sh_now_mono() - t1;
    }
    /* Per step the trainer runs one forward for pi_old and a forward and a
     * backward per minibatch: 2 + 6 FLOPs per parameter per token. */
    *t = (tput){gen_tok / gen_s, 2 * P * gen_proc / gen_s / 1e9, train_tok / train_s,
                8 * P * train_proc / train_s / 1e9};
    nn_adamw_free(&tr.opt);
    nn_free(tr.model);
    return rc;
}

int cli_bench_rl(int argc, char **argv)
{
    static const struct option opts[] = {{"reps", required_argument, 0, 'r'}, {"json", no_argument, 0, 'j'}, {0}};
    cli_args a = {"bench rl", usage, opts, NULL};
    int json = 0, reps = 20;
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        int64_t v;
        if (c == 'j') json = 1;
        else if (c != 'r') return a.rc;
        else if (cli_int(a.cmd, "--reps", optarg, 1, 10000, &v)) return CLI_USAGE;
        else reps = (int)v;
    }
    if (optind < argc) return cli_usage(a.cmd, "unexpected argument \"%s\"", argv[optind]);
    openblas_set_num_threads(1);
    double peak = sgemm_peak(512), peak_small = sgemm_peak(64);
    tput fast, nocache, ref;
    int rc = measure(0, 0, reps, &fast);
    if (!rc) rc = measure(0, 1, reps, &nocache);
    if (!rc) rc = measure(1, 0, reps > 4 ? reps / 4 : 1, &ref);
    /* Measure the peak again after the work and keep the better figure. */
    double again = sgemm_peak(512);
    if (again > peak) peak = again;
    if (rc) return cli_fail("bench rl", rc);
    if (json) {
        json_t *j = json_pack("{s:f,s:f,s:{s:f,s:f,s:f},s:{s:f,s:f,s:f},s:{s:f,s:f},s:i,s:{s:f,s:f}}",
                              "sgemm_peak_gflops", peak, "sgemm_64_gflops", peak_small, "rollout",
                              "tokens_per_s", fast.gen_tok_s, "gflops", fast.gen_gflops,
                              "frac_of_peak", fast.gen_gflops / peak, "trainer", "tokens_per_s",
                              fast.train_tok_s, "gflops", fast.train_gflops, "frac_of_peak",
                              fast.train_gflops / peak, "reference_path", "rollout_tokens_per_s",
                              ref.gen_tok_s, "trainer_tokens_per_s", ref.train_tok_s, "reps", reps,
                              "rollout_no_kv_cache", "tokens_per_s", nocache.gen_tok_s,
                              "kv_cache_speedup", fast.gen_tok_s / nocache.gen_tok_s);
        sh_json_print(j);
        json_decref(j);
        return 0;
    }
    printf("one core; sgemm peak %.1f GFLOP/s (512^3), %.1f GFLOP/s (64^3)\n", peak, peak_small);
    printf("%-10s %12s %9s %9s %18s %10s\n", "phase", "tokens/s", "GFLOP/s", "of peak",
           "reference tok/s", "speed-up");
    printf("%-10s %12.0f %9.2f %8.1f%% %18.0f %9.1fx\n", "rollout", fast.gen_tok_s,
           fast.gen_gflops, 100 * fast.gen_gflops / peak, ref.gen_tok_s,
           fast.gen_tok_s / ref.gen_tok_s);
    printf("%-10s %12.0f %9.2f %8.1f%% %18.0f %9.1fx\n", "trainer", fast.train_tok_s,
           fast.train_gflops, 100 * fast.train_gflops / peak, ref.train_tok_s,
           fast.train_tok_s / ref.train_tok_s);
    printf("rollout without KV cache: %.0f tokens/s (%.2f GFLOP/s); the cache is %.1fx faster\n",
           nocache.gen_tok_s, nocache.gen_gflops, fast.gen_tok_s / nocache.gen_tok_s);
    return 0;
}
