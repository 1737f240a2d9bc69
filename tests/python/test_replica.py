"""shoal.Replica over a store: waiting, zero-copy read-only views, leases
that pin a version, and load_into copying only what changed."""
import os
import time
import unittest

import torch

import shoal
from pyutil import same_bits, scratch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 32)
        self.b = torch.nn.Linear(32, 16, bias=False)
        self.register_buffer("steps", torch.zeros(3, dtype=torch.int64))


class ReplicaTest(unittest.TestCase):
    def setUp(self):
        self.dir = scratch(self.id().split(".")[-1])
        self.store = shoal.Store(os.path.join(self.dir, "store"))
        torch.manual_seed(1)
        self.src = Tiny().to(torch.bfloat16)
        self.sd = {k: v.detach().clone() for k, v in self.src.state_dict().items()}
        self.store.publish(self.sd)
        self.rep = shoal.Replica(os.path.join(self.dir, "rep"), store=os.path.join(self.dir, "store"), poll_s=0.01)

    def tearDown(self):
        self.rep.close()
        self.store.close()

    def test_views_are_zero_copy_and_read_only(self):
        self.assertEqual(self.rep.wait(1, timeout=30), 1)
        ts = self.rep.tensors()
        self.assertEqual(sorted(ts), sorted(self.sd))
        for k, t in ts.items():
            self.assertTrue(same_bits(t, self.sd[k]), k)
        # Views over one mapped image: the tensors' bytes lie inside it.
        lease = self.rep.lease()
        raw = lease._lh.p.contents
        for t in lease.tensors().values():
            self.assertTrue(raw.data <= t.data_ptr() < raw.data + raw.size)
        w = ts["a.weight"]
        for write in (lambda: w.add_(1), lambda: w.__setitem__(0, 0), lambda: w[0].zero_(),
                      lambda: torch.add(w, 1, out=w), lambda: w.view(-1).copy_(torch.zeros(64 * 32))):
            with self.assertRaises(shoal.ShoalError):
                write()
        self.assertTrue(same_bits(w, self.sd["a.weight"]))
        y = w.float() @ torch.ones(64)  # computing with them works
        self.assertEqual(tuple(y.shape), (32,))
        self.assertNotIsInstance(w * 2, type(w))

    def test_lease_pins_its_version(self):
        self.rep.wait(1, timeout=30)
        old = self.rep.tensors()
        sd2 = {k: v.clone() for k, v in self.sd.items()}
        sd2["b.weight"] += 1
        self.assertEqual(self.store.publish(sd2), 2)
        self.assertEqual(self.rep.wait(2, timeout=30), 2)
        self.assertTrue(same_bits(old["b.weight"], self.sd["b.weight"]))  # still version 1
        self.assertTrue(same_bits(self.rep.tensors()["b.weight"], sd2["b.weight"]))
        with self.assertRaises(shoal.Unavailable) as cm:
            self.rep.lease(min_version=9)
        self.assertIn("at least version 9", str(cm.exception))
        with self.assertRaises(shoal.Timeout):
            self.rep.wait(3, timeout=0.2)
        # The newest version it knows exists (the store's LATEST here).
        self.assertEqual(self.rep.info()["newest_announced"], 2)

    def test_load_into_copies_only_changed_tensors(self):
        self.rep.wait(1, timeout=30)
        live = Tiny().to(torch.bfloat16)
        r = self.rep.load_into(live)
        self.assertEqual(r.version, 1)
        self.assertEqual(sorted(r.changed), ["a.bias", "a.weight", "b.weight"])  # steps were zeros already
        self.assertEqual(r.unchanged, ["steps"])
        ptr = live.a.weight.data_ptr()
        for k, v in live.state_dict().items():
            self.assertTrue(same_bits(v, self.sd[k]), k)
        sd2 = {k: v.clone() for k, v in self.sd.items()}
        sd2["a.bias"][3] = -sd2["a.bias"][3] - 1
        self.store.publish(sd2)
        self.rep.wait(2, timeout=30)
        r = self.rep.load_into(live)
        self.assertEqual((r.version, r.changed, r.bytes_copied), (2, ["a.bias"], 32 * 2))
        self.assertEqual(live.a.weight.data_ptr(), ptr)  # in place
        # A float32 target gets converted copies; a dict target works too.
        f32 = {k: v.float() if v.is_floating_point() else v.clone() for k, v in self.sd.items()}
        r = self.rep.load_into(f32)
        self.assertEqual(r.changed, ["a.bias"])
        self.assertTrue(torch.equal(f32["a.bias"], sd2["a.bias"].float()))

    def test_load_into_refuses_mismatches(self):
        self.rep.wait(1, timeout=30)
        other = torch.nn.Linear(64, 32).to(torch.bfloat16)
        with self.assertRaises(shoal.NotFound) as cm:
            self.rep.load_into(other)
        self.assertIn("not in the version: weight, bias", str(cm.exception))
        wrong = {k: v.clone() for k, v in self.sd.items()}
        wrong["b.weight"] = torch.zeros(16, 33, dtype=torch.bfloat16)
        with self.assertRaisesRegex(shoal.ShoalError, r"tensor b.weight: shape \(16, 32\)"):
            self.rep.load_into(wrong)
        part = {"a.bias": torch.zeros(32, dtype=torch.bfloat16)}
        self.assertEqual(self.rep.load_into(part, strict=False).changed, ["a.bias"])

    def test_bad_config(self):
        with self.assertRaisesRegex(shoal.ShoalError, "give \"store\""):
            shoal.Replica(os.path.join(self.dir, "r2"))
        with self.assertRaisesRegex(shoal.ShoalError, "host:port"):
            shoal.Replica(os.path.join(self.dir, "r3"), parents=["nocolon"])

    def test_second_replica_on_a_directory_is_refused(self):
        self.rep.wait(1, timeout=30)
        t0 = time.time()
        with self.assertRaises(shoal.ShoalError) as cm:
            shoal.Replica(self.rep.dir, store=os.path.join(self.dir, "store"))
        self.assertLess(time.time() - t0, 5)
        self.assertEqual(cm.exception.name, "EEXIST")
        self.assertIn(self.rep.dir, str(cm.exception))
        self.assertIn("process %d" % os.getpid(), str(cm.exception))
        self.assertEqual(self.rep.version, 1)  # the first one is untouched

    def test_unreachable_parent_is_named(self):
        rep = shoal.Replica(os.path.join(self.dir, "r4"), parents=["127.0.0.1:1"])
        try:
            deadline = time.time() + 10
            while not rep.info()["parent_error"] and time.time() < deadline:
                time.sleep(0.05)
            self.assertTrue(rep.info()["parent_error"].startswith("127.0.0.1:1: "), rep.info())
        finally:
            rep.close()


if __name__ == "__main__":
    unittest.main()
