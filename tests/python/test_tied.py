"""Tied weights (a GPT whose head is its token embedding): stored and sent
once, recorded as an alias in the version's safetensors metadata, and
restored as one tensor by tensors() and load_into()."""
import ctypes
import json
import os
import struct
import unittest

import torch

import shoal
from shoal import _lib, _torch
from pyutil import same_bits, scratch


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab=512, d=64, layers=2):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(32, d)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        self.register_buffer("steps", torch.zeros(1, dtype=torch.int64))


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


class TiedTest(unittest.TestCase):
    def setUp(self):
        self.dir = scratch(self.id().split(".")[-1])
        self.root = os.path.join(self.dir, "store")
        torch.manual_seed(5)
        self.m = TinyGPT()
        self.opt = torch.optim.AdamW(self.m.parameters(), lr=1e-3)

    def step(self):
        x = torch.randint(0, 512, (4, 16))
        h = self.m.tok(x) + self.m.pos(torch.arange(16))
        for b in self.m.blocks:
            h = b(h)
        loss = torch.nn.functional.cross_entropy(self.m.head(self.m.norm(h)).flatten(0, 1), x.flatten())
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.m.steps += 1

    def test_tied_gpt_stored_once_restored_tied(self):
        st = shoal.Store(self.root)
        sd = self.m.state_dict()
        self.assertEqual(sd["head.weight"].data_ptr(), sd["tok.weight"].data_ptr())
        emb = sd["tok.weight"].numel() * 4
        untied = {k: v.clone() for k, v in sd.items()}  # the same values, each its own memory
        self.assertEqual(st.publish(sd), 1)
        self.step()
        self.assertEqual(st.publish(self.m.state_dict()), 2)
        # Stored once: the anchor holds one embedding, not two, and the
        # alias is in its metadata.
        v1 = st.materialize(1, os.path.join(self.dir, "v1.safetensors"))
        h = header(v1)
        self.assertNotIn("head.weight", h)
        self.assertIn("tok.weight", h)
        self.assertEqual(json.loads(h["__metadata__"]["shoal.aliases"]), {"head.weight": "tok.weight"})
        other = shoal.Store(self.root, run="untied")
        other.publish(untied)
        sizes = {r: s.versions()[0]["model_size"] for r, s in (("tied", st), ("untied", other))}
        self.assertLess(sizes["tied"], sizes["untied"] - emb + 4096, sizes)
        # The delta carries the embedding's change once (its size is below
        # the changed embedding's bytes plus the other tensors').
        self.assertEqual(st.versions()[1]["kind"], "delta")
        # A replica restores the tie: one tensor under both names.
        rep = shoal.Replica(os.path.join(self.dir, "rep"), store=self.root, poll_s=0.01)
        self.assertEqual(rep.wait(2, timeout=30), 2)
        ts = rep.tensors()
        self.assertIs(ts["head.weight"], ts["tok.weight"])
        self.assertEqual(sorted(ts), sorted(self.m.state_dict()))
        for k, v in self.m.state_dict().items():
            self.assertTrue(same_bits(ts[k], v), k)
        # load_into a tied model: bit-exact, and still tied afterwards.
        torch.manual_seed(9)
        live = TinyGPT()
        r = rep.load_into(live)
        self.assertEqual(r.version, 2)
        self.assertIs(live.head.weight, live.tok.weight)
        for k, v in self.m.state_dict().items():
            self.assertTrue(same_bits(live.state_dict()[k], v), k)
        self.assertIn("tok.weight", r.changed)
        # An untied target gets both copies.
        flat = {k: torch.zeros_like(v) for k, v in self.m.state_dict().items()}
        rep.load_into(flat)
        self.assertTrue(same_bits(flat["head.weight"], self.m.tok.weight.detach()))
        rep.close()
        st.close(), other.close()

    def test_forged_alias_is_refused(self):
        # A version whose metadata names an alias of a tensor that is not
        # stored (or that is itself stored) is refused by name.
        for k, bad in enumerate(({"x": "nope"}, {"w": "w"}, ["w"])):
            run = "bad%d" % k
            s2 = shoal.Store(self.root, run=run)
            arr = (_lib.CkptTensor * 1)()
            w = torch.ones(4)
            arr[0] = _torch.spec_of("w", w, _lib.DTYPE_CODES, _lib.CkptTensor)
            out = ctypes.c_uint64()
            meta = json.dumps({"shoal.aliases": json.dumps(bad)}).encode()
            _lib.check(_lib.lib.store_publish_tensors_meta(s2._h, arr, 1, meta, 0, ctypes.byref(out)))
            rep = shoal.Replica(os.path.join(self.dir, "rep-" + run), store=self.root, run=run, poll_s=0.01)
            rep.wait(1, timeout=30)
            with self.assertRaisesRegex(shoal.ShoalError, "version 1: metadata shoal.aliases"):
                rep.tensors()
            rep.close()
            s2.close()


if __name__ == "__main__":
    unittest.main()
