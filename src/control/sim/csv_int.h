/* Line and field splitting shared by the importers (src/control/sim only). */
#ifndef SHOAL_SIM_CSV_H
#define SHOAL_SIM_CSV_H

#include <stddef.h>

#define SIM__MAX_FIELDS 16
#define SIM__MAX_LINE 65536 /* bytes in one line, "\n" excluded */

/* Rejects text no importer should read on: a UTF-8 byte order mark, a NUL
 * byte (which would end the text early) or a line longer than
 * SIM__MAX_LINE, naming the file and the line. */
int sim__check_text(const char *path, const char *text, size_t len);

/* Iterates the lines of a NUL-terminated buffer in place: returns the next
 * line (without "\n" or "\r\n") and advances *pos, or NULL at the end. */
char *sim__next_line(char **pos);
/* Splits line in place at sep into at most max fields; returns the count. */
int sim__split(char *line, char sep, char **fields, int max);
/* Parsers that name the file, line and field in their errors. */
int sim__int(const char *v, const char *path, size_t line, const char *field, long lo, long hi, int *out);
int sim__num(const char *v, const char *path, size_t line, const char *field, double lo, double *out);
/* snprintf into a fixed name buffer, failing (naming the field) when it does not fit. */
int sim__name(char *dst, size_t cap, const char *v, const char *path, size_t line, const char *field);

#endif
