/* Small pure checks the server's files share: token comparison and the
 * names of runs, services and work dirs.  They call nothing of the server,
 * so that any file may use them without joining a circle of calls. */
#include "srv_int.h"

#include <string.h>

/* Compares a presented token with a known one in time that depends only on
 * their lengths, so that response times do not leak a token's prefix. */
int srv__token_eq(const char *given, const char *known)
{
    if (!known) return 0;
    size_t a = strlen(given), b = strlen(known);
    unsigned char diff = a != b;
    for (size_t i = 0; i < a; i++) diff |= (unsigned char)(given[i] ^ known[i % (b ? b : 1)]);
    return !diff;
}

int srv__run_name_ok(const char *n)
{
    size_t len = n ? strlen(n) : 0;
    return len >= 1 && len <= 63 &&
           strspn(n, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == len && n[0] != '.';
}

int srv__workdir_id_ok(const char *id)
{
    return id && strlen(id) == 32 && strspn(id, "0123456789abcdef") == 32;
}
