#!/bin/sh
# Writes shoal(1) in roff on stdout from the binary's own help text:
# `shoal help` for the command list and `shoal CMD --help` for each
# command's section, so that the page never disagrees with the binary.
# Usage: scripts/gen-man.sh build/shoal VERSION
set -eu
BIN=$1
VERSION=$2
# Escapes text for roff: backslashes, and a leading dot or quote.
esc() { sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"; }
cat <<HDR
.TH SHOAL 1 "" "shoal $VERSION" "User Commands"
.SH NAME
shoal \\- gang scheduler, versioned weight distribution and asynchronous RL for mixed GPU fleets
.SH SYNOPSIS
.B shoal
.I command
.RI [ options ]
.br
.B shoal bench
.I name
.RI [ options ]
.br
.B shoal \\-\\-version
.SH DESCRIPTION
HDR
"$BIN" help | sed -n '3,4p' | esc
cat <<'MID'
.PP
Every command takes
.B \-\-help
(its usage, below) and
.BR \-\-version ;
options take their value as
.B \-\-opt value
or
.BR \-\-opt=value .
Commands that report figures take
.B \-\-json
and then print one JSON object.  Exit status: 0 success, 1 the work failed,
2 bad usage.
.SH COMMANDS
MID
"$BIN" help | sed -n '/^commands:/,/^$/p' | sed '1d;/^$/d' | while read -r cmd rest; do
    printf '.SS %s\n' "$cmd"
    printf '%s\n' "$rest" | esc
    printf '.PP\n.nf\n'
    "$BIN" "$cmd" --help 2>&1 | esc
    printf '.fi\n'
    # Subcommands whose usage is their own (`shoal rl train --help`).
    top=$("$BIN" "$cmd" --help 2>&1)
    for sub in $(printf '%s\n' "$top" | grep -o -- "shoal $cmd [a-z][a-z0-9|-]*" | sed "s/^shoal $cmd //" | tr '|' '\n' | sort -u); do
        text=$("$BIN" "$cmd" "$sub" --help 2>&1) || continue
        [ "$text" = "$top" ] && continue
        printf '.PP\n.nf\n'
        printf '%s\n' "$text" | esc
        printf '.fi\n'
    done
done
printf '.SH BENCHMARKS\nEach runs with \\fBshoal bench\\fR \\fIname\\fR and reports ratios against a baseline measured in the same run.\n'
"$BIN" help | sed -n '/^benchmarks/,/^$/p' | sed '1d;/^$/d' | while read -r cmd rest; do
    printf '.TP\n.B %s\n' "$cmd"
    printf '%s\n' "$rest" | esc
done
cat <<'TAIL'
.SH ENVIRONMENT
.TP
.B SHOAL_SERVER
the server's URL for client commands (default http://127.0.0.1:8470)
.TP
.B SHOAL_TOKEN
the bearer token client commands and agents send
.TP
.B SHOAL_CORE
the path of shoal-core, which runs every command the client binary does not hold
.TP
.B SHOAL_NO_PROGRESS
set: no progress bar on a terminal and no progress lines elsewhere
.TP
.B SHOAL_PROGRESS_AFTER
off a terminal, long work prints a progress line once it has run this many seconds (default 5), then at each tenth
.SH FILES
.TP
.I shoal-up/env
written by \fBshoal up\fR: \fBexport\fR lines for SHOAL_SERVER and SHOAL_TOKEN
.TP
.I shoal-up/up.log
the output of \fBshoal up -d\fR and its agents
.SH SEE ALSO
The documentation in the source tree: README.md, docs/deploy.md,
docs/job-format.md, docs/fleet-format.md, docs/server-api.md, docs/security.md.
TAIL
