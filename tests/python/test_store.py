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

    def test_second_publisher_is_refused(self):
        first = shoal.Store(self.root)
        self.assertEqual(first.publish(state(1)), 1)
        second = shoal.Store(self.root)
        self.assertEqual(second.latest(), 1)  # reading is not publishing
        with self.assertRaises(shoal.ShoalError) as cm:
            second.publish(state(2))
        self.assertEqual(cm.exception.name, "EEXIST")
        self.assertIn("already has a publisher (process %d, this one)" % os.getpid(), str(cm.exception))
        self.assertIn("rank 0", str(cm.exception))
        # A writer id does not get past an exclusive publisher either.
        with self.assertRaisesRegex(shoal.ShoalError, "already has a publisher"):
            shoal.Store(self.root, writer_id="w1").publish(state(2))
        self.assertEqual(second.latest(), 1)
        first.close()
        self.assertEqual(second.publish(state(2)), 2)
        second.close()
        # Publishers that give writer ids share the run, and exclude the
        # others.
        a, b = shoal.Store(self.root, writer_id="a"), shoal.Store(self.root, writer_id="b")
        self.assertEqual(a.publish(state(3)), 3)
        self.assertEqual(b.publish(state(4)), 4)
        with self.assertRaisesRegex(shoal.ShoalError, 'writer id "[ab]"'):
            shoal.Store(self.root).publish(state(5))
        with self.assertRaisesRegex(shoal.ShoalError, "writer id"):
            shoal.Store(self.root, writer_id="").publish(state(5))
        a.close(), b.close()

    def test_library_warnings_go_to_logging(self):
        st = shoal.Store(self.root)
        st.publish(state(1))
        rep_dir = os.path.join(self.dir, "rep")
        os.makedirs(rep_dir)
        with open(os.path.join(rep_dir, "ACTIVE"), "w") as f:
            f.write("garbage")
        with self.assertLogs("shoal", level="WARNING") as logs:
            rep = shoal.Replica(rep_dir, store=self.root, poll_s=0.01)
            rep.wait(1, timeout=30)
            rep.close()
        self.assertTrue(any("replica %s: starting empty" % rep_dir in m for m in logs.output), logs.output)
        st.close()

    def test_version(self):
        with open(os.path.join(os.path.dirname(__file__), "..", "..", "include", "shoal", "common.h")) as f:
            want = [l.split('"')[1] for l in f if l.startswith("#define SHOAL_VERSION")][0]
        self.assertEqual(shoal.__version__, want)
        self.assertEqual(shoal._lib.lib.sh_version().decode(), want)


if __name__ == "__main__":
    unittest.main()
