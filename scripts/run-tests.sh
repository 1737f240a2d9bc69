#!/bin/sh
# Runs test binaries (cmocka), two at a time, each in its own process with a
# time limit, and prints one line per binary and a final "N passed, N failed".
# A binary that crashes, times out or exits non-zero without reporting a
# failed test counts as one failure, so nothing can fail silently.
set -u
LOGS=build/test-logs
mkdir -p "$LOGS"
JOBS=${SHOAL_TEST_JOBS:-2}
LIMIT=${SHOAL_TEST_TIMEOUT:-600}
export SHOAL_SHARED=${SHOAL_SHARED:-$(cd .. && pwd)/shared}
export LSAN_OPTIONS="suppressions=$(pwd)/tests/lsan.supp:print_suppressions=0"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:detect_odr_violation=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export CMOCKA_MESSAGE_OUTPUT=stdout
# Off a terminal, long work prints progress lines (sh_progress); tests that
# read a command's output whole would see them only on a slow machine, so
# they come after 10 minutes here, and a test of the lines asks for them.
export SHOAL_PROGRESS_AFTER=${SHOAL_PROGRESS_AFTER:-600}

one() {
    bin=$1
    case "$bin" in */asan/*) v=asan; shoal=build/asan/shoal ;; *) v=opt; shoal=build/shoal ;; esac
    name="$v.$(basename "$bin")"
    log="$LOGS/$name.log"
    t0=$(date +%s)
    tmp=$(mktemp -d /tmp/shoal-test.XXXXXX)
    SHOAL_BIN=$shoal SHOAL_TEST_TMP=$tmp \
        timeout -k 10 "$LIMIT" "$bin" > "$log" 2>&1
    rc=$?
    t1=$(date +%s)
    pass=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test(s)\./\1/p' "$log" | tail -1)
    fail=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test(s), listed below:/\1/p' "$log" | tail -1)
    skip=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test(s), listed below:/\1/p' "$log" | tail -1)
    pass=${pass:-0}; fail=${fail:-0}; skip=${skip:-0}
    if [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; then fail=1; fi
    status=ok; [ "$fail" -ne 0 ] && status=FAIL
    [ "$rc" -eq 124 ] && status=TIMEOUT
    printf '%-5s %-34s %3d passed %3d failed %3d skipped  %4ss\n' "$status" "$name" "$pass" "$fail" "$skip" $((t1 - t0))
    if [ "$fail" -ne 0 ]; then
        echo "----- last lines of $log (exit $rc; its files are in $tmp) -----"
        tail -40 "$log"
        echo "-----"
    else
        # A passing binary's files go (some tests write gigabytes); a
        # failing one's stay for a look.
        rm -rf "$tmp"
    fi
    echo "$pass $fail $skip" > "$log.result"
}

if [ "${1:-}" = "--one" ]; then shift; one "$1"; exit 0; fi
[ $# -gt 0 ] || { echo "run-tests.sh: no test binaries given" >&2; exit 2; }
rm -f "$LOGS"/*.result
printf '%s\n' "$@" | xargs -P "$JOBS" -I{} sh "$0" --one {}
P=0; F=0; S=0
for r in "$LOGS"/*.result; do
    [ -f "$r" ] || continue
    read -r p f s < "$r"
    P=$((P + p)); F=$((F + f)); S=$((S + s))
done
n=$#; got=$(ls "$LOGS"/*.result 2>/dev/null | wc -l)
if [ "$got" -ne "$n" ]; then F=$((F + n - got)); fi
echo "$P passed, $F failed, $S skipped"
[ "$F" -eq 0 ]
