#!/usr/bin/env python3
"""Mutation testing for shoal: `make mutants` (docs/testing.md).

Each mutant in tests/mutants.txt is one small, plausible mistake: an exact
piece of text in one source file and its replacement, with the tests that
must catch it.  For each mutant this script copies the change into a private
copy of the tree (build/mut/tree, so that an interrupted run never leaves a
mutant in the working tree), rebuilds the library, `shoal` and the named test
binaries there (optimised), runs the named tests, and puts the file back.

A mutant is
  KILLED     a named test failed (or crashed, or timed out),
  SURVIVED   every named test passed: a test is missing,
  EQUIVALENT it survived and the list says why no test can catch it,
  STALE      its text is not found exactly once in the file (the code moved:
             update the entry),
  NOBUILD    the mutated tree does not compile (rewrite the mutant).
Exit status 0 only when every mutant is KILLED or EQUIVALENT, and the named
tests pass on the unmutated tree first.

Usage: scripts/mutants.py [--list] [--only ID[,ID...]] [--file tests/mutants.txt]
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TREE = os.path.join(ROOT, "build", "mut", "tree")
LOG = os.path.join(ROOT, "build", "mut", "log")
KEYS = ("mutant", "file", "from", "to", "tests", "timeout", "equivalent", "note")


def die(msg):
    print("mutants: " + msg, file=sys.stderr)
    sys.exit(2)


def parse(path):
    """Blocks of `key: value` lines separated by blank lines; a value may go
    on over lines that start with whitespace (joined with a newline, so that
    a mutant can span lines).  `#` lines are comments."""
    entries, cur, last = [], None, None
    with open(path) as f:
        lines = f.read().split("\n")
    for no, line in enumerate(lines, 1):
        if line.startswith("#"):
            continue
        if not line.strip():
            if cur:
                entries.append(cur)
            cur, last = None, None
            continue
        if line[0] in " \t" and cur is not None and last in ("from", "to"):
            # A continuation: "|" marks where the line's text starts, so that
            # leading whitespace of the code is kept exactly.
            m = re.match(r"\s*\|(.*)$", line)
            if not m:
                die(f"{path}:{no}: a continuation of '{last}' starts with spaces and '|'")
            cur[last] += "\n" + m.group(1)
            continue
        m = re.match(r"([a-z]+):\s?(.*)$", line)
        if not m or m.group(1) not in KEYS:
            die(f"{path}:{no}: expected one of {', '.join(KEYS)}, then ':'")
        key, val = m.group(1), m.group(2)
        if key == "mutant":
            if cur:
                entries.append(cur)
            cur = {"line": no}
        elif cur is None:
            die(f"{path}:{no}: '{key}' before any 'mutant:' line")
        if key in ("from", "to") and val.startswith("|"):
            val = val[1:]
        cur[key] = val
        last = key
    if cur:
        entries.append(cur)
    ids = set()
    for e in entries:
        for k in ("mutant", "file", "from", "to", "tests"):
            if k not in e:
                die(f"{path}:{e['line']}: mutant {e.get('mutant', '?')} has no '{k}'")
        if e["mutant"] in ids:
            die(f"{path}:{e['line']}: mutant id {e['mutant']} used twice")
        ids.add(e["mutant"])
        e["tests"] = e["tests"].split()
        e["timeout"] = int(e.get("timeout", "120"))
    return entries


def sync_tree(tree=None):
    """Copies the tracked and untracked-but-not-ignored files into TREE.  A
    file is copied only when its bytes differ, and gets the current time,
    so that make rebuilds exactly what changed since the last run (also a
    file a killed run left mutated)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.split(b"\0")
    tree = tree or TREE
    os.makedirs(tree, exist_ok=True)
    for rel in files:
        if not rel:
            continue
        rel = rel.decode()
        src, dst = os.path.join(ROOT, rel), os.path.join(tree, rel)
        if not os.path.isfile(src) or os.path.islink(src):
            continue
        with open(src, "rb") as f:
            data = f.read()
        try:
            with open(dst, "rb") as f:
                if f.read() == data:
                    continue
        except FileNotFoundError:
            pass
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as f:
            f.write(data)
        shutil.copymode(src, dst)
    # Installed, ignored folders the tests read (the dashboard's browser
    # driver): linked, so that a test does not skip in the copy.
    for rel in ["tests/browser/node_modules"]:
        src, dst = os.path.join(ROOT, rel), os.path.join(tree, rel)
        if os.path.isdir(src) and not os.path.lexists(dst):
            os.symlink(src, dst)


