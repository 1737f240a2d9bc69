"""The trainer: fp32 master weights and AdamW; after every step it publishes
a bf16 copy of the weights to a shoal store as the next version, and records
that copy's sha256 (model.digest) in RUN_DIR/digests/<version>.json for the
followers to check against."""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import shoal
from model import Decoder, batch, digest


def followers_at(run_dir, names):
    out = []
    for n in names:
        try:
            with open(os.path.join(run_dir, n + ".json")) as f:
                out.append(json.load(f)["version"])
        except (OSError, ValueError, KeyError):
            out.append(0)
    return min(out) if out else 0


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--store", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--followers", default="", help="comma-separated follower names to pace on")
    ap.add_argument("--max-lag", type=int, default=1,
                    help="publish version v+1 only when every follower holds v+1-LAG (0: never wait)")
    ap.add_argument("--wait-timeout", type=float, default=120)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Decoder()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    params = sum(p.numel() for p in model.parameters())
    store = shoal.Store(a.store)
    os.makedirs(os.path.join(a.run_dir, "digests"), exist_ok=True)
    names = [n for n in a.followers.split(",") if n]
    print("trainer: %.2f M parameters (fp32 master, AdamW lr %g), publishing bf16 to %s"
          % (params / 1e6, a.lr, a.store), flush=True)
    for step in range(a.steps):
        x, y = batch(step)
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        bf16 = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
        v = store.latest() + 1
        if a.max_lag and names:
            t0 = time.time()
            while followers_at(a.run_dir, names) < v - a.max_lag:
                if time.time() - t0 > a.wait_timeout:
                    sys.exit("trainer: followers did not reach version %d in %gs" % (v - a.max_lag, a.wait_timeout))
                time.sleep(0.01)
        write_json(os.path.join(a.run_dir, "digests", "%d.json" % v),
                   {"version": v, "sha256": digest(bf16), "step": step, "loss": loss.item()})
        t0 = time.time()
        got = store.publish(bf16)
        if got != v:
            sys.exit("trainer: published version %d, expected %d (another publisher on this run?)" % (got, v))
        m = store.versions()[-1]
        print("trainer: step %d loss %.4f -> version %d (%s, %d bytes, %.0f ms to publish)"
              % (step, loss.item(), v, m["kind"], m["size"], (time.time() - t0) * 1e3), flush=True)
    write_json(os.path.join(a.run_dir, "trainer.json"), {"last_version": store.latest(), "params": params})


if __name__ == "__main__":
    main()
