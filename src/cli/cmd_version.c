/* shoal version: prints the version and the libraries shoal was built with.
 * It reads the versions from the headers at build time, so that the client
 * binary need not load the libraries to name them. */
#include <jansson.h>
#include <microhttpd.h>
#include <sqlite3.h>
#include <string.h>
#include <ucp/api/ucp_version.h>
#include <xxhash.h>
#include <zstd.h>

#include "cli_int.h"

const char cli_help_version[] = "print shoal's version and the library versions it was built with [--json]";

static const char usage[] = "usage: shoal version [--json]\n\n"
                            "Prints shoal's version and the versions of the libraries it was built\n"
                            "against (UCX as its API version).  `shoal --version` prints the first.\n";

int cli_cmd_version(int argc, char **argv)
{
    static const struct option opts[] = {{"json", no_argument, 0, 'j'}, {0}};
    cli_args a = {"version", usage, opts, NULL};
    int json = 0;
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;)
        if (c == 'j') json = 1;
        else return a.rc;
    if (optind < argc) return cli_usage("version", "unexpected argument \"%s\"", argv[optind]);
    char ucx[32], xxh[32], mhd[32];
    snprintf(ucx, sizeof ucx, "%d.%d", UCP_API_MAJOR, UCP_API_MINOR);
    snprintf(xxh, sizeof xxh, "%d.%d.%d", XXH_VERSION_MAJOR, XXH_VERSION_MINOR, XXH_VERSION_RELEASE);
    snprintf(mhd, sizeof mhd, "%x.%x.%x", (MHD_VERSION >> 24) & 0xff, (MHD_VERSION >> 16) & 0xff,
             (MHD_VERSION >> 8) & 0xff);
    if (json) {
        json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s}", "shoal", SHOAL_VERSION, "zstd", ZSTD_VERSION_STRING,
                              "xxhash", xxh, "ucx", ucx, "sqlite", SQLITE_VERSION, "jansson", JANSSON_VERSION,
                              "libmicrohttpd", mhd);
        sh_json_print(j);
        json_decref(j);
        return 0;
    }
    printf("shoal %s (built with zstd %s, xxhash %s, ucx %s, sqlite %s, jansson %s, libmicrohttpd %s)\n",
           SHOAL_VERSION, ZSTD_VERSION_STRING, xxh, ucx, SQLITE_VERSION, JANSSON_VERSION, mhd);
    return 0;
}
