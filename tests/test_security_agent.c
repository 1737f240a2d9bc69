/* The node agent against a hostile tenant (issue 29, docs/security.md):
 * what runs before the jail, the "writable" folders, the terminal, the
 * work directory and the node's disk and file table.  Real server, real
 * agents, real sandboxes on loopback; each attack runs under bubblewrap
 * and, where the attack applies and runsc works here, under gVisor (the
 * gVisor tests skip, saying why, where it does not). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "fleet_util.h"

#include <errno.h>
#include <fcntl.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/fs.h>

#include "shoal/agent.h"

static void log_has(const char *what, const char *log, const char *needle)
{
    if (!strstr(log, needle)) fail_msg("%s: the log lacks \"%s\":\n%.4000s", what, needle, log);
}

static void log_lacks(const char *what, const char *log, const char *needle)
{
    if (strstr(log, needle)) fail_msg("%s: the attack worked (\"%s\" in the log):\n%.4000s", what, needle, log);
}

/* Skips a gVisor test where runsc cannot run a container, saying why. */
static void need_mode(const char *mode)
{
    char s[256];
    if (strcmp(mode, "gvisor")) return;
    if (agent_probe_sandbox("gvisor", s, sizeof s) < 0) {
        fprintf(stderr, "skipped: gVisor cannot run here: %s\n", sh_errmsg());
        skip();
    }
}

static void start(tf_fleet *f, const char *name, const char *mode, int gpus)
{
    snprintf(f->agent_extra, sizeof f->agent_extra, "--sandbox %s", mode);
    char n[64];
    snprintf(n, sizeof n, "%s-%s", name, mode);
    tf_start_server(f, n, 10);
    tf_start_agents(f, 1, "H100", gpus, "z", "ib");
}

/* Submits a one-GPU function of `token` running script under /bin/sh, with
 * extra (",\"key\":value..." or "") in the job file. */
static int64_t submit_sh(tf_fleet *f, const char *token, const char *name, const char *extra, const char *script)
{
    json_t *cmd = json_pack("[s,s,s]", "/bin/sh", "-c", script);
    char *c = json_dumps(cmd, JSON_COMPACT);
    json_decref(cmd);
    size_t cap = strlen(c) + strlen(extra) + 256;
    char *body = malloc(cap);
    snprintf(body, cap, "{\"name\":\"%s\",\"kind\":\"function\",\"gpus\":1%s,\"command\":%s}", name, extra, c);
    free(c);
    int64_t id = tf_submit(f, token, body);
    free(body);
    return id;
}

static const char *state_of(tf_fleet *f, int64_t id, char *out, size_t cap)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)id);
    int st;
    json_t *j = tf_call(f, TF_ADMIN, "GET", path, NULL, &st);
    snprintf(out, cap, "%s", j ? json_string_value(json_object_get(j, "state")) : "?");
    json_decref(j);
    return out;
}

/* ---- 1. Nothing the tenant controls is read before the jail. ---- */

/* The attacker's files, where a tenant could have put them (a folder it
 * may write, another job's directory): a `bwrap` and a `runsc` that say
 * so if they ever run, a shell profile for BASH_ENV and ENV, and a
 * library for LD_PRELOAD and LD_LIBRARY_PATH (as libcap.so.2 and
 * libselinux.so.1, which bwrap loads) whose constructor speaks when it runs
 * without no_new_privs, that is, outside any jail. */
static int plant(const char *dir)
{
    sh_rm_rf(dir);
    TU_OK(sh_mkdir_p(dir, 0755));
    char p[4200], *out = NULL;
    const char *fake = "#!/bin/sh\necho ESCAPED-PATH-$(basename $0) uid=$(id -u)\nexit 0\n";
    const char *names[] = {"bwrap", "runsc"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        tu_write_file(p, fake, strlen(fake));
        chmod(p, 0755);
    }
    snprintf(p, sizeof p, "%s/rc.sh", dir);
    const char *rc = "grep -q '^NoNewPrivs:[[:space:]]*0' /proc/self/status && echo ESCAPED-RC uid=$(id -u)\n";
    tu_write_file(p, rc, strlen(rc));
    snprintf(p, sizeof p, "%s/evil.c", dir);
    const char *lib = "#include <stdio.h>\n#include <string.h>\n#include <unistd.h>\n"
                      "__attribute__((constructor)) static void evil(void) {\n"
                      "  char b[4096], exe[256] = \"\"; FILE *f = fopen(\"/proc/self/status\", \"r\");\n"
                      "  int nnp = 1; while (f && fgets(b, sizeof b, f)) if (!strncmp(b, \"NoNewPrivs:\", 11)) nnp = b[12] != '0';\n"
                      "  if (f) fclose(f);\n"
                      "  ssize_t n = readlink(\"/proc/self/exe\", exe, sizeof exe - 1); if (n > 0) exe[n] = 0;\n"
                      "  if (!nnp) dprintf(2, \"ESCAPED-LD exe=%s uid=%d\\n\", exe, (int)getuid());\n}\n";
    tu_write_file(p, lib, strlen(lib));
    int rcc = tu_run(&out, "cc -shared -fPIC -o %s/libevil.so %s/evil.c 2>&1 && cp %s/libevil.so %s/libcap.so.2 &&"
                     " cp %s/libevil.so %s/libselinux.so.1", dir, dir, dir, dir, dir, dir);
    if (rcc != 0) fprintf(stderr, "no C compiler (%s): LD_PRELOAD and LD_LIBRARY_PATH are tried without a library\n",
                          out ? out : "");
    free(out);
    return rcc == 0;
}

