"""shoal.delta: make, apply and inspect on files written without shoal."""
import os
import unittest

import torch

import shoal
from pyutil import save_safetensors, scratch


class DeltaTest(unittest.TestCase):
    def setUp(self):
        self.dir = scratch(self.id().split(".")[-1])
        g = torch.Generator().manual_seed(5)
        self.base = {"w": torch.randn(512, 256, generator=g).bfloat16(), "b": torch.randn(256, generator=g),
                     "ids": torch.arange(100)}
        self.new = {k: v.clone() for k, v in self.base.items()}
        self.new["w"][::7, ::5] += 0.01  # a sparse change
        self.a, self.b = os.path.join(self.dir, "a.safetensors"), os.path.join(self.dir, "b.safetensors")
        save_safetensors(self.a, self.base)
        save_safetensors(self.b, self.new)

    def test_round_trip_byte_for_byte(self):
        d = os.path.join(self.dir, "ab.shd")
        st = shoal.delta.make(self.a, self.b, d)
        self.assertEqual(st["delta_bytes"], os.path.getsize(d))
        self.assertEqual(st["target_bytes"], sum(t.numel() * t.element_size() for t in self.new.values()))
        self.assertGreater(st["changed"], 0)
        self.assertLess(st["changed"], st["units"])
        self.assertLess(st["delta_bytes"], os.path.getsize(self.b) / 4)
        out = os.path.join(self.dir, "out.safetensors")
        self.assertEqual(shoal.delta.apply(self.a, d, out), out)
        with open(out, "rb") as f1, open(self.b, "rb") as f2:
            self.assertEqual(f1.read(), f2.read())

    def test_inspect(self):
        d = os.path.join(self.dir, "ab.shd")
        shoal.delta.make(self.a, self.b, d)
        j = shoal.delta.inspect(d)
        self.assertEqual(j["bytes"], os.path.getsize(d))
        by = {t["name"]: t for t in j["tensors"]}
        self.assertEqual(sorted(by), ["b", "ids", "w"])
        self.assertEqual(by["w"]["dtype"], "BF16")
        self.assertGreater(by["w"]["changed_fraction"], 0)
        self.assertEqual(by["b"]["changed_fraction"], 0)
        self.assertEqual(len(j["target_digest"]), 32)

    def test_errors_carry_shoal_messages(self):
        d = os.path.join(self.dir, "ab.shd")
        shoal.delta.make(self.a, self.b, d)
        # The wrong base is refused, and nothing is written.
        out = os.path.join(self.dir, "out.safetensors")
        with self.assertRaises(shoal.ShoalError) as cm:
            shoal.delta.apply(self.b, d, out)
        self.assertEqual(cm.exception.name, "EMISMATCH")
        self.assertFalse(os.path.exists(out))
        with self.assertRaises(shoal.NotFound):
            shoal.delta.make(os.path.join(self.dir, "nope.safetensors"), self.b, d)
        bad = os.path.join(self.dir, "bad.shd")
        with open(bad, "wb") as f:
            f.write(b"not a delta at all")
        with self.assertRaises(shoal.ShoalError) as cm:
            shoal.delta.inspect(bad)
        self.assertIn("bad.shd", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
