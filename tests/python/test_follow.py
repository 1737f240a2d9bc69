"""PyTorch followers on a push tree (issue 31): a follower's memory over 20
versions stays within its own tensors + 1 image + 64 MiB + 2 deltas, with
load_into letting the leased image's pages go as it copies, and every
version it loads is the publisher's bits (CRC-32 each, sha256 the last); a
late joiner activates the newest version first and reports it in info()."""
import json
import os
import subprocess
import sys
import time
import unittest
import zlib

import torch

import shoal
from follow_proc import sha256, step
from pyutil import scratch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHOAL = os.path.abspath(os.environ.get("SHOAL_BIN") or os.path.join(ROOT, "build", "shoal"))
PROC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "follow_proc.py")
MiB = 1 << 20

# About 21 MB of bf16, with an fp32 and an int64 tensor beside it: large
# enough that a leased image kept resident stands out of the baseline's
# noise (2-3 MiB of file pages), small enough for 20 versions in seconds.
SHAPES = {"tok.weight": ["bfloat16", [2048, 1024]], "norm.weight": ["float32", [1024]],
          "steps": ["int64", [4]]}
SHAPES.update({"l%d.w" % i: ["bfloat16", [1024, 2048]] for i in range(4)})


# 2.6 MB, for the joiner.
SMALL = {"tok.weight": ["bfloat16", [256, 1024]], "norm.weight": ["float32", [1024]],
         "l0.w": ["bfloat16", [1024, 512]], "l1.w": ["bfloat16", [1024, 512]], "steps": ["int64", [4]]}


def model(seed, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    return {n: (torch.randn(shape, generator=g) * 0.02).to(getattr(torch, dt)) if dt != "int64"
            else torch.zeros(shape, dtype=torch.int64) for n, (dt, shape) in sorted(shapes.items())}


def crc(sd):
    c = 0
    for n in sorted(sd):
        c = zlib.crc32(sd[n].contiguous().view(-1).view(torch.uint8).numpy(), c)
    return c


def serve(store, workdir, *extra):
    addr, log = os.path.join(workdir, "root.addr"), os.path.join(workdir, "root.log")
    with open(log, "w") as lf:
        p = subprocess.Popen([SHOAL, "push", "serve", "--store", store, "--addr-file", addr] + list(extra),
                             stdout=subprocess.DEVNULL, stderr=lf)
    for _ in range(600):
        if os.path.exists(addr):
            with open(addr) as f:
                a = f.read().strip()
            if a:
                return p, a
        if p.poll() is not None:
            break
        time.sleep(0.05)
    p.kill()
    p.wait()
    with open(log) as f:
        raise AssertionError("push root did not start: " + f.read())


class FollowTest(unittest.TestCase):
    def setUp(self):
        self.dir = scratch(self.id().split(".")[-1])
        self.store = os.path.join(self.dir, "store")
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stdout:
                p.stdout.close()

    def test_push_follower_memory_bounded_over_20_versions(self):
        st = shoal.Store(self.store)
        sd = model(1)
        st.publish(sd)
        root, addr = serve(self.store, self.dir)
        self.procs.append(root)
        f = subprocess.Popen([sys.executable, PROC, "--dir", os.path.join(self.dir, "rep"), "--parent", addr,
                              "--shapes", json.dumps(SHAPES), "--until", "20", "--timeout", "60"],
                             stdout=subprocess.PIPE, text=True)
        self.procs.append(f)
        lines = []
        for v in range(1, 21):
            # The next version once the follower has loaded this one, so
            # that it loads every version (none skipped).
            line = f.stdout.readline()
            self.assertTrue(line, "follower exited: %s" % lines)
            lines.append(json.loads(line))
            self.assertEqual(lines[-1]["loaded"], v)
            self.assertEqual(lines[-1]["crc"], crc(sd), "version %d differs after load_into" % v)
            if v < 20:
                step(sd, v)
                self.assertEqual(st.publish(sd), v + 1)
        done = json.loads(f.stdout.readline())
        self.assertEqual(f.wait(60), 0)
        self.assertEqual(done["sha256"], sha256(sd))  # bit-exact at the end
        self.assertEqual((done["done"], done["loads"], done["failures"]), (20, 20, 0))
        vs = st.versions()
        st.close()
        image = vs[-1]["model_size"]
        dmax = max(m["size"] for m in vs if m["kind"] == "delta")
        self.assertGreater(sum(m["kind"] == "anchor" for m in vs), 1)  # it crossed an anchor
        base, peak = done["baseline"], done["peak"]
        bound = image + 64 * MiB + 2 * dmax
        grown = peak["VmHWM"] - base["VmRSS"]
        print("image %.1f MiB, deltas up to %.2f MiB; follower above its baseline (torch + its %.1f MiB of "
              "tensors): peak %.1f MiB (anon %.1f, file %.1f, shmem %.1f) = %.2fx the bound %.1f MiB; RssFile "
              "after each load up to %.1f MiB above the baseline; %.1f s"
              % (image / MiB, dmax / MiB, done["tensor_bytes"] / MiB, grown / MiB,
                 (peak["RssAnon"] - base["RssAnon"]) / MiB, (peak["RssFile"] - base["RssFile"]) / MiB,
                 (peak["RssShmem"] - base["RssShmem"]) / MiB, grown / bound, bound / MiB,
                 max(l["rss_file"] - base["RssFile"] for l in lines) / MiB, done["seconds"]))
        self.assertGreater(image, 20 * 1000 * 1000)
        self.assertLessEqual(grown, bound)
        # What load_into read of the leased image left the process as it
        # went: right after each load, the file-backed pages are within
        # half an image of the baseline (the leased image itself would be a
        # whole one).  At this size, that and not the bound above is what
        # fails if the pages stay.
        for l in lines:
            self.assertLess(l["rss_file"] - base["RssFile"], image // 2, l)

    def test_late_joiner_activates_the_newest_first(self):
        st = shoal.Store(self.store, anchor_every=4)
        sd = model(2, SMALL)
        for v in range(1, 11):
            if v > 1:
                step(sd, v)
            self.assertEqual(st.publish(sd), v)
        st.close()
        # A slow link (the anchor takes most of a second): the joiner
        # learns that version 10 exists from the root's announcement, not
        # from a payload that arrived.
        root, addr = serve(self.store, self.dir, "--egress-gbps", "0.03")
        self.procs.append(root)
        rep = shoal.Replica(os.path.join(self.dir, "rep"), parents=[addr])
        try:
            self.assertEqual(rep.wait(1, timeout=60), 10)
            info = rep.info()
            self.assertEqual((info["activations"], info["failures"], info["newest_announced"]), (1, 0, 10))
            live = {n: torch.zeros_like(t) for n, t in sd.items()}
            self.assertEqual(rep.load_into(live).version, 10)
            self.assertEqual(sha256(live), sha256(sd))
            plan = json.loads(subprocess.run([SHOAL, "store", "plan", self.store, "--from", "0", "--to", "10",
                                              "--json"], stdout=subprocess.PIPE, check=True).stdout)
            print("joiner at v10: %d bytes received, the store's plan %s" % (info["bytes_received"], plan))
            self.assertLessEqual(info["bytes_received"], plan["bytes"] * 1.2)
            # Nothing before version 10 was written as a model.
            self.assertEqual(os.listdir(os.path.join(rep.dir, "models")), ["%010d.safetensors" % 10])
        finally:
            rep.close()


if __name__ == "__main__":
    unittest.main()