static void env_attack(const char *mode)
{
    need_mode(mode);
    tf_fleet f = {0};
    start(&f, "envatk", mode, 8);
    /* Directly under /tmp: a place any tenant's uid can reach (the test's
     * own folder may lie under a closed one). */
    char dir[4200];
    snprintf(dir, sizeof dir, "/tmp/shoal-evil-%d", (int)getpid());
    plant(dir);
    /* Every variable at once, and each alone: one that the agent applied
     * before the jail would run the attacker's code outside it. */
    const char *vars[] = {"PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "ENV", "IFS", NULL};
    char vals[6][4400];
    snprintf(vals[0], sizeof vals[0], "%s:/usr/bin:/bin", dir);
    snprintf(vals[1], sizeof vals[1], "%s/libevil.so", dir);
    snprintf(vals[2], sizeof vals[2], "%s", dir);
    snprintf(vals[3], sizeof vals[3], "%s/rc.sh", dir);
    snprintf(vals[4], sizeof vals[4], "%s/rc.sh", dir);
    snprintf(vals[5], sizeof vals[5], "/");
    int64_t ids[7];
    for (int k = 0; k < 7; k++) {
        json_t *env = json_object();
        for (int i = 0; vars[i]; i++)
            if (k == 6 || k == i) json_object_set_new(env, vars[i], json_string(vals[i]));
        json_object_set_new(env, "JOB_PROBE", json_string("seen"));
        char *e = json_dumps(env, JSON_COMPACT);
        json_decref(env);
        char extra[16384];
        snprintf(extra, sizeof extra, ",\"env\":%s", e);
        free(e);
        ids[k] = submit_sh(&f, TF_BOB, "env", extra,
                           "echo inside-ok probe=$JOB_PROBE; echo path=$PATH; echo preload=$LD_PRELOAD");
    }
    for (int k = 0; k < 7; k++) {
        char *l = tf_wait_log(&f, ids[k], 60, NULL);
        const char *what = k == 6 ? "every variable" : vars[k];
        log_lacks(what, l, "ESCAPED");
        /* The job ran, in the sandbox, with its own environment. */
        log_has(what, l, "inside-ok probe=seen");
        if (k == 0 || k == 6) log_has(what, l, vals[0]);
        if (k == 1 || k == 6) log_has(what, l, vals[1]);
        free(l);
    }
    tf_stop(&f);
    sh_rm_rf(dir);
}

static void test_env_attack_bwrap(void **state) { env_attack("bwrap"); }
static void test_env_attack_gvisor(void **state) { env_attack("gvisor"); }

/* The agent refuses a sandbox tool that a tenant could replace: found on
 * the agent's own PATH in a directory others may write. */
static void test_tool_unsafe(void **state)
{
    char dir[4200], *out = NULL;
    snprintf(dir, sizeof dir, "%s", tu_path("unsafe-bin"));
    sh_rm_rf(dir);
    TU_OK(sh_mkdir_p(dir, 0755));
    chmod(dir, 01777); /* like /tmp */
    int rc = tu_run(&out, "cp /usr/bin/bwrap %s/bwrap && PATH=%s:/usr/bin:/bin %s agent --probe --sandbox bwrap"
                    " --gpu-type H100 --gpus 1 --name x 2>&1", dir, dir, tu_shoal());
    if (rc == 0 || !out || !strstr(out, "writable by others than root"))
        fail_msg("a bwrap in a world-writable directory: exit %d, output:\n%s", rc, out ? out : "");
    free(out);
}

/* ---- 3. No controlling terminal for ranks. ---- */

/* Starts the fleet's agent 0 as a foreground `shoal agent` of an admin's
 * terminal would run: the session leader's controlling terminal is the
 * slave of a pty whose master the test holds. */
static int agent_on_pty(tf_fleet *f, const char *mode, pid_t *pid)
{
    int master, slave;
    char name[256];
    if (openpty(&master, &slave, name, NULL, NULL) < 0) fail_msg("openpty: %s", strerror(errno));
    close(slave);
    char out[4200], work[4200];
    snprintf(f->names[0], sizeof f->names[0], "n0");
    snprintf(out, sizeof out, "%s/agent-0.out", f->dir);
    snprintf(work, sizeof work, "%s/work", f->dir);
    pid_t p = fork();
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        setsid();
        int s = open(name, O_RDWR); /* becomes the controlling terminal */
        int o = open(out, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (s < 0 || o < 0) _exit(126);
        dup2(s, 0);
        dup2(o, 1);
        dup2(o, 2);
        execl(tu_shoal(), tu_shoal(), "agent", "--server", f->url, "--token", TF_AGENT, "--name", "n0", "--gpu-type",
              "H100", "--gpus", "8", "--zone", "z", "--fabric", "ib", "--work-dir", work, "--sandbox", mode,
              (char *)NULL);
        _exit(127);
    }
    *pid = p;
    f->agents[0] = p;
    f->nagents = 1;
    tf_wait_agents(f, 1);
    return master;
}

static void no_tty(const char *mode)
{
    need_mode(mode);
    tf_fleet f = {0};
    char n[64];
    snprintf(n, sizeof n, "tty-%s", mode);
    tf_start_server(&f, n, 10);
    pid_t agent;
    int master = agent_on_pty(&f, mode, &agent);
    const char *script =
        "python3 -c \"\nimport os, fcntl, termios\nfor what in ('/dev/tty', 0, 1, 2):\n"
        "  try:\n    fd = os.open(what, os.O_RDWR) if isinstance(what, str) else what\n"
        "    for c in 'echo PWNED\\n': fcntl.ioctl(fd, termios.TIOCSTI, c.encode())\n"
        "    print('ESCAPED-TIOCSTI', what)\n"
        "  except OSError as e: print('refused', what, e.strerror)\n\"; echo done";
    int64_t id = submit_sh(&f, TF_BOB, "tiocsti", "", script);
    char *l = tf_wait_log(&f, id, 60, NULL);
    log_lacks("TIOCSTI", l, "ESCAPED");
    log_has("TIOCSTI", l, "refused /dev/tty");
    log_has("TIOCSTI", l, "done");
    free(l);
    /* Nothing reached the terminal's input either. */
    fcntl(master, F_SETFL, O_NONBLOCK);
    char buf[4096];
    ssize_t r = read(master, buf, sizeof buf - 1);
    if (r > 0) {
        buf[r] = 0;
        if (strstr(buf, "PWNED")) fail_msg("the rank typed into the agent's terminal: %s", buf);
    }
    close(master);
    tf_stop(&f);
}

static void test_no_tty_bwrap(void **state) { no_tty("bwrap"); }
static void test_no_tty_gvisor(void **state) { no_tty("gvisor"); }

/* ---- 2. Writable folders without TOCTOU or setuid. ---- */

/* What a job creates in its folder is owned on the host by the tenant's
 * uid, never root, also a setuid copy of a shell; under gVisor the folder
 * works (create, write, rename, delete).  A folder owned by another
 * tenant's uid, or one the tenant's uid owns but others can enter, is
 * refused at launch with the reason. */
static void writable_owner(const char *mode)
{
    need_mode(mode);
    tf_fleet f = {0};
    /* A folder every user could reach were it open (directly under /tmp):
     * the test's own folder may lie under a closed one. */
    char open_dir[256];
    snprintf(open_dir, sizeof open_dir, "/tmp/shoal-open-%d-%s", (int)getpid(), mode);
    snprintf(f.extra, sizeof f.extra, "--allow-writable %s", open_dir);
    sh_rm_rf(open_dir);
    TU_OK(sh_mkdir_p(open_dir, 0755));
    start(&f, "wown", mode, 8);
    char w[4200], extra[4400], script[8800], p[4400];
    snprintf(w, sizeof w, "%s/fold-own-%s", tu_tmpdir(), mode);
    sh_rm_rf(w);
    TU_OK(sh_mkdir_p(w, 0755));
    snprintf(extra, sizeof extra, ",\"writable\":[\"%s\"]", w);
    snprintf(script, sizeof script,
             "cd %s && echo one > a && mv a b && echo two >> b && cat b && mkdir d && rmdir d && cp /bin/sh suid &&"
             " chmod 4755 suid && echo made; touch gone && rm gone && echo deleted", w);
    char *l = tf_wait_log(&f, submit_sh(&f, TF_BOB, "own", extra, script), 60, NULL);
    log_has("writable folder", l, "one\ntwo\n");
    log_has("writable folder", l, "made");
    log_has("writable folder", l, "deleted");
    free(l);
    struct stat st;
    snprintf(p, sizeof p, "%s/b", w);
    TU_OK(stat(p, &st));
    if (st.st_uid < 2000000000u) fail_msg("a file the job made is owned by uid %u on the host", (unsigned)st.st_uid);
    snprintf(p, sizeof p, "%s/suid", w);
    TU_OK(stat(p, &st));
    if (st.st_uid == 0) fail_msg("the job's setuid copy of sh is root's on the host");
    TU_OK(stat(w, &st));
    if (st.st_uid < 2000000000u || (st.st_mode & 077))
        fail_msg("the folder is uid %u mode %o after use", (unsigned)st.st_uid, (unsigned)st.st_mode & 07777);
    /* Alice may not have it (the server refuses; the agent would too). */
    uid_t bob = st.st_uid;
    /* A folder of another tenant's uid, at launch. */
    char other[4200];
    snprintf(other, sizeof other, "%s/fold-other-%s", tu_tmpdir(), mode);
    sh_rm_rf(other);
    TU_OK(sh_mkdir_p(other, 0700));
    TU_OK(chown(other, bob + 1, bob + 1));
    snprintf(extra, sizeof extra, ",\"writable\":[\"%s\"]", other);
    l = tf_wait_log(&f, submit_sh(&f, TF_BOB, "other", extra, "echo ran"), 60, NULL);
    log_has("another tenant's folder", l, "is another tenant's");
    log_lacks("another tenant's folder", l, "ran\n");
    free(l);
    /* A path through a symbolic link (to a root-only directory) is refused
     * at launch, whichever component the link is. */
    char secret[4200], link[4200];
    snprintf(secret, sizeof secret, "%s/fold-root-%s/in", tu_tmpdir(), mode);
    snprintf(link, sizeof link, "%s/fold-link-%s", tu_tmpdir(), mode);
    TU_OK(sh_mkdir_p(secret, 0700));
    *strrchr(secret, '/') = 0;
    unlink(link);
    TU_OK(symlink(secret, link));
    snprintf(extra, sizeof extra, ",\"writable\":[\"%s/in\"]", link);
    l = tf_wait_log(&f, submit_sh(&f, TF_BOB, "link", extra, "echo ran"), 60, NULL);
    log_has("a link in the path", l, "without symbolic links");
    log_lacks("a link in the path", l, "ran\n");
    free(l);
    snprintf(p, sizeof p, "%s/in", secret);
    TU_OK(stat(p, &st));
    if (st.st_uid != 0) fail_msg("the root-only directory behind the link was given to uid %u", (unsigned)st.st_uid);
    /* Bob's own folder, opened to others where others can reach it. */
    TU_OK(chown(open_dir, bob, bob));
    chmod(open_dir, 0755);
    snprintf(extra, sizeof extra, ",\"writable\":[\"%s\"]", open_dir);
    l = tf_wait_log(&f, submit_sh(&f, TF_BOB, "open", extra, "echo ran"), 60, NULL);
    log_has("a folder others can enter", l, "lets other tenants in");
    log_lacks("a folder others can enter", l, "ran\n");
    free(l);
    /* Closed to others again, the same folder works, also open to its
     * group (bob's own: the tenant's gid is its uid); it lies outside the
     * test's folder (and outside any closed folder above the work root). */
    chmod(open_dir, 0770);
    snprintf(script, sizeof script, "echo fine > %s/x && echo written-outside", open_dir);
    l = tf_wait_log(&f, submit_sh(&f, TF_BOB, "closed", extra, script), 60, NULL);
    log_has("bob's own folder, closed", l, "written-outside");
    free(l);
    tf_stop(&f);
    sh_rm_rf(open_dir);
}

static void test_writable_owner_bwrap(void **state) { writable_owner("bwrap"); }
static void test_writable_owner_gvisor(void **state) { writable_owner("gvisor"); }

/* The race of the issue: while 12 jobs launch naming the folder W/d, W/d and
 * a symbolic link W/l to a root-only directory trade places without end
 * (renameat2 RENAME_EXCHANGE, as the tenant's own rank could in its
 * folder).  Every launch either runs on the real W/d or is refused for the
 * link; none reads or writes the root-only directory. */
static void writable_race(const char *mode)
{
    need_mode(mode);
    tf_fleet f = {0};
    start(&f, "wrace", mode, 16);
    char w[4200], d[4300], l[4300], secret[4200], p[4400];
    snprintf(w, sizeof w, "%s/fold-race-%s", tu_tmpdir(), mode);
    snprintf(secret, sizeof secret, "%s/fold-secret-%s", tu_tmpdir(), mode);
    snprintf(d, sizeof d, "%s/d", w);
    snprintf(l, sizeof l, "%s/l", w);
    sh_rm_rf(w);
    sh_rm_rf(secret);
    TU_OK(sh_mkdir_p(d, 0700));
    TU_OK(sh_mkdir_p(secret, 0700));
    snprintf(p, sizeof p, "%s/secret", secret);
    tu_write_file(p, "root-only-secret\n", 17);
    chmod(p, 0600);
    TU_OK(symlink(secret, l));
    pid_t swapper = fork();
    if (swapper == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        /* A millisecond between swaps: each state lasts long enough for
         * one step of a launch to see it, and changes between steps. */
        for (;;) {
            syscall(SYS_renameat2, AT_FDCWD, d, AT_FDCWD, l, RENAME_EXCHANGE);
            usleep(1000);
        }
    }
    enum { N = 12 };
    int64_t ids[N];
    char extra[4400], script[9000];
    snprintf(extra, sizeof extra, ",\"writable\":[\"%s\"]", d);
    snprintf(script, sizeof script, "cat %s/secret 2>/dev/null; touch %s/planted 2>/dev/null; echo ran", d, d);
    for (int i = 0; i < N; i++) ids[i] = submit_sh(&f, TF_BOB, "race", extra, script);
    int ran = 0, refused = 0;
    for (int i = 0; i < N; i++) {
        char *t = tf_wait_log(&f, ids[i], 120, NULL);
        log_lacks("RENAME_EXCHANGE race", t, "root-only-secret");
        ran += strstr(t, "ran\n") != NULL;
        refused += strstr(t, "symbolic links") != NULL;
        free(t);
    }
    kill(swapper, SIGKILL);
    waitpid(swapper, NULL, 0);
    snprintf(p, sizeof p, "%s/planted", secret);
    if (sh_path_exists(p)) fail_msg("a job wrote into the root-only directory through the race");
    struct stat st;
    TU_OK(stat(secret, &st));
    if (st.st_uid != 0 || (st.st_mode & 07777) != 0700)
        fail_msg("the root-only directory is now uid %u mode %o", (unsigned)st.st_uid, (unsigned)st.st_mode & 07777);
    printf("%d launches: %d ran on the folder, %d refused for the link\n", N, ran, refused);
    tf_stop(&f);
}

static void test_writable_race_bwrap(void **state) { writable_race("bwrap"); }
static void test_writable_race_gvisor(void **state) { writable_race("gvisor"); }

/* ---- 4. The agent outlives any work dir. ---- */

/* sh_rm_rf, which removes work directories, on a tree deeper than any
 * stack of recursive frames would hold, with files at every level. */
static void test_rm_rf_deep(void **state)
{
    char top[4200];
    snprintf(top, sizeof top, "%s", tu_path("deep"));
    sh_rm_rf(top);
    TU_OK(sh_mkdir_p(top, 0755));
    int fd = open(top, O_RDONLY | O_DIRECTORY);
    for (int i = 0; i < 3000; i++) {
        if (i % 10 == 0) close(openat(fd, "f", O_CREAT | O_WRONLY, 0644));
        TU_OK(mkdirat(fd, "d", 0755));
        int n = openat(fd, "d", O_RDONLY | O_DIRECTORY);
        close(fd);
        fd = n;
    }
    close(fd);
    double t0 = sh_now_mono();
    TU_OK(sh_rm_rf(top));
    printf("3,000 levels removed in %.2f s\n", sh_now_mono() - t0);
    assert_false(sh_path_exists(top));
}

/* Bob's rank leaves a tree 5,000 directories deep and many files (20,000
 * here, to keep make test short; SHOAL_TEST_FILES sets another count, the
 * issue's 1,000,000 for one) in its work directory and exits.  Alice's rank on the same node
 * keeps running on its first attempt, the node stays alive (heartbeat
 * timeout 4 s), the directory is removed and the agent still runs new
 * work.  Before: the agent crashed removing the tree (4 KiB of stack per
 * level) or stalled in its loop over the files. */
static void test_workdir_tree(void **state)
{
    const char *nf = getenv("SHOAL_TEST_FILES");
    long files = nf && atol(nf) > 0 ? atol(nf) : 20000;
    tf_fleet f = {0};
    snprintf(f.agent_extra, sizeof f.agent_extra, "--sandbox bwrap");
    tf_start_server(&f, "tree", 4);
    tf_start_agents(&f, 1, "H100", 8, "z", "ib");
    int64_t alice = submit_sh(&f, TF_ALICE, "steady", "", "while :; do echo tick; sleep 0.2; done");
    json_decref(tf_wait_job(&f, alice, "running", 30));
    char script[1024];
    snprintf(script, sizeof script,
             "python3 -c \"\nimport os\nos.mkdir('many')\nfor i in range(%ld): open('many/%%d' %% i, 'w').close()\n"
             "print('files', %ld)\nfd = os.open('.', os.O_RDONLY)\nfor i in range(5000):\n"
             "  os.mkdir('d', dir_fd=fd); n = os.open('d', os.O_RDONLY, dir_fd=fd); os.close(fd); fd = n\n"
             "print('deep', 5000)\n\"; echo dir=$PWD",
             files, files);
    int64_t bob = submit_sh(&f, TF_BOB, "tree", "", script);
    char *l = tf_wait_log(&f, bob, 300 + files / 2000.0, NULL);
    log_has("the tree", l, "deep 5000");
    char dir[1024] = "";
    const char *at = strstr(l, "dir=");
    if (at) sscanf(at + 4, "%1023s", dir);
    free(l);
    /* The directory goes while the agent goes on polling. */
    double t0 = sh_now_mono();
    int gone = 0;
    for (; sh_now_mono() - t0 < 120 + files / 2000.0 && !gone; sh_sleep(0.2)) {
        char s[32];
        if (strcmp(state_of(&f, alice, s, sizeof s), "running")) fail_msg("alice's job is %s", s);
        tf_wait_alive(&f, 1, 1);
        gone = dir[0] && !sh_path_exists(dir);
    }
    if (!gone) fail_msg("bob's work directory %s is still there after %.0f s", dir, sh_now_mono() - t0);
    printf("%ld files and 5,000 levels removed in %.1f s, the node alive throughout\n", files, sh_now_mono() - t0);
    assert_int_equal(kill(f.agents[0], 0), 0);
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)alice);
    int st;
    json_t *j = tf_call(&f, TF_ADMIN, "GET", path, NULL, &st);
    assert_int_equal(json_integer_value(json_object_get(j, "attempt")), 1);
    json_decref(j);
    l = tf_wait_log(&f, submit_sh(&f, TF_ALICE, "after", "", "echo alive"), 60, NULL);
    log_has("after the tree", l, "alive");
    free(l);
    tf_stop(&f);
}

