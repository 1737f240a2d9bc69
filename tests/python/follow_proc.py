"""A PyTorch follower in a process of its own, for test_follow.py and
bench/follow_torch.py: it holds a model's tensors (shapes from --shapes),
follows a push tree (--parent) or a store (--store) with shoal.Replica, and
load_into()s every version it activates up to --until, measuring its own
memory from /proc/self/status.

Its baseline is taken once torch is imported, the tensors allocated and
written, and the code paths load_into uses run once: peak VmHWM is counted
from there (/proc/self/clear_refs), and RssAnon / RssFile / RssShmem are
sampled every 2 ms.  Prints one JSON line per load ({"loaded": v,
"rss_file": ..., "crc": ...} measured right after it returns), then a summary
({"done": ..., "sha256": of the tensors' bytes in name order}).  With
--keep-pages, load_into leaves the leased image's pages resident, as it did
before issue 31's fix (a baseline for bench/follow_torch.py).
"""
import argparse
import hashlib
import json
import os
import sys
import threading
import time
import zlib

import torch

import shoal

FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem")


def step(sd, k):
    """One version's change (the publisher's side, test_follow and
    bench/follow_torch.py): 1% of each float tensor's elements, in place."""
    g = torch.Generator().manual_seed(1000 + k)
    for t in sd.values():
        f = t.view(-1)
        if t.is_floating_point():
            idx = torch.randint(0, f.numel(), (max(1, f.numel() // 100),), generator=g)
            f[idx] += (torch.randn(idx.numel(), generator=g) * 1e-3).to(t.dtype)
        else:
            f += 1


def sha256(sd):
    """Of the tensors' bytes, in name order."""
    h = hashlib.sha256()
    for n in sorted(sd):
        h.update(sd[n].contiguous().view(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in FIELDS:
                out[k] = int(v.split()[0]) * 1024
    return out


def warm(target):
    """Runs what load_into runs (bit compares and slice copies of each
    dtype) on the tensors themselves, so that the code it faults in counts
    in the baseline."""
    seen = set()
    for t in target.values():
        if t.dtype in seen or t.numel() == 0:
            continue
        seen.add(t.dtype)
        a = t.reshape(-1)[:1024]
        ints = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
        it = ints.get(t.dtype)
        torch.equal(a.view(it), a.clone().view(it)) if it else torch.equal(a, a.clone())
        a.copy_(a.clone())


def crc(target):
    """CRC-32 of the tensors' bytes in name order (every version checked
    cheaply; the summary's sha256 checks the last)."""
    c = 0
    for n in sorted(target):
        c = zlib.crc32(target[n].contiguous().view(-1).view(torch.uint8).numpy(), c)
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--parent")
    ap.add_argument("--store")
    ap.add_argument("--shapes", required=True, help="JSON {name: [dtype, shape]}")
    ap.add_argument("--until", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--keep-pages", action="store_true",
                    help="load_into as before issue 31's fix: the leased image's pages stay (the baseline "
                         "bench/follow_torch.py compares with)")
    a = ap.parse_args()
    if a.keep_pages:
        shoal.replica._PageDropper.flush = lambda self: None
    spec = json.loads(a.shapes)
    target = {n: torch.zeros(shape, dtype=getattr(torch, dt)) for n, (dt, shape) in sorted(spec.items())}
    tensor_bytes = sum(t.numel() * t.element_size() for t in target.values())
    warm(target)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS from here on
    base = status()
    peak = dict(base)
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            s = status()
            for k in s:
                peak[k] = max(peak[k], s[k])
            time.sleep(0.002)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    kw = {"parents": [a.parent]} if a.parent else {"store": a.store, "poll_s": 0.01}
    rep = shoal.Replica(a.dir, **kw)
    v, loads, t0 = 0, 0, time.time()
    while v < a.until:
        rep.wait(v + 1, timeout=a.timeout)
        r = rep.load_into(target)
        v, loads = r.version, loads + 1
        after = status()
        print(json.dumps({"loaded": v, "rss_file": after["RssFile"], "rss_anon": after["RssAnon"],
                          "crc": crc(target)}), flush=True)
    info = rep.info()
    stop.set()
    th.join()
    end = status()
    peak["VmHWM"] = end["VmHWM"]
    digest = sha256(target)
    rep.close()
    print(json.dumps({"done": v, "loads": loads, "seconds": time.time() - t0, "tensor_bytes": tensor_bytes,
                      "baseline": base, "peak": peak, "final": end, "activations": info["activations"],
                      "failures": info["failures"], "bytes_received": info["bytes_received"],
                      "sha256": digest}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
