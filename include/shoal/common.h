/* shoal common: errors, logging, hashing, files, time, JSON helpers.
 *
 * Every component builds on this header.  Conventions that hold across shoal:
 *
 *  - Functions that can fail return an int: 0 (SH_OK) or a negative SH_E*
 *    code.  The failing function records a human-readable message naming the
 *    object (file, tensor, job, node) and the rule broken; sh_errmsg() returns
 *    the message of the last error on the calling thread.  Library code never
 *    prints errors and never exits; only src/cli does.
 *  - A function that allocates an object has a matching *_free(), and every
 *    *_free(NULL) is a no-op.
 *  - Files that must never be seen half-written go through sh_write_atomic()
 *    or sh_atomic_open()/sh_atomic_commit(): temporary file, fsync, rename,
 *    fsync of the directory.
 */
#ifndef SHOAL_COMMON_H
#define SHOAL_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

/* shoal's version: the binary prints it, the shared library's soname and
 * the server's shoal_build_info carry it. */
#define SHOAL_VERSION "0.1.0"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

/* The library's SHOAL_VERSION (for bindings, which cannot read the macro;
 * python/shoal/__init__.py's __version__ must equal it). */
const char *sh_version(void);

/* ---- Errors ------------------------------------------------------------ */

enum {
    SH_OK = 0,
    SH_EINVAL = -1,     /* a bad argument or configuration from the caller */
    SH_EIO = -2,        /* a system call failed; the message has strerror   */
    SH_ENOMEM = -3,     /* an allocation failed                              */
    SH_EFORMAT = -4,    /* untrusted bytes broke their format's rules        */
    SH_EMISMATCH = -5,  /* a hash, base or version does not match            */
    SH_ENOENT = -6,     /* a named thing does not exist                      */
    SH_ENOSPC = -7,     /* the disk is full                                  */
    SH_EAGAIN = -8,     /* retryable: not yet possible, try again later      */
    SH_ERANGE = -9,     /* a number is out of its allowed range              */
    SH_EEXIST = -10,    /* the thing already exists                          */
    SH_ETIMEDOUT = -11, /* a deadline passed                                 */
    SH_EPERM = -12,     /* not allowed (authentication, tenancy)             */
    SH_EINTERNAL = -13, /* a broken invariant inside shoal: a bug            */
};

/* Records a message for `code` on this thread and returns `code`, so that
 * `return sh_err(SH_EFORMAT, "%s: tensor %s: ...", path, name);` reads as one
 * statement.  The message is truncated to 1 KiB. */
int sh_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Like sh_err(), with ": <strerror(errnum)>" appended and the code chosen from
 * errnum (ENOSPC -> SH_ENOSPC, ENOENT -> SH_ENOENT, else SH_EIO). */