/* ---- 5. Disk and file-table shares. ---- */

/* A rank may hold at most 65,536 open files per process (or the agent's
 * own hard limit, if lower), which it cannot raise, and its processes
 * together at most their share of half the node's file table: eight
 * processes that together hold more than that share (one GPU of 16:
 * fs.file-max / 32) are stopped, with the limit named in the log. */
static void test_open_files(void **state)
{
    /* An agent started with a high hard limit (as a service manager may
     * give it): without the agent's own limit the rank would take that. */
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_max = 1048576;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0) fprintf(stderr, "cannot raise the hard RLIMIT_NOFILE: %s\n", strerror(errno));
    tf_fleet f = {0};
    snprintf(f.agent_extra, sizeof f.agent_extra, "--sandbox bwrap");
    tf_start_server(&f, "nofile", 10);
    tf_start_agents(&f, 1, "H100", 16, "z", "ib");
    int64_t one = submit_sh(&f, TF_BOB, "one", "",
                            "python3 -c \"\nimport os, resource\ns, h = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
                            "try: resource.setrlimit(resource.RLIMIT_NOFILE, (h, h * 2))\n"
                            "except (ValueError, OSError) as e: print('raise refused')\n"
                            "resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))\nn = 0\ntry:\n"
                            "  while n < 2000000: os.open('/dev/null', os.O_RDONLY); n += 1\n"
                            "except OSError as e: print('refused at', n, e.strerror)\n\"");
    char *l = tf_wait_log(&f, one, 120, NULL);
    log_has("one process", l, "raise refused");
    log_has("one process", l, "Too many open files");
    long at = strstr(l, "refused at ") ? atol(strstr(l, "refused at ") + 11) : -1;
    if (at < 0 || at > 65536) fail_msg("one process opened %ld files:\n%s", at, l);
    free(l);
    long long fmax = 0;
    FILE *fm = fopen("/proc/sys/fs/file-max", "r");
    if (!fm || fscanf(fm, "%lld", &fmax) != 1) fail_msg("cannot read fs.file-max");
    fclose(fm);
    /* Eight processes, each under its own limit, together over the share. */
    long per = fmax / 32 / 8 + 1000;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (per > 60000 || (rlim_t)per + 100 > rl.rlim_max) {
        fprintf(stderr, "fs.file-max %lld: a rank's share needs more than 8 processes here; skipped\n", fmax);
        tf_stop(&f);
        skip();
    }
    char script[1024];
    snprintf(script, sizeof script,
             "for i in 1 2 3 4 5 6 7 8; do python3 -c \"\nimport os, time\nfs = [os.open('/dev/null', os.O_RDONLY) for _ in "
             "range(%ld)]\nprint('held', len(fs), flush=True)\ntime.sleep(60)\n\" & done; wait; echo survived",
             per);
    int64_t many = submit_sh(&f, TF_BOB, "many", "", script);
    int64_t other = submit_sh(&f, TF_ALICE, "other", "", "sleep 2; echo other-ok");
    l = tf_wait_log(&f, many, 120, NULL);
    log_has("four processes", l, "hit its open-files limit");
    log_lacks("four processes", l, "survived");
    free(l);
    l = tf_wait_log(&f, other, 60, NULL);
    log_has("the other tenant", l, "other-ok");
    free(l);
    tf_stop(&f);
}

