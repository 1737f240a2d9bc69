"""Store(keep_previous=True), the default: the publisher keeps the image of
the version it published last and makes the next delta against it in
memory.  Every version must still rebuild bit for bit from the store, the
kept image must be dropped for the store's own whenever LATEST moved
without it (a restart, another writer), and the image must be the same file
the publisher without a kept image writes."""
import os
import unittest

import torch

import shoal
from pyutil import read_safetensors, same_bits, scratch


def model(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "emb.weight": torch.randn(512, 64, generator=g) * 0.02,
        "mlp.weight": (torch.randn(256, 64, generator=g) * 0.02).bfloat16(),
        "mlp.half": (torch.randn(128, 64, generator=g) * 0.02).half(),
        "steps": torch.tensor([3], dtype=torch.int64),
    }


def step(sd, k):
    """An AdamW-like step: every float element moves a little."""
    g = torch.Generator().manual_seed(100 + k)
    out = {}
    for n, t in sd.items():
        if t.is_floating_point():
            out[n] = (t.float() + 1e-3 * torch.randn(t.shape, generator=g)).to(t.dtype)
        else:
            out[n] = t + 1
    out["tied"] = out["emb.weight"]  # stored once, as an alias
    return out


class KeepTest(unittest.TestCase):
    def setUp(self):
        self.dir = scratch(self.id().split(".")[-1])
        self.root = os.path.join(self.dir, "store")

    def check_all(self, st, published):
        for v, sd in published.items():
            got = read_safetensors(st.materialize(v, os.path.join(self.dir, "v%d.safetensors" % v)))
            self.assertEqual(sorted(got), sorted(sd), "v%d" % v)
            for n in sd:
                self.assertTrue(same_bits(got[n], sd[n]), "v%d %s" % (v, n))

    def test_restart_reads_the_previous_version_back(self):
        published, sd = {}, model(1)
        st = shoal.Store(self.root, anchor_every=20)
        for k in range(3):
            sd = step(sd, k)
            published[st.publish(sd)] = sd
        # A delta version writes no checkpoint file anywhere in the run.
        run = os.path.join(self.root, "main")
        self.assertEqual(os.listdir(os.path.join(run, "staging")), [])
        self.assertFalse(os.path.exists(os.path.join(run, "cache", "head.safetensors")))
        st.close()
        # A new publisher (a restarted trainer) has no kept image: its first
        # delta is made against version 3 as the store holds it.
        st = shoal.Store(self.root, anchor_every=20)
        for k in range(3, 6):
            sd = step(sd, k)
            published[st.publish(sd)] = sd
        self.assertEqual([v["kind"] for v in st.versions()], ["anchor"] + ["delta"] * 5)
        self.check_all(st, published)
        st.close()

    def test_another_writer_moves_latest(self):
        # Two publishers that share the run on purpose take turns: each
        # one's kept image is a version behind LATEST at every publish, so
        # each delta must be made against the other's version.
        a = shoal.Store(self.root, writer_id="a", anchor_every=20)
        b = shoal.Store(self.root, writer_id="b", anchor_every=20)
        published, sd = {}, model(2)
        for k in range(6):
            sd = step(sd, k)
            published[(a if k % 2 == 0 else b).publish(sd)] = sd
        self.assertEqual(sorted(published), [1, 2, 3, 4, 5, 6])
        self.assertEqual([v["kind"] for v in a.versions()], ["anchor"] + ["delta"] * 5)
        self.check_all(a, published)
        a.close(), b.close()

    def test_same_image_as_without_a_kept_one(self):
        kept = shoal.Store(os.path.join(self.dir, "kept"), anchor_every=2)
        plain = shoal.Store(os.path.join(self.dir, "plain"), anchor_every=2, keep_previous=False)
        sd = model(3)
        for k in range(4):
            sd = step(sd, k)
            self.assertEqual(kept.publish(sd), plain.publish(sd))
        ka, pa = kept.versions(), plain.versions()
        self.assertEqual([v["kind"] for v in ka], ["anchor", "delta", "anchor", "delta"])
        for x, y in zip(ka, pa):
            self.assertEqual((x["kind"], x["model_size"], x["model_xxh3"]),
                             (y["kind"], y["model_size"], y["model_xxh3"]))
        kept.close(), plain.close()

    def test_async_publishes_against_the_kept_image(self):
        st = shoal.Store(self.root, anchor_every=20, threads=1)
        published, futs, sd = {}, [], model(4)
        for k in range(4):
            sd = step(sd, k)
            futs.append((st.publish_async(sd), sd))
        for f, s in futs:
            published[f.result()] = s
        self.assertEqual(st.flush(), 4)
        self.check_all(st, published)
        st.close()

    def test_damaged_previous_version_gives_an_anchor(self):
        sd = step(model(5), 0)
        st = shoal.Store(self.root, anchor_every=20)
        self.assertEqual(st.publish(sd), 1)
        st.close()
        # Version 1 is damaged in place (same size) under a restarted
        # publisher: a delta on the bytes read back could never be applied
        # to the real version 1, so version 2 is an anchor, and says why.
        path = os.path.join(self.root, "main", "versions", "0000000001", "anchor.safetensors")
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) - 100)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0x10]))
        st = shoal.Store(self.root, anchor_every=20)
        sd2 = step(sd, 1)
        with self.assertLogs("shoal", "WARNING") as logs:
            self.assertEqual(st.publish(sd2), 2)
        self.assertIn("publishing version 2 as an anchor", "\n".join(logs.output))
        self.assertIn("hashes to", "\n".join(logs.output))
        self.assertEqual([v["kind"] for v in st.versions()], ["anchor", "anchor"])
        self.check_all(st, {2: sd2})
        st.close()

    def test_bad_thread_count(self):
        with self.assertRaisesRegex(shoal.ShoalError, "-1 encoder threads"):
            shoal.Store(self.root, threads=-1)


if __name__ == "__main__":
    unittest.main()
