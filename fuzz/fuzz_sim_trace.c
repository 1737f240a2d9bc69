/* libFuzzer target: the shoal trace and fleet parsers on arbitrary bytes
 * (through a memory file): they must fail cleanly, never crash. */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shoal/common.h"
#include "shoal/sim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz", 0);
    if (fd < 0) return 0;
    if (sh_write_all(fd, data, size, "fuzz") == 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        sim_trace t;
        if (sim_trace_load(path, "shoal", NULL, &t) == 0) {
            sim_trace_multinode(&t, 3, 8);
            sim_trace_free(&t);
        }
        sim_fleet f;
        static const char *const fmts[] = {"shoal", "alibaba-v2023", "alibaba-v2026"};
        for (int i = 0; i < 3; i++)
            if (sim_fleet_load(path, fmts[i], NULL, &f) == 0) sim_fleet_free(&f);
    }
    close(fd);
    return 0;
}
