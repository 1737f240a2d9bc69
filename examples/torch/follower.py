"""An inference process: a bf16 copy of the decoder, kept on the trainer's
newest version by a shoal replica attached to the push tree.  After each
activation it loads the changed tensors into its live model in place, checks
that its weights are bit-identical to the trainer's bf16 copy (the sha256 in
RUN_DIR/digests/<version>.json), and reports how many bytes arrived."""
import argparse
import json
import os
import sys
import time

import torch

import shoal
from model import Decoder, batch, digest
from trainer import write_json


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--name", required=True)
    ap.add_argument("--dir", required=True, help="the replica's directory")
    ap.add_argument("--parent", action="append", required=True, help="push-tree parent host:port")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--until", type=int, required=True, help="stop after verifying this version")
    ap.add_argument("--timeout", type=float, default=120)
    a = ap.parse_args()
    torch.set_num_threads(1)
    model = Decoder().to(torch.bfloat16).eval()
    rep = shoal.Replica(a.dir, parents=a.parent)
    status = {"name": a.name, "version": 0, "verified": [], "mismatched": [], "bytes_received": 0}
    last, seen_bytes = 0, 0
    x, y = batch(10**6)
    while last < a.until:
        rep.wait(last + 1, timeout=a.timeout)
        report = rep.load_into(model)
        v = report.version
        info = rep.info()
        arrived, seen_bytes = info["bytes_received"] - seen_bytes, info["bytes_received"]
        with open(os.path.join(a.run_dir, "digests", "%d.json" % v)) as f:
            want = json.load(f)
        ok = digest(model.state_dict()) == want["sha256"]
        with torch.no_grad():
            loss = torch.nn.functional.cross_entropy(model(x).float().reshape(-1, 256), y.reshape(-1)).item()
        (status["verified"] if ok else status["mismatched"]).append(v)
        # The most children it fed at once (a child that took the last
        # version may have left before this follower checked its own).
        status.update(version=v, bytes_received=seen_bytes,
                      children=max(status.get("children", 0), info["children"]))
        print("%s: version %d active: %d of %d tensors changed, %d bytes arrived, "
              "bit-identical to the trainer's bf16 copy: %s (eval loss %.4f)"
              % (a.name, v, len(report.changed), len(report.changed) + len(report.unchanged),
                 arrived, "yes" if ok else "NO", loss), flush=True)
        write_json(os.path.join(a.run_dir, a.name + ".json"), status)
        if not ok:
            sys.exit("%s: version %d differs from the trainer's" % (a.name, v))
        last = v
    rep.close()


if __name__ == "__main__":
    main()