/* The disk share comes from the space free at launch less a reserve for
 * the control plane (5 %, at least 512 MiB): on a work file system with
 * less free than the reserve, no rank is launched, and the reason says so;
 * the server keeps committing (another tenant's submit succeeds). */
static void test_disk_reserve(void **state)
{
    char mnt[4200];
    snprintf(mnt, sizeof mnt, "%s", tu_path("small-fs"));
    TU_OK(sh_mkdir_p(mnt, 0755));
    char *out = NULL;
    if (tu_run(&out, "mount -t tmpfs -o size=256m tmpfs %s 2>&1", mnt) != 0) {
        fprintf(stderr, "skipped: cannot mount a tmpfs here: %s\n", out ? out : "");
        free(out);
        skip();
    }
    free(out);
    tf_fleet f = {0};
    snprintf(f.agent_extra, sizeof f.agent_extra, "--sandbox bwrap");
    tf_start_server(&f, "reserve", 10);
    char work[4300], o[4300];
    snprintf(work, sizeof work, "%s/work", mnt);
    snprintf(o, sizeof o, "%s/agent-0.out", f.dir);
    snprintf(f.names[0], sizeof f.names[0], "n0");
    char *argv[] = {(char *)tu_shoal(), "agent", "--server", f.url, "--token", TF_AGENT, "--name", "n0",
                    "--gpu-type", "H100", "--gpus", "8", "--zone", "z", "--fabric", "ib", "--work-dir", work,
                    "--sandbox", "bwrap", NULL};
    f.agents[0] = tf_spawn(o, argv);
    f.nagents = 1;
    tf_wait_agents(&f, 1);
    char *l = tf_wait_log(&f, submit_sh(&f, TF_BOB, "fill", "", "head -c 1G /dev/zero > big; echo wrote"), 60,
                          &(int){0});
    log_has("a disk under its reserve", l, "no disk share");
    log_lacks("a disk under its reserve", l, "wrote");
    free(l);
    int st;
    json_decref(tf_call(&f, TF_ALICE, "POST", "/v1/jobs",
                        "{\"name\":\"x\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"true\"]}", &st));
    assert_int_equal(st, 201);
    tf_stop(&f);
    tu_run(&out, "umount %s", mnt);
    free(out);
}

