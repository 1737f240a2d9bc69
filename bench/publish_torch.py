"""Publishing PyTorch weights against torch.save, in the same run (issue 31).

A GPT with a tied head at about --params parameters, trained by AdamW on
random tokens; after each step, the same state dict (fp32, or a bf16 copy)
is timed through:
  torch.save to memory         the baseline for the time training is blocked
  torch.save to a file + fsync the baseline for a durable publish
  Store.publish                a durable version (synchronous)
  Store.publish_async          the call (training blocked), then its Future
                               (end to end: snapshot, encode, fsync, LATEST)
Medians over --versions versions (the first, an anchor, is left out of the
delta medians).  Prints a table, or JSON with --json.

    PYTHONPATH=python /usr/bin/python3 bench/publish_torch.py --params 35e6 --versions 6
"""
import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

import shoal


class GPT(torch.nn.Module):
    def __init__(self, vocab, d, layers):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d, d // 64, 4 * d, dropout=0.0, batch_first=True)
            for _ in range(layers))
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, x):
        h = self.tok(x)
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


def shape_for(params, vocab=32000):
    d = 512 if params < 80e6 else 768
    layers = max(1, round((params - vocab * d) / (12 * d * d)))
    return vocab, d, layers


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def run(params, versions, dtype, work, lr):
    load0 = os.getloadavg()[0]
    torch.manual_seed(0)
    vocab, d, layers = shape_for(params)
    m = GPT(vocab, d, layers)
    n = sum(p.numel() for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=lr)
    sync = shoal.Store(os.path.join(work, "sync"))
    asyn = shoal.Store(os.path.join(work, "async"))
    rows = []
    for v in range(versions):
        x = torch.randint(0, vocab, (2, 32))
        torch.nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten()).backward()
        opt.step()
        opt.zero_grad()
        sd = m.state_dict()
        if dtype != "fp32":
            low = torch.bfloat16 if dtype == "bf16" else torch.float16
            sd = {k: t.to(low) if t.is_floating_point() else t for k, t in sd.items()}
            sd["head.weight"] = sd["tok.weight"]  # the cast copies each; keep them tied
        r = {}
        r["save_mem"], _ = timed(lambda: torch.save(sd, io.BytesIO()))
        path = os.path.join(work, "ckpt.pt")

        def save_fsync():
            with open(path, "wb") as f:
                torch.save(sd, f)
                f.flush()
                os.fsync(f.fileno())
        r["save_fsync"], _ = timed(save_fsync)
        r["save_bytes"] = os.path.getsize(path)
        r["publish"], _ = timed(lambda: sync.publish(sd))
        t0 = time.perf_counter()
        fut = asyn.publish_async(sd)
        r["async_call"] = time.perf_counter() - t0
        fut.result()
        r["async_e2e"] = time.perf_counter() - t0
        vs = asyn.versions()[-1]
        r["kind"], r["stored_bytes"] = vs["kind"], vs["size"]
        rows.append(r)
    # The codec's size against XOR+zstd-1 of the same pair (the baseline
    # `shoal bench delta` uses), per version.
    prev = None
    for v in range(1, versions + 1):
        cur = asyn.materialize(v, os.path.join(work, "v%d.safetensors" % v))
        if prev is not None and rows[v - 1]["kind"] == "delta":
            rows[v - 1]["xor_zstd1"] = shoal.delta.xor_zstd1(prev, cur)
        if prev is not None:
            os.unlink(prev)
        prev = cur
    sync.close()
    asyn.close()
    deltas = [r for r in rows if r["kind"] == "delta"] or rows
    med = {k: statistics.median(r[k] for r in deltas) for k in
           ("save_mem", "save_fsync", "publish", "async_call", "async_e2e", "stored_bytes", "save_bytes")}
    xz = [r for r in deltas if "xor_zstd1" in r]
    if xz:
        med["xor_zstd1"] = statistics.median(r["xor_zstd1"] for r in xz)
        med["delta_vs_xor_zstd1"] = statistics.median(r["stored_bytes"] / r["xor_zstd1"] for r in xz)
    med.update(params=n, layers=layers, d=d, vocab=vocab, dtype=dtype, versions=versions, lr=lr,
               loadavg_start=load0, loadavg_end=os.getloadavg()[0],
               anchor_bytes=rows[0]["stored_bytes"],
               blocked_vs_save_mem=med["async_call"] / med["save_mem"],
               e2e_vs_save_fsync=med["async_e2e"] / med["save_fsync"],
               publish_vs_save_fsync=med["publish"] / med["save_fsync"])
    return med


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=float, action="append", help="parameters (repeatable; default 35e6)")
    ap.add_argument("--dtype", action="append", choices=["fp32", "bf16", "fp16"],
                    help="repeatable; default bf16 and fp32")
    ap.add_argument("--versions", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (default 1e-4)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = []
    for p in a.params or [35e6]:
        for dt in a.dtype or ["bf16", "fp32"]:
            work = tempfile.mkdtemp(prefix="shoal-bench-publish.", dir=os.environ.get("TMPDIR"))
            try:
                out.append(run(p, a.versions, dt, work, a.lr))
            finally:
                shutil.rmtree(work, ignore_errors=True)
            if not a.json:
                r = out[-1]
                print("%5.1fM %s: torch.save mem %.3fs, +fsync %.3fs | publish %.3fs (%.2fx) | "
                      "publish_async blocked %.3fs (%.2fx save mem), end to end %.3fs (%.2fx save+fsync) | "
                      "delta %.3f MB (%.2fx xor+zstd-1), anchor %.1f MB, torch.save %.1f MB" % (
                          r["params"] / 1e6, dt, r["save_mem"], r["save_fsync"], r["publish"],
                          r["publish_vs_save_fsync"], r["async_call"], r["blocked_vs_save_mem"],
                          r["async_e2e"], r["e2e_vs_save_fsync"], r["stored_bytes"] / 1e6, r.get("delta_vs_xor_zstd1", 0),
                          r["anchor_bytes"] / 1e6, r["save_bytes"] / 1e6) +
                      " | load %.1f-%.1f" % (r["loadavg_start"], r["loadavg_end"]), flush=True)
    if a.json:
        json.dump(out, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
