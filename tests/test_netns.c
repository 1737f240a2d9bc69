/* A real multi-host deployment: tests/netns.sh puts the server (and the
 * push root) in one network namespace and three agents and replicas in
 * three others, joined by rate-limited veth links, then runs a gang and a
 * push across them (docs/deploy.md).  Skipped where namespaces cannot be
 * made (not root); the ASan build runs it too, which is what checks the
 * server, agents and replicas under real cross-host traffic. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

static void test_four_hosts(void **state)
{
    char *out;
    int rc = tu_run(&out, "sh tests/netns.sh %s %s 2>&1", tu_shoal(), tu_path("netns"));
    printf("%s", out);
    if (rc == 77) {
        free(out);
        skip();
    }
    if (rc != 0 || !strstr(out, "netns: ok")) fail_msg("tests/netns.sh exited %d", rc);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_four_hosts)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
