"""A PyTorch follower's memory with load_into, against the bound (issue 31).

A store, a push root (`shoal push serve`) and two PyTorch followers attached
to it (tests/python/follow_proc.py, each a process of its own holding the
model's tensors): one with load_into as it is (the leased image's pages
dropped as it copies), one with those pages kept, as before the fix: the
baseline, in the same run.  The trainer side publishes --versions versions
of a bf16 model of about --mb MB with Qwen2.5-1.5B's widths (1% of the
elements change per version; an anchor every --anchor-every versions), the
next one once both followers have loaded the last; both end bit-exact.

Each follower's baseline is its RSS once torch is loaded and its tensors
are written; the figure is its peak (VmHWM) above that, against the bound
1 image + 64 MiB + 2 deltas (its own tensors being in the baseline), with
RssAnon and RssFile (sampled every 2 ms) apart.  Prints a table, or JSON
with --json.

    SHOAL_LIB=build/libshoal.so.0 PYTHONPATH=python /usr/bin/python3 bench/follow_torch.py --mb 150
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

import shoal

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PROC = os.path.join(ROOT, "tests", "python", "follow_proc.py")
sys.path.insert(0, os.path.dirname(PROC))
from follow_proc import sha256, step  # noqa: E402  (the follower's own helpers: one change, one digest)
MiB = 1 << 20


def shapes_for(mb):
    """bf16 tensors of Qwen2.5-1.5B's widths (1536 and 8960) adding up to
    about mb MB, with an fp32 norm and an int64 buffer beside them."""
    s = {"model.norm.weight": ["float32", [1536]], "steps": ["int64", [4]]}
    per = 8960 * 1536 * 2
    n = max(1, int(mb * 1e6 * 0.8) // per)
    for i in range(n):
        s["model.layers.%d.mlp.up_proj.weight" % i] = ["bfloat16", [8960, 1536]]
    rows = max(1, (int(mb * 1e6) - n * per) // (1536 * 2))
    s["model.embed_tokens.weight"] = ["bfloat16", [rows, 1536]]
    return s


def model(shapes):
    g = torch.Generator().manual_seed(1)
    return {n: (torch.randn(shape, generator=g) * 0.02).to(getattr(torch, dt)) if dt != "int64"
            else torch.zeros(shape, dtype=torch.int64) for n, (dt, shape) in sorted(shapes.items())}


def run(a, work):
    shapes = shapes_for(a.mb)
    store = os.path.join(work, "store")
    st = shoal.Store(store, anchor_every=a.anchor_every)
    sd = model(shapes)
    st.publish(sd)
    addr_file = os.path.join(work, "root.addr")
    with open(os.path.join(work, "root.log"), "w") as log:
        root = subprocess.Popen([a.shoal, "push", "serve", "--store", store, "--addr-file", addr_file],
                                stdout=subprocess.DEVNULL, stderr=log)
    procs = [root]
    try:
        while not (os.path.exists(addr_file) and open(addr_file).read().strip()):
            if root.poll() is not None:
                raise SystemExit("push root exited; see %s/root.log" % work)
            time.sleep(0.05)
        addr = open(addr_file).read().strip()
        kinds = {"load_into": [], "pages_kept": ["--keep-pages"]}
        fol = {}
        for k, extra in kinds.items():
            fol[k] = subprocess.Popen([sys.executable, PROC, "--dir", os.path.join(work, k), "--parent", addr,
                                       "--shapes", json.dumps(shapes), "--until", str(a.versions),
                                       "--timeout", "600"] + extra, stdout=subprocess.PIPE, text=True)
            procs.append(fol[k])
        loads = {k: [] for k in kinds}
        for v in range(1, a.versions + 1):
            for k, p in fol.items():
                line = p.stdout.readline()
                if not line:
                    raise SystemExit("follower %s exited at version %d" % (k, v))
                loads[k].append(json.loads(line))
                assert loads[k][-1]["loaded"] == v, (k, loads[k][-1])
            if v < a.versions:
                step(sd, v)
                st.publish(sd)
        done = {k: json.loads(p.stdout.readline()) for k, p in fol.items()}
        for k, p in fol.items():
            if p.wait(120) != 0 or done[k]["sha256"] != sha256(sd):
                raise SystemExit("follower %s: exit %s, bit-exact %s" % (k, p.returncode,
                                                                         done[k]["sha256"] == sha256(sd)))
        vs = st.versions()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        st.close()
    image = vs[-1]["model_size"]
    dmax = max(m["size"] for m in vs if m["kind"] == "delta")
    bound = image + 64 * MiB + 2 * dmax
    out = {"mb": a.mb, "versions": a.versions, "anchors": sum(m["kind"] == "anchor" for m in vs),
           "image_bytes": image, "delta_bytes_max": dmax, "bound_bytes": bound, "followers": {}}
    for k, d in done.items():
        b, p = d["baseline"], d["peak"]
        grown = p["VmHWM"] - b["VmRSS"]
        out["followers"][k] = {
            "tensor_bytes": d["tensor_bytes"], "baseline_rss": b["VmRSS"], "peak_above_baseline": grown,
            "peak_anon_above_baseline": p["RssAnon"] - b["RssAnon"],
            "peak_file_above_baseline": p["RssFile"] - b["RssFile"],
            "file_after_load_max": max(l["rss_file"] for l in loads[k]) - b["RssFile"],
            "ratio_vs_bound": grown / bound, "seconds": d["seconds"], "bit_exact": True}
    f, o = out["followers"]["load_into"], out["followers"]["pages_kept"]
    out["ratio_vs_pages_kept"] = f["peak_above_baseline"] / o["peak_above_baseline"]
    out["met"] = f["ratio_vs_bound"] <= 1.0
    return out


def print_table(r):
    print("image %.1f MiB, %d versions (%d anchors), deltas up to %.2f MiB; bound 1 image + 64 MiB + 2 deltas "
          "= %.1f MiB above the follower's baseline (torch and its own tensors)\n"
          % (r["image_bytes"] / MiB, r["versions"], r["anchors"], r["delta_bytes_max"] / MiB,
             r["bound_bytes"] / MiB))
    print("| follower | baseline RSS | peak above it | vs bound | RssAnon peak | RssFile peak | RssFile after a "
          "load |")
    print("|---|---|---|---|---|---|---|")
    for k, f in r["followers"].items():
        print("| %s | %.1f MiB | %.1f MiB | %.2fx | %.1f MiB | %.1f MiB | %.1f MiB |"
              % (k, f["baseline_rss"] / MiB, f["peak_above_baseline"] / MiB, f["ratio_vs_bound"],
                 f["peak_anon_above_baseline"] / MiB, f["peak_file_above_baseline"] / MiB,
                 f["file_after_load_max"] / MiB))
    print("\nload_into: %.2fx the bound (%s), %.2fx the follower that keeps the leased pages (same run)"
          % (r["followers"]["load_into"]["ratio_vs_bound"], "met" if r["met"] else "MISSED",
             r["ratio_vs_pages_kept"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=150)
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--anchor-every", type=int, default=8)
    ap.add_argument("--shoal", default=os.environ.get("SHOAL_BIN", os.path.join(ROOT, "build", "shoal")))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="shoal-follow-torch.")
    try:
        r = run(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(r, indent=1) if a.json else "", end="\n" if a.json else "")
    if not a.json:
        print_table(r)
    return 0 if r["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