def binaries(tests):
    return sorted({"build/tests/" + t.split(":")[0] for t in tests})


def build(targets, log, tree=None, jobs=None, shoal=True):
    # The Python tests load build/libshoal.so, which no test binary links
    # (and `.SECONDARY:` keeps make from building a missing prerequisite of
    # a target that is up to date): `all` brings it up to date.
    py = ["all"] if any(t.startswith("build/tests/test_python") for t in targets) else []
    # shoal=False: the tests do not run the shoal binary, so build/shoal
    # and build/shoal-core (the longest link) are not relinked.
    cmd = ["make", "--no-print-directory", "-j" + str(jobs or os.cpu_count() or 2), "OPTFLAGS=-O2"] + \
        (["build/shoal"] if shoal else []) + py + targets
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        return subprocess.run(cmd, cwd=tree or TREE, stdout=f, stderr=subprocess.STDOUT).returncode == 0


def run_test(spec, timeout, log, tree=None, bindir=None):
    """Runs one test binary (a cmocka name filter after ':' picks tests);
    returns 'pass', 'fail' or 'timeout'."""
    tree = tree or TREE
    bindir = bindir or os.path.join(tree, "build")
    name, _, flt = spec.partition(":")
    env = dict(os.environ)
    env.update(SHOAL_BIN=os.path.join(bindir, "shoal"), CMOCKA_MESSAGE_OUTPUT="stdout",
               SHOAL_SHARED=env.get("SHOAL_SHARED") or os.path.abspath(os.path.join(ROOT, "..", "shared")))
    env.pop("SHOAL_TEST_FILTER", None)
    if flt:
        env["SHOAL_TEST_FILTER"] = flt
    tmp = tempfile.mkdtemp(prefix="shoal-mut.")
    env["SHOAL_TEST_TMP"] = tmp
    out = os.path.join(tmp, "out.log")
    with open(out, "w") as f:
        p = subprocess.Popen([os.path.join(bindir, "tests", name)], cwd=tree, env=env, stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True)
        rc = None
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            # The test's own process group: servers and agents it started,
            # too (also when this script is interrupted).
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
            p.wait()
    text = open(out, errors="replace").read()
    with open(log, "a") as f:
        f.write(f"$ {name} (filter {flt or '*'}) exit {rc}\n{text}\n")
    # rm, not shutil.rmtree: a test may leave a tree deeper than Python's
    # recursion limit (test_security_agent's work-dir attack).
    subprocess.run(["rm", "-rf", "--one-file-system", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if rc is None:
        return "timeout"
    if rc == 0 and flt and "[==========] 0 test(s) run." in text:
        return "nomatch"
    return "pass" if rc == 0 else "fail"


def on_term(signum, frame):
    # Turned into an exception so that the mutated file is put back and the
    # running test's processes are killed on the way out.
    raise SystemExit(130)


def main():
    signal.signal(signal.SIGTERM, on_term)
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default=os.path.join(ROOT, "tests", "mutants.txt"))
    ap.add_argument("--only", help="comma-separated mutant ids")
    ap.add_argument("--list", action="store_true", help="check the list and print it")
    ap.add_argument("--no-baseline", action="store_true", help="skip the run on the unmutated tree")
    a = ap.parse_args()
    entries = parse(a.file)
    if a.only:
        want = set(a.only.split(","))
        unknown = want - {e["mutant"] for e in entries}
        if unknown:
            die("no such mutant: " + ", ".join(sorted(unknown)))
        entries = [e for e in entries if e["mutant"] in want]
    if a.list:
        # The working tree's files: `make test` runs this, so that an entry
        # a change left stale fails there, not only in the next `make mutants`.
        stale = 0
        for e in entries:
            try:
                n = open(os.path.join(ROOT, e["file"])).read().count(e["from"])
            except OSError as err:
                n, why = -1, f"cannot read {e['file']}: {err.strerror}"
            if n != 1:
                why = why if n < 0 else f"its from text occurs {n} times in {e['file']} (expected once)"
                print(f"mutants: {a.file}: mutant {e['mutant']}: STALE: {why}: update the entry", file=sys.stderr)
                stale += 1
            print(f"{e['mutant']:28} {e['file']:26} {' '.join(e['tests'])}")
        print(f"{len(entries)} mutants, {stale} stale")
        return 1 if stale else 0
    os.makedirs(LOG, exist_ok=True)
    t0 = time.time()
    sync_tree()
    # Stale entries are found before anything is built, in the copy that is
    # tested (the working tree may change while this runs).
    for e in entries:
        path = os.path.join(TREE, e["file"])
        try:
            text = open(path).read()
        except OSError as err:
            e["result"] = "STALE"
            e["why"] = f"cannot read {e['file']}: {err.strerror}"
            continue
        n = text.count(e["from"])
        if n != 1:
            e["result"] = "STALE"
            e["why"] = f"its text occurs {n} times in {e['file']} (expected once): update the entry"
    live = [e for e in entries if "result" not in e]
    all_tests = sorted({t for e in live for t in e["tests"]})
    base_log = os.path.join(LOG, "baseline.log")
    open(base_log, "w").close()
    if live and not build(binaries(all_tests), base_log):
        die(f"the unmutated tree does not build; see {base_log}")
    broken = set()
    if not a.no_baseline:
        for t in all_tests:
            to = max(e["timeout"] for e in live if t in e["tests"])
            r = run_test(t, to, base_log)
            if r != "pass":
                broken.add(t)
                print(f"BASELINE  {t}: {r} on the unmutated tree (see {base_log})", flush=True)
    for i, e in enumerate(entries):
        if "result" in e:
            print(f"{e['result']:10} {e['mutant']:28} {e['why']}", flush=True)
            continue
        log = os.path.join(LOG, e["mutant"] + ".log")
        open(log, "w").close()
        path = os.path.join(TREE, e["file"])
        orig = open(path).read()
        t1 = time.time()
        if orig.count(e["from"]) != 1:
            e["result"], e["why"] = "STALE", f"its text occurs {orig.count(e['from'])} times in {e['file']}"
            print(f"{e['result']:10} {e['mutant']:28} {e['why']}", flush=True)
            continue
        try:
            with open(path, "w") as f:
                f.write(orig.replace(e["from"], e["to"], 1))
            if not build(binaries(e["tests"]), log):
                e["result"], e["why"] = "NOBUILD", f"the mutated tree does not compile; see {log}"
            else:
                e["why"] = "every named test passed"
                e["result"] = "SURVIVED"
                for t in e["tests"]:
                    if t in broken:
                        continue
                    r = run_test(t, e["timeout"], log)
                    if r == "nomatch":
                        e["result"], e["why"] = "NOBUILD", f"filter of {t} matches no test"
                        break
                    if r != "pass":
                        e["result"], e["why"] = "KILLED", f"by {t}" + (" (timeout)" if r == "timeout" else "")
                        break
                if e["result"] == "SURVIVED" and e.get("equivalent"):
                    e["result"], e["why"] = "EQUIVALENT", e["equivalent"]
                if e["result"] == "SURVIVED" and all(t in broken for t in e["tests"]):
                    e["result"], e["why"] = "UNTESTED", "its tests fail on the unmutated tree"
        finally:
            # Written back with a new time, so that the next build recompiles it.
            with open(path, "w") as f:
                f.write(orig)
        print(f"{e['result']:10} {e['mutant']:28} {e['why']}  [{time.time() - t1:.0f}s]", flush=True)
    # Leave the tree's objects unmutated for the next run.
    counts = {}
    for e in entries:
        counts[e["result"]] = counts.get(e["result"], 0) + 1
    bad = sum(v for k, v in counts.items() if k not in ("KILLED", "EQUIVALENT")) + len(broken)
    summary = ", ".join(f"{counts.get(k, 0)} {k.lower()}" for k in
                        ("KILLED", "EQUIVALENT", "SURVIVED", "STALE", "NOBUILD", "UNTESTED"))
    print(f"mutants: {len(entries)} run in {time.time() - t0:.0f}s: {summary}"
          + (f"; {len(broken)} baseline failures" if broken else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
