/* Thread-local error messages and logging. */
#include "shoal/common.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define SH_ERRMSG_CAP 1024

static _Thread_local char sh__errmsg[SH_ERRMSG_CAP];

/* Formatted apart first: a message may quote the one it replaces
 * (sh_err(rc, "...: %s", sh_errmsg())), and vsnprintf must not read the
 * buffer it writes. */
static void sh__vset(const char *fmt, va_list ap)
{
    char msg[SH_ERRMSG_CAP];
    vsnprintf(msg, sizeof msg, fmt, ap);
    memcpy(sh__errmsg, msg, sizeof msg);
}

int sh_err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sh__vset(fmt, ap);
    va_end(ap);
    return code;
}

int sh_err_errno(int errnum, const char *fmt, ...)
{
    char head[SH_ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    snprintf(sh__errmsg, sizeof sh__errmsg, "%s: %s", head, strerror(errnum));
    if (errnum == ENOSPC || errnum == EDQUOT) return SH_ENOSPC;
    if (errnum == ENOENT) return SH_ENOENT;
    if (errnum == ENOMEM) return SH_ENOMEM;
    if (errnum == EEXIST) return SH_EEXIST;
    if (errnum == EACCES || errnum == EPERM) return SH_EPERM;
    return SH_EIO;
}

int sh_err_wrap(int code, const char *fmt, ...)
{
    char head[SH_ERRMSG_CAP], old[SH_ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, sh__errmsg, sizeof old);
    snprintf(sh__errmsg, sizeof sh__errmsg, "%s: %s", head, old);
    return code;
}

const char *sh_errmsg(void) { return sh__errmsg; }

const char *sh_strerror(int code)
{
    switch (code) {
    case SH_OK: return "ok";
    case SH_EINVAL: return "invalid argument";
    case SH_EIO: return "i/o error";
    case SH_ENOMEM: return "out of memory";
    case SH_EFORMAT: return "bad format";
    case SH_EMISMATCH: return "mismatch";
    case SH_ENOENT: return "not found";
    case SH_ENOSPC: return "no space left";
    case SH_EAGAIN: return "try again";
    case SH_ERANGE: return "out of range";
    case SH_EEXIST: return "already exists";
    case SH_ETIMEDOUT: return "timed out";
    case SH_EPERM: return "not permitted";
    case SH_EINTERNAL: return "internal error";
    default: return "unknown error";
    }
}

/* ---- Logging ------------------------------------------------------------- */

static int sh__level = -1;
static pthread_mutex_t sh__log_lock = PTHREAD_MUTEX_INITIALIZER;

int sh_log_level(void)
{
    if (sh__level < 0) {
        const char *e = getenv("SHOAL_LOG");
        int l = SH_LOG_WARN;
        if (e) {
            if (!strcasecmp(e, "error")) l = SH_LOG_ERROR;
            else if (!strcasecmp(e, "info")) l = SH_LOG_INFO;
            else if (!strcasecmp(e, "debug")) l = SH_LOG_DEBUG;
        }
        sh__level = l;
    }
    return sh__level;
}

void sh_log_set_level(int level) { sh__level = level; }

const char *sh_version(void) { return SHOAL_VERSION; }

static sh_log_sink sh__sink;
static void *sh__sink_arg;

void sh_log_set_sink(sh_log_sink fn, void *arg)
{
    pthread_mutex_lock(&sh__log_lock);
    sh__sink = fn, sh__sink_arg = arg;
    pthread_mutex_unlock(&sh__log_lock);
}

void sh_log(int level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (level > sh_log_level()) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&sh__log_lock);
    sh_log_sink fn = sh__sink;
    void *arg = sh__sink_arg;
    if (!fn) fprintf(stderr, "shoal: %s: %s\n", names[level < 0 ? 0 : level > 3 ? 3 : level], line);
    pthread_mutex_unlock(&sh__log_lock);
    if (fn) fn(level, line, arg);
}
