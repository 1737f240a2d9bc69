/* A push-tree follower's memory is bounded by its model, not by the chain
 * of versions since the last anchor (issue 31, item 1): `shoal bench
 * follow` runs a store, a push root and a follower attached to it (a
 * `shoal replica` process of its own), publishes versions of a 150 MB
 * checkpoint with Qwen2.5-1.5B's tensor names and shapes (1% of the
 * elements changing per version, an anchor every 4 versions so that the
 * run crosses two), checks every version the follower activates against
 * its manifest's model_xxh3 (bit-exact), and samples the follower's
 * /proc/PID/status.  Its peak RSS (VmHWM) must stay within one image +
 * 64 MiB + 2 deltas; before the bound it reached about 6 images.
 * Optimised build only: ASan's shadow memory would count as the follower's
 * own. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

static int64_t geti(json_t *j, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = j;
    for (char *save = NULL, *k = strtok_r(buf, ".", &save); k && cur; k = strtok_r(NULL, ".", &save))
        cur = json_object_get(cur, k);
    assert_non_null(cur);
    return json_integer_value(cur);
}

static void test_follower_rss_bounded(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__)
    skip();
#endif
    char *out = NULL;
    int st = tu_run(&out, "TMPDIR=%s %s bench follow --mb 150 --versions 10 --anchor-every 4 --step flip --json "
                    "2>&1", tu_tmpdir(), tu_shoal());
    if (st) print_message("%s\n", out);
    assert_int_equal(st, 0);
    json_t *j = json_loads(strchr(out, '{'), 0, NULL);
    assert_non_null(j);
    json_t *r = json_array_get(json_object_get(j, "runs"), 0);
    assert_non_null(r);
    int64_t image = geti(r, "image_bytes"), bound = geti(r, "bound_bytes"), dmax = geti(r, "delta_bytes_max");
    int64_t peak = geti(r, "push_follower.peak.hwm"), fin = geti(r, "push_follower.final.rss");
    print_message("image %.1f MiB, deltas up to %.2f MiB, %lld anchors: push follower peak %.1f MiB "
                  "(anon %.1f, file %.1f), final %.1f MiB; bound %.1f MiB\n", image / 1048576.0, dmax / 1048576.0,
                  (long long)geti(r, "anchors"), peak / 1048576.0, geti(r, "push_follower.peak.rss_anon") / 1048576.0,
                  geti(r, "push_follower.peak.rss_file") / 1048576.0, fin / 1048576.0, bound / 1048576.0);
    assert_true(image > 100 * 1000 * 1000);
    assert_int_equal(geti(r, "anchors"), 3); /* versions 1, 5 and 9 */
    assert_int_equal(bound, image + (64 << 20) + 2 * dmax);
    assert_true(peak > 0);
    assert_true(peak <= bound);
    assert_true(fin <= bound);
    assert_true(json_is_true(json_object_get(r, "ok")));
    json_decref(j);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_follower_rss_bounded)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
