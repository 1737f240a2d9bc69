"""Store.publish_async: a snapshot taken at the call (the caller changes its
tensors in place right after), versions in call order, errors raised by
the next call, by flush() and by the Future."""
import os
import unittest

import torch

import shoal
from pyutil import read_safetensors, same_bits, scratch


class AsyncTest(unittest.TestCase):
    def setUp(self):
        self.dir = scratch(self.id().split(".")[-1])
        self.root = os.path.join(self.dir, "store")

    def test_snapshots_in_order_under_in_place_updates(self):
        torch.manual_seed(2)
        m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
        m[1].weight = torch.nn.Parameter(m[0].weight[:8].clone())  # an ordinary, untied tensor
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        sd = m.state_dict()
        sd["tied"] = sd["0.weight"]  # one tensor under two names
        sd["half"] = torch.zeros(3, 5).t()  # not contiguous: the snapshot makes it so
        st = shoal.Store(self.root, anchor_every=3, async_depth=2)
        want, futs = [], []
        for k in range(6):
            futs.append(st.publish_async(sd))
            want.append({n: t.detach().clone().contiguous() for n, t in sd.items()})
            # In place, right after the call: the snapshot must not see it.
            m(torch.randn(4, 64)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            sd["half"].add_(1)
        self.assertEqual(st.flush(), 6)
        self.assertEqual([f.result() for f in futs], [1, 2, 3, 4, 5, 6])
        for k, w in enumerate(want):
            got = read_safetensors(st.materialize(k + 1, os.path.join(self.dir, "v%d" % k)))
            self.assertEqual(sorted(got), sorted(w))
            for n in w:
                self.assertTrue(same_bits(got[n], w[n]), "v%d %s" % (k + 1, n))
        # A plain publish after async ones comes after them.
        self.assertEqual(st.publish(want[0]), 7)
        st.close()

    def test_errors_surface_on_the_next_call(self):
        st = shoal.Store(self.root)
        sd = {"w": torch.arange(16, dtype=torch.float32)}
        self.assertEqual(st.publish_async(sd).result(), 1)
        # Break the run under the publisher: the next background publish fails.
        versions = os.path.join(self.root, "main", "versions")
        os.rename(versions, versions + ".aside")
        with open(versions, "w") as f:
            f.write("not a folder")
        fut = st.publish_async({"w": sd["w"] + 1})
        self.assertIsInstance(fut.exception(timeout=60), shoal.ShoalError)
        with self.assertRaisesRegex(shoal.ShoalError, "background publish: .*versions") as cm:
            st.publish_async(sd)
        self.assertIs(cm.exception, fut.exception())
        # Raised once: the run repaired, publishing goes on.
        os.unlink(versions)
        os.rename(versions + ".aside", versions)
        st.publish_async(sd)
        self.assertEqual(st.flush(), 2)
        # Bad input is refused at the call, before any snapshot.
        with self.assertRaisesRegex(shoal.ShoalError, "tensor x: dtype torch.complex128"):
            st.publish_async({"x": torch.zeros(2, dtype=torch.complex128)})
        with self.assertRaises(TypeError):
            st.publish_async("/some/file.safetensors")
        # close() waits for queued publishes and raises their error.
        os.rename(versions, versions + ".aside")
        with open(versions, "w") as f:
            f.write("x")
        st.publish_async(sd)
        with self.assertRaisesRegex(shoal.ShoalError, "background publish"):
            st.close()


if __name__ == "__main__":
    unittest.main()
