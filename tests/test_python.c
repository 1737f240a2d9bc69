/* The Python package (python/shoal) and the installed library.
 *
 * One cmocka test per tests/python/test_*.py (run with unittest against
 * build/libshoal.so, the optimised build), plus `make install` into a
 * temporary prefix, checked with a C program built by pkg-config and with
 * `import shoal` from that prefix.  tests/test_python_e2e.c builds this file
 * again for tests/python/e2e_*.py (the multi-process example), so that each
 * binary stays well inside the runner's time limit.
 *
 * The ASan build skips them all: CPython and torch are not built with
 * AddressSanitizer, so preloading it into the interpreter reports their own
 * allocations rather than shoal's; the C code under these tests is covered
 * by the ASan runs of the C tests, and the library users load is the
 * optimised one tested here. */
#include "testutil.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef PY_GLOB
#define PY_GLOB "tests/python/test_*.py"
#define PY_INSTALL 1
#endif

static int is_asan(void) { return strstr(tu_shoal(), "/asan/") != NULL; }

/* A Python 3 that imports torch and numpy: $SHOAL_PYTHON, Debian's
 * /usr/bin/python3 (where python3-torch installs), then python3 on PATH. */
static const char *python(void)
{
    static char found[4096];
    if (found[0]) return found;
    const char *env = getenv("SHOAL_PYTHON");
    const char *cands[] = {env && *env ? env : NULL, "/usr/bin/python3", "python3"};
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++) {
        if (!cands[i]) continue;
        if (tu_run(NULL, "%s -c 'import torch, numpy' >/dev/null 2>&1", cands[i]) == 0) {
            snprintf(found, sizeof found, "%s", cands[i]);
            return found;
        }
    }
    return NULL;
}

static void run_py_file(void **state)
{
    const char *file = *state;
    const char *py = python();
    if (!py) fail_msg("no python3 with torch and numpy: run scripts/deps.sh (python3-torch, python3-numpy)");
    char *out = NULL;
    int rc = tu_run(&out, "SHOAL_LIB=build/libshoal.so.0 PYTHONPATH=python:tests/python %s -m unittest -v %s", py, file);
    printf("%s", out);
    free(out);
    if (rc != 0) fail_msg("%s: unittest exited with %d", file, rc);
}

#ifdef PY_INSTALL
static void install_prefix(void **state)
{
    const char *py = python();
    if (!py) fail_msg("no python3 with torch and numpy: run scripts/deps.sh");
    const char *pre = tu_path("prefix"), *demo = tu_path("demo"), *work = tu_path("demo-work");
    sh_rm_rf(pre);
    TU_OK(sh_mkdir_p(work, 0755));
    char *out = NULL;
    /* The test may run under make; the install must not join its jobserver. */
    int rc = tu_run(&out, "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory install PREFIX=%s", pre);
    if (rc != 0) fail_msg("make install: %d\n%s", rc, out);
    free(out);
    rc = tu_run(&out, "PKG_CONFIG_PATH=%s/lib/pkgconfig cc -o %s tests/python/pkgconfig_demo.c "
                "$(PKG_CONFIG_PATH=%s/lib/pkgconfig pkg-config --cflags --libs shoal) -Wl,-rpath,%s/lib",
                pre, demo, pre, pre);
    if (rc != 0) fail_msg("building against the installed prefix: %d\n%s", rc, out);
    free(out);
    rc = tu_run(&out, "%s %s && ldd %s | grep -q '%s/lib/libshoal.so.0'", demo, work, demo, pre);
    printf("%s", out);
    if (rc != 0 || !strstr(out, "identical")) fail_msg("demo against the installed library: %d\n%s", rc, out);
    free(out);
    /* Every public header marks its declarations for export (a header
     * without the two pragma lines would leave its functions hidden). */
    rc = tu_run(&out, "grep -L 'pragma GCC visibility push(default)' include/shoal/*.h");
    if (out[0]) fail_msg("public headers without the export pragmas:\n%s", out);
    free(out);
    /* Only the public API is exported: no internal `__` names. */
    rc = tu_run(&out, "nm -D --defined-only %s/lib/libshoal.so | awk '{print $3}' | grep '__'", pre);
    if (rc == 0) fail_msg("libshoal.so exports internal names:\n%s", out);
    free(out);
    rc = tu_run(&out, "readelf -d %s/lib/libshoal.so | grep -q 'SONAME.*libshoal.so.0'", pre);
    assert_int_equal(rc, 0);
    free(out);
    /* The installed package, from outside the source tree, finds the
     * installed library. */
    rc = tu_run(&out, "cd / && env -u SHOAL_LIB PYTHONPATH=%s/lib/python3/dist-packages %s -c "
                "'import shoal, shoal._lib as l; print(shoal.__file__, l.lib._name)'", pre, py);
    printf("%s", out);
    if (rc != 0 || !strstr(out, pre)) fail_msg("import shoal from the prefix: %d\n%s", rc, out);
    free(out);
}

#endif

static void asan_skips(void **state) { skip(); }

int main(void)
{
    if (is_asan()) {
        const struct CMUnitTest one[] = {cmocka_unit_test(asan_skips)};
        return cmocka_run_group_tests_name("python (optimised build only)", one, NULL, NULL);
    }
    glob_t g;
    if (glob(PY_GLOB, 0, NULL, &g) != 0) {
        fprintf(stderr, "no %s (run from the repository root)\n", PY_GLOB);
        return 1;
    }
    struct CMUnitTest *t = calloc(g.gl_pathc + 1, sizeof *t);
    size_t n = 0;
#ifdef PY_INSTALL
    t[n++] = (struct CMUnitTest){.name = "install_prefix", .test_func = install_prefix};
#endif
    for (size_t i = 0; i < g.gl_pathc; i++)
        t[n++] = (struct CMUnitTest){.name = g.gl_pathv[i], .test_func = run_py_file,
                                     .initial_state = g.gl_pathv[i]};
    int rc = _cmocka_run_group_tests("python", t, n, NULL, NULL);
    free(t);
    globfree(&g);
    return rc;
}
