/* Helpers shared by every test binary (linked into each).
 *
 * Tests are cmocka groups.  The runner (scripts/run-tests.sh) sets:
 *   SHOAL_BIN       the shoal binary of the same build (optimised or ASan)
 *   SHOAL_SHARED    the shared/ folder with real traces and fleets
 *   SHOAL_TEST_TMP  a fresh temporary directory for this binary */
#ifndef SHOAL_TESTUTIL_H
#define SHOAL_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the three headers above first. */
#include <cmocka.h>

#include "shoal/common.h"

/* The directory for this binary's scratch files (created on first use). */
const char *tu_tmpdir(void);
/* tu_tmpdir()/name into a static rotating buffer (8 slots). */
const char *tu_path(const char *name);
/* The shoal binary to run end-to-end, and the shared data folder (NULL if
 * absent: tests that need it call skip()). */
const char *tu_shoal(void);
const char *tu_shared(void);

/* Runs `sh -c cmd` and returns its exit status (128+signal if killed);
 * stdout and stderr are captured into *out (malloc'd, caller frees) when out
 * is non-NULL. */
int tu_run(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Holds a free loopback TCP port (listening, so that a bind to it fails):
 * returns the socket (close it to let go) and sets *port. */
int tu_hold_port(int *port);
/* tu_run on a terminal: the command's stdin, stdout and stderr are a new
 * pseudo-terminal (for what a command shows only to a person, such as
 * progress bars), whose output is captured into *out. */
int tu_run_tty(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Writes a file whole (asserts on failure). */
void tu_write_file(const char *path, const void *data, size_t len);
/* Reads a file whole (asserts on failure); *len gets its size. */
uint8_t *tu_read_file(const char *path, size_t *len);
/* Feeds every file of a fuzzer's committed corpus (fuzz/corpus/NAME: the
 * seeds and each regression it found), in name order, to `one` (the
 * target's LLVMFuzzerTestOneInput, compiled into the test), so that
 * `make test` keeps what the fuzzer found fixed.  Returns the file count. */
size_t tu_replay_corpus(const char *name, int (*one)(const uint8_t *, size_t));
/* Asserts that two files hold the same bytes. */
void tu_assert_same_file(const char *a, const char *b);

/* Asserts that an shoal call succeeded, printing sh_errmsg() when not. */
#define TU_OK(expr)                                                           \
    do {                                                                      \
        int tu_rc_ = (expr);                                                  \
        if (tu_rc_ < 0) fail_msg("%s failed (%d): %s", #expr, tu_rc_, sh_errmsg()); \
    } while (0)

/* Asserts that a call failed with the given code and that the message
 * contains `needle`. */
#define TU_ERR(expr, code, needle)                                            \
    do {                                                                      \
        int tu_rc_ = (expr);                                                  \
        if (tu_rc_ != (code))                                                 \
            fail_msg("%s returned %d, expected %d (msg: %s)", #expr, tu_rc_, (code), sh_errmsg()); \
        if (!strstr(sh_errmsg(), (needle)))                                   \
            fail_msg("%s: message \"%s\" lacks \"%s\"", #expr, sh_errmsg(), (needle)); \
    } while (0)

#endif