int sh_err_errno(int errnum, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes the current message with "<context>: ", keeping the code; returns
 * `code`.  Used by callers that add where an error happened. */
int sh_err_wrap(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The message of the last error on this thread ("" if none). */
const char *sh_errmsg(void);

/* A short name for a code: "invalid argument", "bad format", ... */
const char *sh_strerror(int code);

/* Forward a failure: evaluates expr once and returns it if negative. */
#define SH_TRY(expr)                                                          \
    do {                                                                      \
        int sh_try_rc_ = (expr);                                              \
        if (sh_try_rc_ < 0) return sh_try_rc_;                                \
    } while (0)

/* ---- Logging ----------------------------------------------------------- */

enum { SH_LOG_ERROR = 0, SH_LOG_WARN = 1, SH_LOG_INFO = 2, SH_LOG_DEBUG = 3 };

/* Writes one line to stderr if level <= the level set by sh_log_set_level()
 * or the SHOAL_LOG environment variable (error|warn|info|debug; default
 * warn).  Thread-safe; lines are never interleaved. */
void sh_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sh_log_set_level(int level);
int sh_log_level(void);
/* Sends the lines that pass the level to fn(level, line, arg) instead of
 * stderr (NULL: back to stderr); the line has no "shoal: level: " prefix
 * and no newline.  fn runs on the logging thread, outside any shoal lock,
 * and must not log itself.  The Python package routes them to `logging`. */
typedef void (*sh_log_sink)(int level, const char *line, void *arg);
void sh_log_set_sink(sh_log_sink fn, void *arg);

#define sh_warn(...) sh_log(SH_LOG_WARN, __VA_ARGS__)
#define sh_info(...) sh_log(SH_LOG_INFO, __VA_ARGS__)
#define sh_debug(...) sh_log(SH_LOG_DEBUG, __VA_ARGS__)

/* ---- Hashing (xxh3) ------------------------------------------------------ */

typedef struct sh_hash128 {
    uint64_t lo, hi;
} sh_hash128;

typedef struct sh_hasher sh_hasher; /* streaming xxh3-128 */

sh_hash128 sh_hash128_of(const void *data, size_t len);
uint64_t sh_hash64_of(const void *data, size_t len);
sh_hasher *sh_hasher_new(void);
void sh_hasher_update(sh_hasher *h, const void *data, size_t len);
sh_hash128 sh_hasher_digest(const sh_hasher *h);
void sh_hasher_reset(sh_hasher *h);
void sh_hasher_free(sh_hasher *h);
int sh_hash128_eq(sh_hash128 a, sh_hash128 b);
/* 32 lowercase hex digits + NUL, big-endian (hi first), as xxhsum prints. */
void sh_hash128_hex(sh_hash128 h, char out[33]);
int sh_hash128_parse(const char *hex, sh_hash128 *out);


/* ---- Files --------------------------------------------------------------- */

/* Writes len bytes to path atomically: path.tmp.<pid>, fsync, rename, fsync
 * of the directory.  On failure path is unchanged and no temporary remains. */
int sh_write_atomic(const char *path, const void *data, size_t len);
/* The same with the file created `mode` (umask applies) from its first
 * byte: for secrets, 0600. */
int sh_write_atomic_mode(const char *path, const void *data, size_t len, unsigned mode);

/* For writers that stream: open a temporary beside `path`, write to fd, then
 * sh_atomic_commit() (fsync, rename, fsync dir) or sh_atomic_abort(). */
typedef struct sh_atomic_file {
    int fd;
    char path[4096];
    char tmp[4096];
} sh_atomic_file;
int sh_atomic_open(sh_atomic_file *f, const char *path);
int sh_atomic_open_mode(sh_atomic_file *f, const char *path, unsigned mode);
int sh_atomic_commit(sh_atomic_file *f);
void sh_atomic_abort(sh_atomic_file *f);
/* Removes the temporaries of every atomic file this process has open and
 * has neither committed nor aborted.  Async-signal-safe: for a handler of
 * SIGINT or SIGTERM, so that an interrupted write of a large file leaves
 * no PATH.tmp.PID behind. */
void sh_atomic_unlink_all(void);

/* Writes all of buf at fd (retrying short writes and EINTR). */
int sh_write_all(int fd, const void *buf, size_t len, const char *what);
/* pwrite/pread all of buf at offset; a short read past EOF is SH_EFORMAT. */
int sh_pwrite_all(int fd, const void *buf, size_t len, uint64_t off, const char *what);
int sh_pread_all(int fd, void *buf, size_t len, uint64_t off, const char *what);

/* Maps `size` bytes of path shared, read-write, with every page table entry
 * set up writable in one batch (MADV_POPULATE_WRITE where the kernel has
 * it), so that writing through the map takes no page fault per 4 KiB; in a
 * virtual machine every fault exits to the host and costs more than the
 * copy it serves.  Every page becomes dirty: for files whose pages are all
 * written anyway.  With `create` the file is made (truncated) and its space
 * reserved first, so that a full disk is an error here and never a SIGBUS;
 * otherwise it must have `size` bytes.  *fd_out (optional) gets the open
 * descriptor, else it is closed.  The caller munmaps. */
int sh_map_rw(const char *path, uint64_t size, int create, uint8_t **out, int *fd_out);

/* A shared mapping of `size` bytes of the open file fd (which must have at
 * least `size` bytes; `writable`: read-write, else read-only and populated
 * in one batch), kept for reuse: released mappings stay in a small
 * process-wide cache keyed by the file (device, inode), size and access,
 * and the next request for that file gets the same mapping back.  In a
 * virtual machine with shadow page tables the first write to each page
 * through a new mapping exits to the host (about 10 us a page, 40 times
 * the copy), and setting up and tearing down a mapping's page table costs
 * a few ms per 50 MB; through a mapping already used, reads and writes run
 * at memory speed.  Files rotated between uses (a replica's model files, a
 * push node's spool files) thus cost no mapping work.  A kept mapping whose
 * file is deleted everywhere is unmapped at the next request or release.
 * Thread-safe. */
int sh_map_keep(int fd, uint64_t size, int writable, uint8_t **out);
/* Gives a mapping from sh_map_keep of the file fd back: kept (the least
 * recently released one let go) unless it is small (under 4 MiB) or the
 * file is deleted or fd is -1; then unmapped.  fd may be closed afterwards. */
void sh_map_keep_release(uint8_t *map, uint64_t size, int fd, int writable);

/* Reads a whole file into a NUL-terminated malloc'd buffer (caller frees).
 * Fails with SH_ERANGE if it is larger than max_len. */
int sh_read_file(const char *path, size_t max_len, char **out, size_t *out_len);

int sh_fsync_dir(const char *dir);
int sh_fsync_parent(const char *path);
/* Takes an exclusive lock on `path` (created if missing), held while *fd
 * stays open, and writes this process's pid into it.  When another process
 * holds it: SH_EEXIST, *holder its pid (0 if unknown) and *fd -1. */
int sh_lock_pid(const char *path, int *fd, long *holder);
int sh_mkdir_p(const char *path, unsigned mode);
/* Removes a file or a whole directory tree; a missing path is not an error. */
int sh_rm_rf(const char *path);
int sh_path_exists(const char *path);
int sh_is_dir(const char *path);
/* snprintf into out with truncation reported as SH_ERANGE. */
int sh_path_join(char *out, size_t cap, const char *a, const char *b);

/* ---- Time (for the edges only: pure cores take time as an argument) ----- */

double sh_now_mono(void);   /* seconds, CLOCK_MONOTONIC */
double sh_now_wall(void);   /* seconds since the epoch */
void sh_sleep(double seconds);
/* Peak resident set size of this process in bytes (from getrusage). */
uint64_t sh_peak_rss(void);
/* Anonymous resident memory of process pid now, in bytes (RssAnon of
 * /proc/PID/status: no page cache, no mapped files); 0 if unknown. */
uint64_t sh_rss_anon(long pid);

/* ---- Terminal progress bar ----------------------------------------------- */

/* Draws "label [#####.....] 45% 12.3 MB/s eta 4s" on stderr when stderr is a
 * terminal.  Otherwise work that runs past 5 s (SHOAL_PROGRESS_AFTER
 * seconds) prints a line then and at
 * each further tenth ("label: 40% (2.0 GiB of 5.0 GiB, 12 s)") and "label:
 * done in N s" at the end; shorter work prints nothing.  SHOAL_NO_PROGRESS
 * turns both off.  Callers need no checks.  `unit` names what total counts
 * ("B" formats as bytes). */
typedef struct sh_progress {
    const char *label;
    const char *unit;
    uint64_t total;
    uint64_t done;
    double t0, last_draw;
    int enabled; /* the bar on a terminal */
    int lines, logged; /* off a terminal: lines; the last tenth printed (-1: none) */
    double after;      /* ... once the work has run this long (SHOAL_PROGRESS_AFTER, 5 s) */
} sh_progress;
void sh_progress_start(sh_progress *p, const char *label, uint64_t total, const char *unit);
void sh_progress_update(sh_progress *p, uint64_t done);
void sh_progress_finish(sh_progress *p);
/* Erases the bar's line, so that a line printed next starts at the left
 * margin on a line of its own; the next update draws the bar again. */
void sh_progress_clear(sh_progress *p);

/* ---- Numbers and formatting -------------------------------------------- */

/* Parses a whole string as a number; names `what` in the error. */
int sh_parse_i64(const char *s, int64_t *out, const char *what);
int sh_parse_u64(const char *s, uint64_t *out, const char *what);
int sh_parse_double(const char *s, double *out, const char *what);
/* Parses counts with optional K/M/G suffix (powers of 1000) or KiB/MiB/GiB. */
int sh_parse_size(const char *s, uint64_t *out, const char *what);
/* The name in names[0..n) (a NULL entry also ends the list) closest to a
 * mistyped word, for "did you mean" hints; NULL when none is close. */
const char *sh_closest(const char *word, const char *const *names, size_t n);
/* "1.50 GiB" into buf. */
const char *sh_fmt_bytes(double bytes, char *buf, size_t cap);
/* The offset of the first control character in s (C0, DEL, or C1: U+0080
 * to U+009F, C2 80..C2 9F in UTF-8), or -1.  Names that others' text puts
 * on a terminal (job names, tensor names) must have none: an escape
 * sequence would rewrite the screen or set the window title. */
long sh_control_at(const char *s);

/* ---- Small dynamic buffer ------------------------------------------------ */

typedef struct sh_buf {
    uint8_t *data;
    size_t len, cap;
} sh_buf;
int sh_buf_reserve(sh_buf *b, size_t extra);
int sh_buf_append(sh_buf *b, const void *data, size_t len);
int sh_buf_printf(sh_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sh_buf_free(sh_buf *b);

/* ---- Work-dir archives (src/common/tarball.c) --------------------------- */

/* The largest work dir `shoal submit --workdir` ships by default, and the
 * most entries an agent unpacks. */
#define SH_TAR_DEFAULT_LIMIT (100ull << 20)
#define SH_TAR_MAX_ENTRIES 100000
/* Appends a ustar archive of the tree `dir` to out: its regular files,
 * directories and relative symbolic links that stay inside it, in name
 * order, with modes 0644/0755 and owner 0.  Fails naming the path for a
 * link out of the tree, a socket, fifo or device, a path over ustar's 255
 * bytes, or an archive that would pass `limit` bytes (SH_ERANGE). */
int sh_tar_pack(const char *dir, uint64_t limit, sh_buf *out);
/* Unpacks an archive from an untrusted sender into the existing directory
 * dest, owned by uid (when this process may chown).  Only files,
 * directories and links that stay inside the tree are created, each through
 * directories opened with O_NOFOLLOW (links are made last, so nothing is
 * written through one); modes lose their setuid, setgid, sticky and
 * other-write bits.  Fails (SH_EFORMAT, SH_ERANGE) on a bad header, a path
 * that is absolute or has "..", an entry of another type, a duplicate, more
 * than SH_TAR_MAX_ENTRIES entries or max_bytes of content; what was
 * unpacked before the failure stays (the caller removes dest). */
int sh_tar_unpack(const void *buf, size_t len, const char *dest, uint64_t max_bytes, unsigned uid);

/* ---- JSON helpers (jansson) ---------------------------------------------
 * Getters name the object (`ctx`, e.g. "job.json") and the key in errors:
 * "job.json: field \"nodes\": expected an integer, got string".  With
 * required = 0 a missing key leaves *out unchanged and returns SH_OK. */
int sh_json_parse(const char *text, size_t len, const char *ctx, json_t **out);
int sh_json_load_file(const char *path, size_t max_len, json_t **out);
int sh_json_write_atomic(const char *path, const json_t *j);
int sh_json_get_str(const json_t *obj, const char *key, int required, const char *ctx,
                    const char **out);
int sh_json_get_i64(const json_t *obj, const char *key, int required, const char *ctx,
                    int64_t *out);
int sh_json_get_num(const json_t *obj, const char *key, int required, const char *ctx,
                    double *out);
int sh_json_get_bool(const json_t *obj, const char *key, int required, const char *ctx,
                     int *out);
/* Fails naming the first key of obj that is not in the NULL-terminated list. */
int sh_json_check_keys(const json_t *obj, const char *const *allowed, const char *ctx);
/* Prints j to stdout as one compact line (for --json outputs). */
void sh_json_print(const json_t *j);
/* The bytes at the end of p[0..n) that begin a UTF-8 character whose last
 * bytes are not there yet (1 to 3), or 0 when p ends on a character
 * boundary or in bytes that no more bytes could make UTF-8.  A reader of a
 * stream keeps these for its next read, so that a character cut by a read,
 * a record or a window reaches JSON whole. */
size_t sh_utf8_tail(const uint8_t *p, size_t n);

/* ---- For bindings (python/shoal) ----------------------------------------
 * Frees memory that shoal returned to a foreign caller (text from the
 * *_json functions). */
void sh_free(void *p);
/* Serialises j as compact JSON into *out (caller frees with sh_free) and
 * drops the caller's reference to j, whatever happens. */
int sh_json_take_text(json_t *j, char **out);

/* ---- One process fan-out (fanout.c) -------------------------------------
 * For experiments that run many independent tasks (the RL sweep, the
 * fleet-cost experiment).
 * Runs tasks 0..total-1, each in a child process of its own, up to `jobs` (1..64)
 * at a time.  In its child a task's fn returns its result (NULL with *rc and
 * sh_errmsg() set on failure) and may report progress with sh_fanout_step(fd,
 * units done).  results[t] gets task t's result (caller owns them; NULL for
 * a task that failed).  progress (optional) gets the units done over all
 * tasks, units_each per finished task.  The first failure stops new tasks
 * and is returned once the running ones end. */
typedef json_t *(*sh_task_fn)(void *arg, int task, int fd, int *rc);
typedef void (*sh_units_fn)(void *arg, uint64_t units);
int sh_fanout(int total, int jobs, int units_each, sh_task_fn fn, void *arg, sh_units_fn progress,
              void *parg, json_t **results);
void sh_fanout_step(int fd, int units);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
