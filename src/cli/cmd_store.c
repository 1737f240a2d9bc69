/* shoal store: publish, list, collect and plan versions of a run. */
#include <stdlib.h>
#include <string.h>

#include "cli_int.h"
#include "shoal/store.h"

const char cli_help_store[] = "versioned weight store: publish, ls, gc, plan, squash, verify [--json]";

static const char usage_text[] =
    "usage: shoal store publish STORE CKPT [--run R] [--anchor-every N] [--json]\n"
    "       shoal store ls STORE [--run R] [--json]\n"
    "       shoal store gc STORE --keep K [--run R] [--json]\n"
    "       shoal store plan STORE --from A --to B [--run R] [--json]\n"
    "       shoal store verify STORE [--version V] [--run R] [--json]\n"
    "       shoal store squash STORE --from A --to B [--run R] [--json]\n\n"
    "A store holds one folder per run and one per version: a full anchor or a\n"
    "delta on the previous version.  LATEST advances only after a version is\n"
    "durable.  publish computes the delta itself and writes an anchor every N\n"
    "versions (default 8); CKPT is a .safetensors file or a sharded folder with\n"
    "its index (stored as the one file holding its tensors), and a delta publish\n"
    "stages only its delta.  gc keeps the newest K versions and all they chain\n"
    "back to.  plan prints the cheapest way from version A (0: nothing) to B.\n"
    "squash composes the deltas after A up to B into one, which plans then use.\n"
    "See docs/store-format.md.\n";

typedef struct opts {
    const char *pos[2];
    int npos;
    const char *run;
    uint64_t anchor_every, keep, from, to, version;
    int json, has_keep, has_to;
} opts;

static const char *const subs[] = {"publish", "ls", "gc", "plan", "verify", "squash", NULL};
/* Each subcommand's options, by their codes in opts_all. */
static const char *const sub_opts[] = {"raj", "rj", "rkj", "rftj", "rvj", "rftj"};
static const struct option opts_all[] = {{"run", required_argument, 0, 'r'},  {"anchor-every", required_argument, 0, 'a'},
                                         {"keep", required_argument, 0, 'k'}, {"from", required_argument, 0, 'f'},
                                         {"to", required_argument, 0, 't'},   {"version", required_argument, 0, 'v'},
                                         {"json", no_argument, 0, 'j'},       {0}};

/* Parses argv (argv[0] is the subcommand) into o: -1, or the status to exit with. */
static int parse(const char *cmd, int sub, int argc, char **argv, opts *o)
{
    struct option mine[CLI_MAX_OPTS];
    cli_args a = {cmd, usage_text, cli_opts_pick(opts_all, sub_opts[sub], mine), NULL, .elsewhere = opts_all};
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        int rc = 0;
        switch (c) {
        case 'j': o->json = 1; break;
        case 'r': o->run = optarg; break;
        case 'a': rc = sh_parse_u64(optarg, &o->anchor_every, "--anchor-every"); break;
        case 'k':
            rc = sh_parse_u64(optarg, &o->keep, "--keep"), o->has_keep = 1;
            if (rc == 0 && o->keep == 0) return cli_usage(cmd, "--keep: expected a count >= 1, got \"%s\"", optarg);
            break;
        case 'f': rc = sh_parse_u64(optarg, &o->from, "--from"); break;
        case 't': rc = sh_parse_u64(optarg, &o->to, "--to"), o->has_to = 1; break;
        case 'v': rc = sh_parse_u64(optarg, &o->version, "--version"); break;
        default: return a.rc;
        }
        if (rc < 0) return cli_usage(cmd, "%s", sh_errmsg());
    }
    for (int i = optind; i < argc; i++) {
        if (o->npos == 2) return cli_usage(cmd, "unexpected argument \"%s\"", argv[i]);
        o->pos[o->npos++] = argv[i];
    }
    return -1;
}

static json_t *version_json(const store_version *v, uint64_t latest)
{
    char x[33];
    sh_hash128_hex(v->xxh3, x);
    json_t *j = json_pack("{s:I,s:s,s:I,s:I,s:s,s:b}", "version", (json_int_t)v->version, "kind",
                          v->anchor ? "anchor" : "delta", "size", (json_int_t)v->size,
                          "model_size", (json_int_t)v->model_size, "xxh3", x, "latest",
                          v->version == latest);
    if (!v->anchor) json_object_set_new(j, "base", json_integer((json_int_t)v->base));
    return j;
}

