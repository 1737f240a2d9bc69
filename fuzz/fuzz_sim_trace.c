/* libFuzzer target: the trace and fleet parsers on arbitrary bytes (through
 * memory files): they must fail cleanly, never crash.  Every trace format
 * sim_trace_load takes (shoal, gavel, alibaba-v2023) and every fleet
 * format reads the same bytes.  The input is the file, up to a NUL; after
 * the NUL, up to a second one, gavel's throughputs JSON (without it, a
 * small table of the real one's shape); after that, a GPU type map
 * ("v100=V100M32|V100M16,k80=T4") applied to every trace. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shoal/common.h"
#include "shoal/sim.h"

static const char builtin_thr[] =
    "{\"v100\": {\"('ResNet-18 (batch size 16)', 1)\": {\"null\": 32.4},"
    "            \"('ResNet-18 (batch size 16)', 2)\": {\"null\": 60.1},"
    "            \"('A3C', 1)\": {\"null\": 5.5}},"
    " \"p100\": {\"('ResNet-18 (batch size 16)', 1)\": {\"null\": 20.0},"
    "            \"('LM (batch size 5)', 1)\": {\"null\": 7.7}},"
    " \"k80\":  {\"('ResNet-18 (batch size 16)', 1)\": {\"null\": 9.0}}}";

/* A memory file holding p[0..n); its /proc path in path. */
static int memfile(const void *p, size_t n, char *path, size_t cap)
{
    int fd = memfd_create("fuzz", 0);
    if (fd < 0) return -1;
    if (sh_write_all(fd, p, n, "fuzz") < 0) {
        close(fd);
        return -1;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    const uint8_t *thr = builtin_thr, *map = NULL;
    size_t thlen = sizeof builtin_thr - 1;
    char mapbuf[256];
    if (nul) {
        thr = nul + 1;
        const uint8_t *nul2 = memchr(thr, 0, size - tlen - 1);
        thlen = nul2 ? (size_t)(nul2 - thr) : size - tlen - 1;
        if (nul2) {
            size_t ml = size - (size_t)(nul2 + 1 - data);
            if (ml >= sizeof mapbuf) ml = sizeof mapbuf - 1;
            memcpy(mapbuf, nul2 + 1, ml);
            mapbuf[ml] = 0;
            map = (const uint8_t *)mapbuf;
        }
    }
    char path[64], tpath[64];
    int fd = memfile(data, tlen, path, sizeof path), tfd = memfile(thr, thlen, tpath, sizeof tpath);
    if (fd >= 0 && tfd >= 0) {
        sim_trace_opts o = {.throughputs = tpath, .type_map = (const char *)map};
        static const char *const tfmts[] = {"shoal", "gavel", "alibaba-v2023"};
        for (int i = 0; i < 3; i++) {
            sim_trace t;
            if (sim_trace_load(path, tfmts[i], &o, &t) == 0) {
                sim_trace_multinode(&t, 3, 8);
                sim_trace_free(&t);
            }
        }
        sim_fleet f;
        static const char *const fmts[] = {"shoal", "alibaba-v2023", "alibaba-v2026"};
        for (int i = 0; i < 3; i++)
            if (sim_fleet_load(path, fmts[i], NULL, &f) == 0) sim_fleet_free(&f);
    }
    if (fd >= 0) close(fd);
    if (tfd >= 0) close(tfd);
    return 0;
}