/* The disk share is kernel-enforced: bob's rank (disk_mb 48) writes 1 MiB
 * blocks into its work directory until the kernel refuses.  It gets
 * ENOSPC at about 48 MiB (its work directory is a file system of that
 * size, an ext4 image), not at the host's free space; alice's jobs beside
 * it and after it are committed and run; bob's job fails and its log names
 * the limit; the image is unmounted and deleted when the rank ends.
 * Before: no kernel bound, the agent looked every half second (a fast
 * writer passed the share between two looks). */
static void disk_enospc(const char *mode)
{
    need_mode(mode);
    int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (ctl < 0 || geteuid() != 0) {
        fprintf(stderr, "skipped: no loop devices here (%s): the agent measures the share instead\n",
                geteuid() ? "not root" : strerror(errno));
        skip();
    }
    close(ctl);
    tf_fleet f = {0};
    start(&f, "enospc", mode, 8);
    const long share = 48l << 20;
    char script[1024];
    snprintf(script, sizeof script,
             "python3 -c \"\nimport os, errno\nst = os.statvfs('.')\nprint('fs', st.f_blocks * st.f_frsize)\n"
             "fd = os.open('big', os.O_WRONLY | os.O_CREAT)\nb = bytes(1 << 20)\nn = 0\ntry:\n"
             "  while n < %ld: n += os.write(fd, b)\n  print('no-enospc', n)\n"
             "except OSError as e: print('refused at', n, errno.errorcode[e.errno])\n\"; sleep 2; exit 1",
             4 * share);
    int64_t bob = submit_sh(&f, TF_BOB, "fill", ",\"disk_mb\":48", script);
    int64_t alice = submit_sh(&f, TF_ALICE, "beside", "", "sleep 1; echo alice-ok");
    char *l = tf_wait_log(&f, alice, 60, NULL);
    log_has("alice beside the full disk", l, "alice-ok");
    free(l);
    l = tf_wait_log(&f, bob, 60, NULL);
    log_lacks("a write past the share", l, "no-enospc");
    log_has("a write past the share", l, "ENOSPC");
    log_has("a write past the share", l, "hit its disk limit");
    const char *at = strstr(l, "refused at ");
    long n = at ? atol(at + 11) : -1;
    if (n < share * 8 / 10 || n > share) fail_msg("ENOSPC after %ld bytes, share %ld:\n%s", n, share, l);
    printf("%s: ENOSPC after %.1f MiB of a 48 MiB share\n", mode, n / 1048576.0);
    free(l);
    char st[32];
    assert_string_equal(state_of(&f, bob, st, sizeof st), "failed");
    /* The image goes with the rank: no mount and no image left. */
    char work[4200], *out = NULL;
    snprintf(work, sizeof work, "%s/work", f.dir);
    int left = 1;
    for (double t0 = sh_now_mono(); left && sh_now_mono() - t0 < 20; sh_sleep(0.2)) {
        free(out);
        out = NULL;
        tu_run(&out, "grep -c ' %s/' /proc/self/mounts; ls %s | grep -c '\\.img$'", work, work);
        left = !out || strcmp(out, "0\n0\n") != 0;
    }
    if (left) fail_msg("mounts and images left in %s after the rank ended:\n%s", work, out ? out : "");
    free(out);
    l = tf_wait_log(&f, submit_sh(&f, TF_ALICE, "after", "", "echo after-ok"), 60, NULL);
    log_has("alice after the full disk", l, "after-ok");
    free(l);
    tf_stop(&f);
}

