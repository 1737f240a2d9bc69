/* shoal version: prints the version and the libraries shoal was built with. */
#include <jansson.h>
#include <microhttpd.h>
#include <sqlite3.h>
#include <string.h>
#include <ucp/api/ucp.h>
#include <xxhash.h>
#include <zstd.h>

#include "cli.h"

#define SHOAL_VERSION "0.1.0"

const char cli_help_version[] = "print shoal's version and its libraries' versions [--json]";

int cli_cmd_version(int argc, char **argv)
{
    int json = argc > 1 && !strcmp(argv[1], "--json");
    if (argc > 1 && !json) return cli_usage("version", "unknown option \"%s\"", argv[1]);
    unsigned umaj, umin, urel;
    ucp_get_version(&umaj, &umin, &urel);
    char ucx[32];
    snprintf(ucx, sizeof ucx, "%u.%u.%u", umaj, umin, urel);
    char xxh[32];
    unsigned xv = XXH_versionNumber();
    snprintf(xxh, sizeof xxh, "%u.%u.%u", xv / 10000, (xv / 100) % 100, xv % 100);
    if (json) {
        json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s}", "shoal", SHOAL_VERSION, "zstd",
                              ZSTD_versionString(), "xxhash", xxh, "ucx", ucx, "sqlite",
                              sqlite3_libversion(), "jansson", JANSSON_VERSION, "libmicrohttpd",
                              MHD_get_version());
        sh_json_print(j);
        json_decref(j);
        return 0;
    }
    printf("shoal %s (zstd %s, xxhash %s, ucx %s, sqlite %s, jansson %s, libmicrohttpd %s)\n",
           SHOAL_VERSION, ZSTD_versionString(), xxh, ucx, sqlite3_libversion(), JANSSON_VERSION,
           MHD_get_version());
    return 0;
}
