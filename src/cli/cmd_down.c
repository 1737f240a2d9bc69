/* shoal down: stops the `shoal up` that runs on a state folder (its
 * server and agents), found by the lock it holds. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "cli_int.h"

const char cli_help_down[] = "stop the local fleet `shoal up` runs on a state folder";

static const char usage[] =
    "usage: shoal down [--db PATH] [--timeout S]\n\n"
    "Stops the `shoal up` whose database is PATH (default shoal-up/shoal.db, as\n"
    "for `shoal up`): sends it SIGTERM and waits until it and its agents have\n"
    "stopped (at most S seconds, default 30).  Running jobs' ranks are stopped\n"
    "with their agents; the database keeps the fleet's history for the next\n"
    "`shoal up` on the same folder.\n";

/* 1 while some process holds the lock on path (fd open on it), 0 once free. */
static int held(int fd)
{
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        flock(fd, LOCK_UN);
        return 0;
    }
    return 1;
}

int cli_cmd_down(int argc, char **argv)
{
    static const struct option opts[] = {{"db", required_argument, 0, 'b'}, {"timeout", required_argument, 0, 't'}, {0}};
    const char *db = "shoal-up/shoal.db";
    double timeout = 30;
    cli_args a = {"down", usage, opts};
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;)
        if (c == 'b') db = optarg;
        else if (c == 't') {
            if (cli_real("down", "--timeout", optarg, 0, 3600, "seconds 0..3600", &timeout)) return CLI_USAGE;
        } else if (c == CLI_OPT_EXIT) return a.rc;
    if (optind < argc) return cli_usage("down", "unexpected argument \"%s\"", argv[optind]);
    char dir[4096], lockf[4200];
    cli_up_dir(db, dir, sizeof dir);
    snprintf(lockf, sizeof lockf, "%s/up.lock", dir);
    int fd = open(lockf, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        fprintf(stderr, "shoal down: no shoal up has run on %s (no %s); give its database with --db PATH\n", dir, lockf);
        return 1;
    }
    if (fd < 0) return cli_fail("down", sh_err_errno(errno, "open %s", lockf));
    if (!held(fd)) {
        close(fd);
        fprintf(stderr, "shoal down: no shoal up runs on %s (it stopped already)\n", dir);
        return 1;
    }
    char text[32] = "";
    ssize_t k = pread(fd, text, sizeof text - 1, 0);
    text[k > 0 ? k : 0] = 0;
    long pid = atol(text);
    if (pid <= 1 || kill((pid_t)pid, SIGTERM) < 0) {
        int e = pid <= 1 ? ESRCH : errno;
        close(fd);
        return cli_fail("down", sh_err_errno(e, "%s names process \"%.20s\", which cannot be signalled", lockf, text));
    }
    double end = sh_now_mono() + timeout;
    while (held(fd) && sh_now_mono() < end) sh_sleep(0.05);
    int still = held(fd);
    close(fd);
    if (still) {
        fprintf(stderr, "shoal down: shoal up (pid %ld) on %s has not stopped after %g s; `kill -9 %ld` ends it and "
                        "its agents\n", pid, dir, timeout, pid);
        return 1;
    }
    printf("stopped shoal up (pid %ld) on %s\n", pid, dir);
    return 0;
}