static int do_publish(store *s, const opts *o)
{
    /* A bar on a terminal (stderr), none with --json: a checkpoint of
     * billions of parameters takes a while to copy or diff. */
    sh_progress pg;
    store_publish_opts po = {o->anchor_every, o->json ? NULL : &pg};
    uint64_t v;
    double t0 = sh_now_mono();
    if (!o->json) sh_progress_start(&pg, "store publish", 0, "B");
    int rc = store_publish(s, o->pos[1], &po, &v);
    if (!o->json) cli_progress_end(&pg, rc);
    if (rc < 0) return cli_fail("store publish", rc);
    store_version m;
    if (store_get(s, v, &m, NULL) < 0) return cli_fail("store publish", -1);
    double secs = sh_now_mono() - t0;
    if (o->json) {
        json_t *j = version_json(&m, v);
        json_object_set_new(j, "run", json_string(store_run(s)));
        json_object_set_new(j, "seconds", json_real(secs));
        sh_json_print(j);
        json_decref(j);
    } else {
        char a[32], b[32];
        printf("published %s version %llu: %s, %s (model %s) in %.2fs\n", store_run(s),
               (unsigned long long)v, m.anchor ? "anchor" : "delta", sh_fmt_bytes((double)m.size, a, sizeof a),
               sh_fmt_bytes((double)m.model_size, b, sizeof b), secs);
    }
    return 0;
}

static int do_ls(store *s, const opts *o)
{
    uint64_t latest;
    int rc = store_latest(s, &latest);
    if (rc < 0) return cli_fail("store ls", rc);
    store_version *list;
    size_t n, broken;
    if ((rc = store_list(s, &list, &n, &broken)) < 0) return cli_fail("store ls", rc);
    if (o->json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++) {
            json_t *v = version_json(&list[i], latest);
            if (!list[i].file[0]) json_object_set_new(v, "broken", json_true());
            json_array_append_new(arr, v);
        }
        json_t *j = json_pack("{s:s,s:I,s:o,s:I}", "run", store_run(s), "latest", (json_int_t)latest,
                              "versions", arr, "broken", (json_int_t)broken);
        sh_json_print(j);
        json_decref(j);
    } else {
        printf("run %s, LATEST = %llu\n%10s  %-6s  %12s  %12s\n", store_run(s), (unsigned long long)latest,
               "version", "kind", "bytes", "model bytes");
        for (size_t i = 0; i < n; i++) {
            const store_version *v = &list[i];
            if (!v->file[0]) printf("%10llu  BROKEN (run `shoal store verify`)\n", (unsigned long long)v->version);
            else printf("%10llu  %-6s  %12llu  %12llu%s\n", (unsigned long long)v->version,
                        v->anchor ? "anchor" : "delta", (unsigned long long)v->size,
                        (unsigned long long)v->model_size, v->version == latest ? "  <- LATEST" : "");
        }
    }
    free(list);
    return 0;
}

static int do_gc(store *s, const opts *o)
{
    if (!o->has_keep) return cli_usage("store gc", "--keep K is required");
    uint64_t removed;
    int rc = store_gc(s, o->keep, &removed);
    if (rc < 0) return cli_fail("store gc", rc);
    if (o->json) {
        json_t *j = json_pack("{s:s,s:I,s:I}", "run", store_run(s), "keep", (json_int_t)o->keep,
                              "removed", (json_int_t)removed);
        sh_json_print(j);
        json_decref(j);
    } else {
        printf("removed %llu version folder(s) of run %s\n", (unsigned long long)removed, store_run(s));
    }
    return 0;
}