static void test_disk_enospc_bwrap(void **state) { disk_enospc("bwrap"); }
static void test_disk_enospc_gvisor(void **state) { disk_enospc("gvisor"); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_env_attack_bwrap, tf_teardown),
        cmocka_unit_test_teardown(test_env_attack_gvisor, tf_teardown),
        cmocka_unit_test_teardown(test_tool_unsafe, tf_teardown),
        cmocka_unit_test_teardown(test_no_tty_bwrap, tf_teardown),
        cmocka_unit_test_teardown(test_no_tty_gvisor, tf_teardown),
        cmocka_unit_test_teardown(test_writable_owner_bwrap, tf_teardown),
        cmocka_unit_test_teardown(test_writable_owner_gvisor, tf_teardown),
        cmocka_unit_test_teardown(test_writable_race_bwrap, tf_teardown),
        cmocka_unit_test_teardown(test_writable_race_gvisor, tf_teardown),
        cmocka_unit_test_teardown(test_rm_rf_deep, tf_teardown),
        cmocka_unit_test_teardown(test_workdir_tree, tf_teardown),
        cmocka_unit_test_teardown(test_open_files, tf_teardown),
        cmocka_unit_test_teardown(test_disk_reserve, tf_teardown),
        cmocka_unit_test_teardown(test_disk_enospc_bwrap, tf_teardown),
        cmocka_unit_test_teardown(test_disk_enospc_gvisor, tf_teardown),
    };
    /* SHOAL_TEST_ONLY=test_name runs one test (for debugging). */
    if (getenv("SHOAL_TEST_ONLY")) cmocka_set_test_filter(getenv("SHOAL_TEST_ONLY"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
