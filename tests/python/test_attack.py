"""The Python binding attacked as a PyTorch user would by mistake: tensors
whose memory is not what they show, names and paths C reads differently,
numbers ctypes wraps, and dtypes torch 1.13 lacks.  Each case failed
(silently wrong, or an unrelated error) before its fix."""
import os
import struct
import unittest

import torch

import shoal
from pyutil import read_safetensors, same_bits, scratch, write_raw


class AttackTest(unittest.TestCase):
    def setUp(self):
        self.dir = scratch(self.id().split(".")[-1])
        self.root = os.path.join(self.dir, "store")
        self.st = shoal.Store(self.root)

    def tearDown(self):
        self.st.close()

    def test_lazy_conj_and_neg_views_are_refused(self):
        # x.conj() and torch._neg_view(x) share x's memory and only flag the
        # sign: publishing their bytes stored x (1+2j where 1-2j was meant).
        x = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
        with self.assertRaisesRegex(shoal.ShoalError, "tensor c: a lazily conjugated view"):
            self.st.publish({"c": x.conj()})
        with self.assertRaisesRegex(shoal.ShoalError, "tensor n: a lazily negated view"):
            self.st.publish({"n": torch._neg_view(x)})
        self.assertEqual(self.st.latest(), 0)
        # What the message says to do publishes the values shown.
        v = self.st.publish({"c": x.conj().resolve_conj()})
        got = read_safetensors(self.st.materialize(v, os.path.join(self.dir, "c.safetensors")))
        self.assertTrue(torch.equal(got["c"], torch.tensor([1 - 2j, 3 + 4j])))

    def test_sparse_tensor_is_named(self):
        with self.assertRaisesRegex(shoal.ShoalError, "tensor sp: layout torch.sparse_coo"):
            self.st.publish({"sp": torch.eye(3).to_sparse()})

    def test_nul_in_names_and_paths(self):
        # C strings end at a NUL: "w\0evil" was published as "w", and
        # Store(".../store\0x") opened ".../store".
        with self.assertRaisesRegex(shoal.ShoalError, "holds a NUL character"):
            self.st.publish({"w\0evil": torch.zeros(2)})
        with self.assertRaisesRegex(ValueError, "run id 'main\\\\x00x' holds a NUL"):
            shoal.Store(self.root, run="main\0x")
        with self.assertRaisesRegex(ValueError, "holds a NUL byte"):
            shoal.Store(self.root + "\0x")
        with self.assertRaisesRegex(ValueError, "holds a NUL byte"):
            self.st.publish(os.path.join(self.dir, "a.safetensors\0.txt"))
        with self.assertRaisesRegex(ValueError, "holds a NUL byte"):
            shoal.Replica(os.path.join(self.dir, "rep\0x"), store=self.root)
        self.assertEqual(self.st.latest(), 0)

    def test_version_numbers_out_of_range(self):
        # ctypes wrapped them: -1 read as version 2**64 - 1, 2**64 as 0.
        self.st.publish({"w": torch.zeros(2)})
        out = os.path.join(self.dir, "x.safetensors")
        for bad in (-1, 1 << 64, 1 << 70):
            with self.assertRaisesRegex(ValueError, "version %d is out of range" % bad):
                self.st.materialize(bad, out)
        with self.assertRaises(TypeError):
            self.st.materialize("1", out)
        with self.assertRaisesRegex(ValueError, "anchor_every -1"):
            shoal.Store(self.root, anchor_every=-1)
        with shoal.Replica(os.path.join(self.dir, "rep"), store=self.root, poll_s=0.01) as rep:
            self.assertEqual(rep.wait(1, timeout=30), 1)
            with self.assertRaisesRegex(ValueError, "min_version -1"):
                rep.lease(min_version=-1)
            with self.assertRaisesRegex(ValueError, "min_version"):
                rep.wait(1 << 64, timeout=0.1)
        self.assertFalse(os.path.exists(out))

    def test_load_into_keeps_bits_of_dtypes_torch_lacks(self):
        # F8_E4M3 and U16 come back as uint8 / int16 views of their bits;
        # load_into converted those to a bf16 / int32 target as numbers
        # (the byte 0x38, E4M3 for 1.0, became 56.0).
        f8 = bytes([0x38, 0xB8, 0x40, 0x00])  # 1.0, -1.0, 2.0, 0.0 in E4M3
        u16 = struct.pack("<2H", 65535, 1)
        path = os.path.join(self.dir, "raw.safetensors")
        write_raw(path, [("f8", "F8_E4M3", [4], f8), ("u16", "U16", [2], u16),
                         ("w", "BF16", [2], struct.pack("<2H", 0x3F80, 0x4000))])
        self.st.publish(path)
        with shoal.Replica(os.path.join(self.dir, "rep"), store=self.root, poll_s=0.01) as rep:
            rep.wait(1, timeout=30)
            target = {"f8": torch.zeros(4, dtype=torch.bfloat16), "u16": torch.zeros(2, dtype=torch.int16),
                      "w": torch.zeros(2, dtype=torch.float32)}
            with self.assertRaisesRegex(shoal.ShoalError, "tensor f8: F8_E4M3 in the version has no torch "
                                        "dtype .* load it into a torch.uint8 tensor"):
                rep.load_into(target)
            self.assertTrue(torch.equal(target["f8"], torch.zeros(4, dtype=torch.bfloat16)))
            target["f8"] = torch.zeros(4, dtype=torch.uint8)
            target["u16"] = torch.zeros(2, dtype=torch.int32)
            with self.assertRaisesRegex(shoal.ShoalError, "tensor u16: U16 .* torch.int16 tensor; "
                                        "nothing was loaded"):
                rep.load_into(target)
            # A load that raises writes nothing (f8 comes first and was
            # copied before the check on u16 raised).
            self.assertTrue(torch.equal(target["f8"], torch.zeros(4, dtype=torch.uint8)))
            target["u16"] = torch.zeros(2, dtype=torch.int16)
            target["w"] = torch.zeros(3)
            with self.assertRaisesRegex(shoal.ShoalError, "tensor w: shape"):
                rep.load_into(target)
            target["w"] = torch.zeros(2)
            self.assertTrue(torch.equal(target["f8"], torch.zeros(4, dtype=torch.uint8)))
            self.assertTrue(torch.equal(target["u16"], torch.zeros(2, dtype=torch.int16)))
            r = rep.load_into(target)  # bit copies, and bf16 -> f32 by value
            self.assertEqual(sorted(r.changed), ["f8", "u16", "w"])
            self.assertEqual(bytes(target["f8"].numpy()), f8)
            self.assertEqual(target["u16"].numpy().tobytes(), u16)
            self.assertTrue(torch.equal(target["w"], torch.tensor([1.0, 2.0])))

    def test_real_layout_changes_between_versions(self):
        # A Llama-like layout (embedding tied, then untied; a layer renamed,
        # reshaped and retyped; an F8 block and a zero-size tensor added)
        # published from dicts, each version rebuilt exactly.
        g = torch.Generator().manual_seed(5)
        v1 = {"model.embed_tokens.weight": torch.randn(1024, 64, generator=g).bfloat16(),
              "model.layers.0.self_attn.q_proj.weight": torch.randn(64, 64, generator=g).bfloat16(),
              "model.layers.0.mlp.up_proj.weight": torch.randn(128, 64, generator=g).bfloat16(),
              "model.norm.weight": torch.ones(64, dtype=torch.bfloat16)}
        v2 = dict(v1)
        v2["lm_head.weight"] = v1["model.embed_tokens.weight"]  # tied: one tensor, two names
        v3 = {k: t.clone() for k, t in v2.items()}
        v3["lm_head.weight"] = v3["lm_head.weight"] + 1  # untied
        v3["model.layers.0.self_attn.q.weight"] = v3.pop("model.layers.0.self_attn.q_proj.weight")
        v3["model.layers.0.mlp.up_proj.weight"] = v3["model.layers.0.mlp.up_proj.weight"].reshape(64, 128)
        v3["model.norm.weight"] = v3["model.norm.weight"].float()
        v3["model.layers.0.mlp.scale_f8"] = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
        v3["model.empty"] = torch.zeros(0, 64, dtype=torch.bfloat16)
        for k, sd in enumerate((v1, v2, v3, v1)):
            self.assertEqual(self.st.publish(sd), k + 1)
            got = read_safetensors(self.st.materialize(k + 1, os.path.join(self.dir, "v%d" % k)))
            self.assertEqual(sorted(got), sorted(sd))
            for n, t in sd.items():
                self.assertEqual(got[n].dtype, t.dtype, n)
                self.assertTrue(same_bits(got[n], t), n)
        self.assertEqual([v["kind"] for v in self.st.versions()], ["anchor", "delta", "delta", "delta"])

    def test_many_tensors_publish_in_linear_time(self):
        # A MoE checkpoint has tens of thousands of tensors (DeepSeek-V3:
        # 256 experts x 3 projections x 58 layers).  Publishing 60,000 from
        # a dict took 51 s on the project's 2-core machine (ckpt_save found
        # each tensor's bytes by a scan of all of them); 2.6 s after.
        import time
        sd = {"model.layers.%d.mlp.experts.%d.%s.weight" % (i // 768, (i // 3) % 256,
                                                           ("gate_proj", "up_proj", "down_proj")[i % 3]):
              torch.full((8,), float(i % 97), dtype=torch.bfloat16) for i in range(60000)}
        t0 = time.monotonic()
        self.assertEqual(self.st.publish(sd), 1)
        took = time.monotonic() - t0
        self.assertLess(took, 20.0, "60,000 tensors took %.1f s to publish" % took)
        got = read_safetensors(self.st.materialize(1, os.path.join(self.dir, "many.safetensors")))
        self.assertEqual(len(got), 60000)
        k = "model.layers.77.mlp.experts.161.down_proj.weight"
        self.assertTrue(same_bits(got[k], sd[k]))


if __name__ == "__main__":
    unittest.main()
