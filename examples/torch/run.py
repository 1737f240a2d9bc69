"""Runs the example end to end on this machine: a store, a push-tree root
(`shoal push serve --fanout 1`, so the follower that attaches second is
redirected below the first: root -> f1 -> f2, or f2 first), N follower processes and the
trainer.  Prints every process's lines and a summary; exits 0 only if every
follower verified every version bit-identical.

    PYTHONPATH=python python3 examples/torch/run.py --versions 20 --followers 2
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def pump(name, proc, lines):
    for line in proc.stdout:
        line = line.rstrip("\n")
        lines.append(line)
        print(line if line.startswith(name) else "%s| %s" % (name, line), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", type=int, default=20, help="trainer steps, one version each (default 20)")
    ap.add_argument("--followers", type=int, default=2, help="follower processes (default 2)")
    ap.add_argument("--workdir", help="default: a fresh temporary directory; an existing one must be empty "
                    "or an earlier run's (it is emptied)")
    ap.add_argument("--shoal", default=os.environ.get("SHOAL_BIN") or os.path.join(ROOT, "build", "shoal"),
                    help="the shoal binary (default: $SHOAL_BIN, else build/shoal)")
    ap.add_argument("--max-lag", type=int, default=1, help="versions the trainer may run ahead (default 1)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for the whole run (default 300)")
    a = ap.parse_args()
    for name, v, lo in (("--versions", a.versions, 1), ("--followers", a.followers, 1), ("--max-lag", a.max_lag, 0),
                        ("--timeout", a.timeout, 1)):
        if v < lo:
            ap.error("%s must be at least %d, got %g" % (name, lo, v))
    if not os.access(a.shoal, os.X_OK):
        ap.error("--shoal %s is not an executable (run `make` first, or pass the binary)" % a.shoal)
    # The trainer and followers run under this interpreter: it must import torch.
    if subprocess.run([sys.executable, "-c", "import torch"], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode:
        sys.exit("run.py: %s cannot import torch; run it with a Python that can (Debian: python3-torch, "
                 "for /usr/bin/python3)" % sys.executable)
    work = a.workdir or tempfile.mkdtemp(prefix="shoal-torch.")
    # Emptied before the run; a folder this script did not make keeps its files.
    marker = os.path.join(work, ".shoal-torch-example")
    earlier = os.path.exists(marker) or all(os.path.isdir(os.path.join(work, d)) for d in ("run", "store"))
    if os.path.isdir(work) and os.listdir(work) and not earlier:
        ap.error("--workdir %s is not empty and not an earlier run's: give a new or empty directory" % work)
    if os.path.exists(work) and not os.path.isdir(work):
        ap.error("--workdir %s is not a directory" % work)
    shutil.rmtree(work, ignore_errors=True)
    run_dir, store = os.path.join(work, "run"), os.path.join(work, "store")
    os.makedirs(run_dir)
    open(marker, "w").close()
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import shoal
    shoal.Store(store).close()  # the run's folders, so that the root can open it
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(ROOT, "python"), HERE] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    procs, threads, out = [], [], {}

    def start(name, argv):
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        out[name] = []
        t = threading.Thread(target=pump, args=(name, p, out[name]), daemon=True)
        t.start()
        procs.append((name, p))
        threads.append(t)
        return p

    addr_file = os.path.join(work, "root.addr")
    rc = 1
    try:
        start("root", [a.shoal, "push", "serve", "--store", store, "--fanout", "1", "--addr-file", addr_file])
        t0 = time.time()
        while not os.path.exists(addr_file):
            if time.time() - t0 > 30 or procs[0][1].poll() is not None:
                sys.exit("run.py: the push root did not start (see its lines above)")
            time.sleep(0.05)
        addr = open(addr_file).read().strip()
        names = ["f%d" % (i + 1) for i in range(a.followers)]
        followers = []
        for i, n in enumerate(names):
            followers.append(start(n, [sys.executable, os.path.join(HERE, "follower.py"), "--name", n,
                                       "--dir", os.path.join(work, n), "--parent", addr, "--run-dir", run_dir,
                                       "--until", str(a.versions), "--timeout", str(a.timeout)]))
            time.sleep(0.3)  # usually f1 attaches first and f2 is redirected below it
        trainer = start("trainer", [sys.executable, os.path.join(HERE, "trainer.py"), "--store", store,
                                    "--run-dir", run_dir, "--steps", str(a.versions), "--followers",
                                    ",".join(names), "--max-lag", str(a.max_lag)])
        # Wait for the trainer and the followers; one that fails ends the run.
        deadline, watched = time.time() + a.timeout, [trainer] + followers
        while True:
            codes = [p.poll() for p in watched]
            if None not in codes or any(c not in (None, 0) for c in codes):
                break
            if time.time() > deadline:
                raise subprocess.TimeoutExpired("run.py", a.timeout)
            time.sleep(0.05)
        rc = 0 if all(p.poll() == 0 for p in [trainer] + followers) else 1
        if rc:
            print("run.py: %s failed (see its lines above)" % ", ".join(
                n for n, p in procs if p in [trainer] + followers and p.poll() not in (None, 0)), flush=True)
        summary = {"versions": a.versions, "workdir": work, "followers": {}}
        for n in names:
            try:
                with open(os.path.join(run_dir, n + ".json")) as f:
                    st = json.load(f)
            except (OSError, ValueError):
                st = {"verified": [], "mismatched": [], "version": 0, "bytes_received": 0}
            summary["followers"][n] = {"verified": len(st["verified"]), "mismatched": len(st["mismatched"]),
                                       "last_version": st["version"], "bytes_received": st["bytes_received"],
                                       "children": st.get("children", 0)}
            if st["mismatched"] or st["version"] < a.versions:
                rc = 1
        with open(os.path.join(work, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        print("run.py: %s" % json.dumps(summary), flush=True)
    except subprocess.TimeoutExpired:
        print("run.py: timed out after %gs" % a.timeout, flush=True)
    finally:
        for name, p in procs:
            if p.poll() is None:
                p.terminate()
        for name, p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for t in threads:
            t.join(timeout=5)
    sys.exit(rc)


if __name__ == "__main__":
    main()
