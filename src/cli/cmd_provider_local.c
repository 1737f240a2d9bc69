/* shoal provider-local: the autoscaling provider for a fleet on this machine.
 * The server runs it with one JSON request on stdin (docs/server-api.md,
 * "Provider hook"): "create" becomes a `shoal agent --from-provider` in this
 * very process (so the server's parent-death signal still reaches it), and
 * "delete" stops the agent whose pid "create" recorded. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_int.h"

const char cli_help_provider_local[] = "autoscaling provider that starts and stops local agents (for --provider-cmd)";

static const char usage[] =
    "usage: shoal provider-local --dir DIR < REQUEST.json\n\n"
    "REQUEST is {\"action\":\"create\",\"name\",\"zone\",\"fabric\",\"gpu_type\",\"gpus\",\n"
    "\"price_per_gpu_hour\",\"server\",\"token\"} or {\"action\":\"delete\",\"name\"}.\n"
    "Use it as: shoal server ... --provider-cmd 'shoal provider-local --dir DIR'\n";

static int pid_path(const char *dir, const char *name, char *out, size_t cap)
{
    if (!*name || strchr(name, '/')) return sh_err(SH_EINVAL, "provider-local: bad node name \"%s\"", name);
    return sh_path_join(out, cap, dir, name) < 0 || strlen(out) + 5 >= cap ? SH_ERANGE : (strcat(out, ".pid"), SH_OK);
}

/* The request on stdin (at most 1 MiB): *req, *action and *name. */
static int read_request(json_t **req, const char **action, const char **name)
{
    sh_buf in = {0};
    char chunk[4096];
    ssize_t n;
    while ((n = read(0, chunk, sizeof chunk)) > 0 && in.len < (1 << 20)) sh_buf_append(&in, chunk, (size_t)n);
    int rc = sh_json_parse(in.data ? (char *)in.data : "", in.len, "provider request", req);
    sh_buf_free(&in);
    if (rc == SH_OK) rc = sh_json_get_str(*req, "action", 1, "provider request", action);
    if (rc == SH_OK) rc = sh_json_get_str(*req, "name", 1, "provider request", name);
    return rc;
}

/* delete: stops the node's agent, if one runs. */
static void delete_node(const char *pidf)
{
    char *text = NULL;
    size_t len;
    if (sh_read_file(pidf, 64, &text, &len) == 0) {
        pid_t p = (pid_t)atoi(text);
        if (p > 0) kill(p, SIGTERM);
        free(text);
        unlink(pidf);
    }
}

/* create: becomes the node's agent (returns only on failure). */
static int create_node(const json_t *req, const char *dir, const char *name, const char *pidf)
{
    const char *s[6] = {"zone", "fabric", "gpu_type", "server", "token", NULL};
    const char *v[6] = {0};
    int rc = SH_OK;
    for (int i = 0; s[i] && rc == SH_OK; i++) rc = sh_json_get_str(req, s[i], 1, "provider request", &v[i]);
    int64_t gpus = 0;
    double price = 0;
    if (rc == SH_OK) rc = sh_json_get_i64(req, "gpus", 1, "provider request", &gpus);
    if (rc == SH_OK) rc = sh_json_get_num(req, "price_per_gpu_hour", 0, "provider request", &price);
    char pidtxt[32], g[16], pr[32], work[4200];
    snprintf(pidtxt, sizeof pidtxt, "%d\n", (int)getpid());
    snprintf(g, sizeof g, "%lld", (long long)gpus);
    snprintf(pr, sizeof pr, "%g", price);
    snprintf(work, sizeof work, "%s/work", dir);
    if (rc == SH_OK) rc = sh_write_atomic(pidf, pidtxt, strlen(pidtxt));
    if (rc < 0) return cli_fail("provider-local", rc);
    setenv("SHOAL_TOKEN", v[4], 1);
    char *args[] = {"shoal", "agent", "--server", (char *)v[3], "--name", (char *)name, "--gpu-type", (char *)v[2],
                    "--gpus", g, "--zone", (char *)v[0], "--fabric", (char *)v[1], "--price", pr, "--work-dir", work,
                    "--from-provider", NULL};
    execv("/proc/self/exe", args);
    return cli_fail("provider-local", sh_err_errno(errno, "exec shoal agent"));
}

int cli_cmd_provider_local(int argc, char **argv)
{
    static const struct option opts[] = {{"dir", required_argument, 0, 'd'}, {0}};
    cli_args a = {"provider-local", usage, opts, NULL};
    const char *dir = NULL;
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;)
        if (c == 'd') dir = optarg;
        else return a.rc;
    if (optind < argc) return cli_usage("provider-local", "unexpected argument \"%s\"", argv[optind]);
    if (!dir) return cli_usage("provider-local", "--dir DIR is required");
    json_t *req = NULL;
    const char *action = "", *name = "";
    char pidf[4200];
    int rc = read_request(&req, &action, &name);
    if (rc == SH_OK) rc = sh_mkdir_p(dir, 0755);
    if (rc == SH_OK) rc = pid_path(dir, name, pidf, sizeof pidf);
    if (rc < 0) rc = cli_fail("provider-local", rc);
    else if (!strcmp(action, "delete")) delete_node(pidf);
    else if (strcmp(action, "create")) rc = cli_usage("provider-local", "action \"%s\" is not create or delete", action);
    else rc = create_node(req, dir, name, pidf);
    json_decref(req);
    return rc;
}