static int do_plan(store *s, const opts *o)
{
    if (!o->has_to) return cli_usage("store plan", "--to B is required");
    store_plan *p = malloc(sizeof *p);
    int rc = p ? store_plan_make(s, o->from, o->to, p) : sh_err(SH_ENOMEM, "plan");
    if (rc < 0) {
        free(p);
        return cli_fail("store plan", rc);
    }
    json_t *steps = json_array();
    for (size_t i = 0; i < p->nsteps; i++) json_array_append_new(steps, json_integer((json_int_t)p->steps[i]));
#define OPT(x) ((x) == UINT64_MAX ? json_null() : json_integer((json_int_t)(x)))
    json_t *j = json_pack("{s:I,s:I,s:s,s:I,s:I,s:o,s:o,s:o,s:o}", "from", (json_int_t)p->from, "to",
                          (json_int_t)p->to, "kind", store_plan_kind_name(p->kind), "anchor",
                          (json_int_t)p->anchor, "bytes", (json_int_t)p->bytes, "steps", steps,
                          "chain_bytes", OPT(p->chain_bytes), "squash_bytes", OPT(p->squash_bytes),
                          "anchor_bytes", OPT(p->anchor_bytes));
#undef OPT
    if (o->json) {
        sh_json_print(j);
    } else {
        printf("%llu -> %llu: %s, %llu bytes", (unsigned long long)p->from, (unsigned long long)p->to,
               store_plan_kind_name(p->kind), (unsigned long long)p->bytes);
        if (p->kind == STORE_PLAN_ANCHOR) printf(" (anchor %llu", (unsigned long long)p->anchor);
        else printf(" (");
        printf("%s%zu delta(s))\n", p->kind == STORE_PLAN_ANCHOR ? " + " : "", p->nsteps);
    }
    json_decref(j);
    free(p);
    return 0;
}

static int do_squash(store *s, const opts *o)
{
    if (!o->has_to) return cli_usage("store squash", "--from A and --to B are required");
    uint64_t bytes = 0;
    int rc = store_squash(s, o->from, o->to, &bytes);
    if (rc < 0) return cli_fail("store squash", rc);
    if (o->json) {
        json_t *j = json_pack("{s:I,s:I,s:I}", "from", (json_int_t)o->from, "to", (json_int_t)o->to,
                              "bytes", (json_int_t)bytes);
        sh_json_print(j);
        json_decref(j);
    } else {
        printf("squashed %llu -> %llu: %llu bytes\n", (unsigned long long)o->from, (unsigned long long)o->to,
               (unsigned long long)bytes);
    }
    return 0;
}

static int do_verify(store *s, const opts *o)
{
    uint64_t latest;
    int rc = store_latest(s, &latest);
    if (rc < 0) return cli_fail("store verify", rc);
    store_version *list;
    size_t n, broken, checked = 0;
    if ((rc = store_list(s, &list, &n, &broken)) < 0) return cli_fail("store verify", rc);
    json_t *bad = json_array();
    for (size_t i = 0; i <= n; i++) {
        /* One pass over the listed folders, or the one version asked for. */
        uint64_t v = o->version ? o->version : i < n ? list[i].version : 0;
        if (!v || (o->version && i > 0) || (!o->version && v > latest)) break;
        checked++;
        if (store_verify(s, v) < 0) {
            if (!o->json) fprintf(stderr, "shoal store verify: %s\n", sh_errmsg());
            json_array_append_new(bad, json_pack("{s:I,s:s}", "version", (json_int_t)v, "error", sh_errmsg()));
        }
    }
    free(list);
    size_t nbad = json_array_size(bad);
    if (o->json) {
        json_t *j = json_pack("{s:s,s:I,s:I,s:o}", "run", store_run(s), "checked", (json_int_t)checked,
                              "latest", (json_int_t)latest, "bad", bad);
        sh_json_print(j);
        json_decref(j);
    } else {
        json_decref(bad);
        printf("%zu version(s) checked, %zu bad\n", checked, nbad);
    }
    return nbad ? 1 : 0;
}

int cli_cmd_store(int argc, char **argv)
{
    int rc, k = cli_subcommand("store", usage_text, argc, argv, subs, &rc);
    if (k < 0) return rc;
    char cmd[32];
    snprintf(cmd, sizeof cmd, "store %s", subs[k]);
    opts o = {0};
    if ((rc = parse(cmd, k, argc - 1, argv + 1, &o)) >= 0) return rc;
    const char *sub = subs[k];
    int pub = k == 0;
    if (o.npos != (pub ? 2 : 1))
        return cli_usage(cmd, pub ? "publish needs STORE and CKPT" : "%s needs STORE", sub);
    store *s;
    if ((rc = store_open(o.pos[0], o.run, pub, &s)) < 0) return cli_fail(cmd, rc);
    if (pub) rc = do_publish(s, &o);
    else if (!strcmp(sub, "ls")) rc = do_ls(s, &o);
    else if (!strcmp(sub, "gc")) rc = do_gc(s, &o);
    else if (!strcmp(sub, "plan")) rc = do_plan(s, &o);
    else if (!strcmp(sub, "squash")) rc = do_squash(s, &o);
    else rc = do_verify(s, &o);
    store_close(s);
    return rc;
}
