/* shoal fleet files: the one CSV that names a fleet's nodes, read by the
 * simulator (`shoal sim`), `shoal up` and the main job (docs/fleet-format.md).
 *
 * A fleet file is a header line and one line per node.  Columns are found by
 * their header name, so their order is free: both
 *     node_id,zone,fabric,gpu_type,gpus,price_per_gpu_hour
 *     name,gpu_type,gpus,zone,fabric,price_per_gpu_hour
 * are the same format ("name" and "node_id" are two spellings of one column).
 * Six columns are required; any other column is an extra, which the caller
 * either keeps (by name, or all of them) or refuses with an error naming it.
 * Blank lines and lines starting with '#' are skipped everywhere, including
 * before the header.  Every error names the file and the line.
 *
 * The reader touches only the file it is given; it holds no global state. */
#ifndef SHOAL_FLEETFILE_H
#define SHOAL_FLEETFILE_H

#include <stddef.h>

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

#define SH_FLEET_NAME 64     /* bytes of a name, zone, fabric or GPU type, NUL included */
#define SH_FLEET_MAX_GPUS 16 /* GPUs on one node: the scheduler's SCHED_MAX_NODE_GPUS */
#define SH_FLEET_MAX_COLS 32 /* columns of one file, extras included */

typedef struct sh_fleet_node {
    char name[SH_FLEET_NAME], zone[SH_FLEET_NAME], fabric[SH_FLEET_NAME], gpu_type[SH_FLEET_NAME];
    int gpus;                  /* 1..SH_FLEET_MAX_GPUS */
    double price_per_gpu_hour; /* >= 0 */
    int line;                  /* the node's line in the file, for later messages */
    char **extra;              /* values of the kept extra columns, in f->extra_cols order */
} sh_fleet_node;

typedef struct sh_fleet_file {
    sh_fleet_node *nodes;
    size_t n;
    char **extra_cols; /* names of the kept extra columns */
    int n_extra;
} sh_fleet_file;

/* What to do with columns beyond the six.  keep lists (NULL-terminated) the
 * extra column names the caller understands; keep_all keeps any column.
 * With neither, an extra column is an error that lists the known ones. */
typedef struct sh_fleet_opts {
    const char *const *keep;
    int keep_all;
} sh_fleet_opts;

/* Reads the fleet file at path.  opts may be NULL (refuse extras).  Names,
 * zones, fabrics and GPU types are 1..63 characters of [A-Za-z0-9._:-];
 * node names are unique.  A file without nodes is an error.  On success the
 * caller owns out and frees it with sh_fleet_free; on failure out is empty. */
int sh_fleet_load(const char *path, const sh_fleet_opts *opts, sh_fleet_file *out);
/* The same, from a NUL-terminated buffer; path only names it in messages. */
int sh_fleet_parse(const char *text, const char *path, const sh_fleet_opts *opts, sh_fleet_file *out);
/* The value of extra column col on node i, or NULL when the column was not
 * kept.  The string belongs to f. */
const char *sh_fleet_extra(const sh_fleet_file *f, size_t i, const char *col);
/* The node called name, or NULL. */
const sh_fleet_node *sh_fleet_find(const sh_fleet_file *f, const char *name);
void sh_fleet_free(sh_fleet_file *f);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop

#endif
