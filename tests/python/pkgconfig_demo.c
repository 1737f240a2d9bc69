/* Built against an installed prefix with `pkg-config --cflags --libs shoal`
 * by tests/test_python.c: opens a store, publishes two versions and applies
 * the store's delta with the shared library.  Usage: demo DIR. */
#include <stdio.h>
#include <string.h>

#include <shoal/delta.h>
#include <shoal/store.h>

#define TRY(x) do { if ((x) < 0) { fprintf(stderr, "%s: %s\n", #x, sh_errmsg()); return 1; } } while (0)

int main(int argc, char **argv)
{
    char a[4096], b[4096], out[4096], root[4096], payload[4096];
    snprintf(a, sizeof a, "%s/a.safetensors", argv[1]);
    snprintf(b, sizeof b, "%s/b.safetensors", argv[1]);
    snprintf(out, sizeof out, "%s/out.safetensors", argv[1]);
    snprintf(root, sizeof root, "%s/store", argv[1]);
    store *s;
    uint64_t v;
    TRY(ckpt_synth(a, 200000, 1));
    TRY(ckpt_step(a, b, 1e-6, 1, 2));
    TRY(store_open(root, NULL, 1, &s));
    TRY(store_publish(s, a, NULL, &v));
    TRY(store_publish(s, b, NULL, &v));
    TRY(store_payload_path(s, v, payload, sizeof payload));
    TRY(delta_apply(a, payload, out, NULL));
    char *x, *y;
    size_t nx, ny;
    TRY(sh_read_file(b, 1 << 30, &x, &nx));
    TRY(sh_read_file(out, 1 << 30, &y, &ny));
    int same = nx == ny && !memcmp(x, y, nx);
    printf("version %llu applied: %s\n", (unsigned long long)v, same ? "identical" : "DIFFERENT");
    store_close(s);
    return !same;
}
