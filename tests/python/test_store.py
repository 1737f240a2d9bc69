"""shoal.Store: publishing dicts of tensors, files and sharded folders."""
import os
import unittest

import torch

import shoal
from pyutil import read_safetensors, same_bits, save_safetensors, save_sharded, scratch


def state(seed, n=64):
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(n * 4, n, generator=g).bfloat16(),
        "layers.0.mlp.weight": torch.randn(n * 2, n, generator=g).bfloat16(),
        "layers.0.norm.weight": torch.ones(n),
        "step": torch.tensor(7, dtype=torch.int64),
        "mask": torch.rand(5, generator=g) > 0.5,
    }


class StoreTest(unittest.TestCase):
    def setUp(self):
        self.dir = scratch(self.id().split(".")[-1])
        self.root = os.path.join(self.dir, "store")

    def test_publish_dict_versions_and_contents(self):
        st = shoal.Store(self.root, anchor_every=3)
        self.assertEqual(st.latest(), 0)
        self.assertEqual(st.versions(), [])
        sds = []
        for k in range(5):
            sd = state(1)
            sd["layers.0.mlp.weight"][k, :8] += 0.5  # one row changes per version
            sds.append(sd)
            self.assertEqual(st.publish(sd), k + 1)
        self.assertEqual(st.latest(), 5)
        vs = st.versions()
        self.assertEqual([v["version"] for v in vs], [1, 2, 3, 4, 5])
        self.assertEqual([v["kind"] for v in vs], ["anchor", "delta", "delta", "anchor", "delta"])
        self.assertLess(vs[1]["size"], vs[0]["size"] / 10)
        # Every version rebuilds to exactly what was published.
        for k, sd in enumerate(sds):
            out = st.materialize(k + 1, os.path.join(self.dir, "v%d.safetensors" % (k + 1)))
            got = read_safetensors(out)
            self.assertEqual(sorted(got), sorted(sd))
            for n in sd:
                self.assertTrue(same_bits(got[n], sd[n]), n)

    def test_publish_file_and_sharded_folder(self):
        st = shoal.Store(self.root)
        f = os.path.join(self.dir, "a.safetensors")
        save_safetensors(f, state(2))
        self.assertEqual(st.publish(f), 1)
        folder = os.path.join(self.dir, "sharded")
        save_sharded(folder, state(3))
        self.assertEqual(st.publish(folder), 2)
        self.assertEqual(st.versions()[1]["kind"], "delta")

    def test_bad_inputs_raise_with_shoal_messages(self):
        st = shoal.Store(self.root)
        with self.assertRaisesRegex(shoal.ShoalError, "not contiguous"):
            st.publish({"w": torch.zeros(4, 6).t()})
        with self.assertRaisesRegex(shoal.ShoalError, "dtype torch.complex128"):
            st.publish({"w": torch.zeros(3, dtype=torch.complex128)})
        with self.assertRaisesRegex(shoal.ShoalError, "no tensors"):
            st.publish({})
        with self.assertRaises(shoal.NotFound) as cm:
            st.publish(os.path.join(self.dir, "missing.safetensors"))
        self.assertIn("missing.safetensors", str(cm.exception))
        bad = os.path.join(self.dir, "bad.safetensors")
        with open(bad, "wb") as fh:
            fh.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
        with self.assertRaises(shoal.ShoalError) as cm:
            st.publish(bad)
        self.assertEqual(cm.exception.name, "EFORMAT")
        self.assertIn("bad.safetensors", cm.exception.message)
        with self.assertRaises(shoal.NotFound):
            shoal.Store(os.path.join(self.dir, "nowhere"), create=False)
        with self.assertRaisesRegex(shoal.ShoalError, "run id"):
            shoal.Store(self.root, run="../escape")
        self.assertEqual(st.latest(), 0)  # nothing above was published


if __name__ == "__main__":
    unittest.main()
