/* A mount(2) that fails where a test says: preloaded (LD_PRELOAD) into an
 * agent, it fails with ENOSPC every tmpfs mount on the path named by
 * SHOAL_FAULT_MOUNT, and passes every other call to the C library's.
 * Built as build/tests/fault_mount.so (Makefile); used by
 * tests/test_props_agent.c to see what the jail does when hiding a
 * secret folder fails. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>

int mount(const char *src, const char *target, const char *type, unsigned long flags, const void *data)
{
    static int (*real)(const char *, const char *, const char *, unsigned long, const void *);
    const char *fail = getenv("SHOAL_FAULT_MOUNT");
    if (fail && target && type && !strcmp(type, "tmpfs") && !strcmp(target, fail)) {
        errno = ENOSPC;
        return -1;
    }
    if (!real) real = (int (*)(const char *, const char *, const char *, unsigned long, const void *))dlsym(
                   RTLD_NEXT, "mount");
    return real(src, target, type, flags, data);
}
