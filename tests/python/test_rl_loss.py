"""shoal.rl's torch losses against the C implementation (rl_loss in
src/rl/engine/loss.c, called through libshoal with ctypes) on the shared
fixtures in rl_loss_fixtures.json: every case x kind x configuration must
give the same loss and the same dLoss/dlogp per token to 1e-6, and the same
counts of clipped and masked tokens."""
import ctypes as c
import json
import os
import unittest

import torch

import shoal.rl
from shoal._lib import lib

HERE = os.path.dirname(os.path.abspath(__file__))


class LossCfg(c.Structure):
    """rl_loss_cfg (include/shoal/rl.h)."""
    _fields_ = [("kind", c.c_int), ("clip", c.c_float), ("tis_cap", c.c_float), ("mis_lo", c.c_float),
                ("mis_hi", c.c_float), ("mis_seq", c.c_int), ("dec_cap", c.c_float)]


class TokIn(c.Structure):
    _fields_ = [("logp", c.c_float), ("lold", c.c_float), ("lmu", c.c_float), ("adv", c.c_float), ("seq", c.c_int)]


class Stats(c.Structure):
    _fields_ = [("tokens", c.c_int), ("clipped", c.c_int), ("masked", c.c_int)]


lib.rl_loss.restype = c.c_double
lib.rl_loss.argtypes = [c.POINTER(LossCfg), c.POINTER(TokIn), c.c_int, c.c_int, c.POINTER(c.c_float), c.POINTER(Stats)]
lib.rl_loss_defaults.restype = LossCfg
lib.rl_loss_defaults.argtypes = [c.c_int]


def fixtures():
    with open(os.path.join(HERE, "rl_loss_fixtures.json")) as f:
        return json.load(f)


def c_loss(kind, cfg, toks):
    k = shoal.rl.KINDS.index(kind)  # the order of enum RL_LOSS_* in rl.h
    lc = lib.rl_loss_defaults(k)
    for key, v in cfg.items():
        setattr(lc, key, v)
    n = len(toks)
    arr = (TokIn * max(n, 1))(*[TokIn(*t) for t in toks])
    coef = (c.c_float * max(n, 1))()
    st = Stats()
    nseq = max([t[4] for t in toks], default=0) + 1
    loss = lib.rl_loss(c.byref(lc), arr, n, nseq, coef, c.byref(st))
    return loss, [coef[i] for i in range(n)], st, lc


def torch_loss(kind, lc, toks):
    t = torch.tensor([r[:4] for r in toks], dtype=torch.float32).reshape(-1, 4)
    seq = torch.tensor([r[4] for r in toks], dtype=torch.long)
    logp = t[:, 0].clone().double().requires_grad_(True)
    loss, st = shoal.rl.policy_loss(logp, t[:, 1], t[:, 2], t[:, 3], kind=kind, seq=seq, clip=lc.clip,
                                    tis_cap=lc.tis_cap, mis_lo=lc.mis_lo, mis_hi=lc.mis_hi,
                                    mis_seq=bool(lc.mis_seq), dec_cap=lc.dec_cap)
    loss.backward()
    grad = logp.grad if logp.grad is not None else torch.zeros_like(logp)
    return float(loss), grad.tolist(), st


class TestLossesMatchC(unittest.TestCase):
    def test_fixtures(self):
        fx = fixtures()
        checked = 0
        for case in fx["cases"]:
            for kind in shoal.rl.KINDS:
                for cfg in fx["configs"]:
                    where = "%s, %s, %s" % (case["name"], kind, cfg)
                    cl, ccoef, cst, lc = c_loss(kind, cfg, case["tokens"])
                    tl, tgrad, tst = torch_loss(kind, lc, case["tokens"])
                    self.assertAlmostEqual(cl, tl, delta=1e-6, msg=where)
                    for i, (a, b) in enumerate(zip(ccoef, tgrad)):
                        self.assertAlmostEqual(a, b, delta=1e-6, msg="%s: token %d" % (where, i))
                    self.assertEqual((cst.tokens, cst.clipped, cst.masked),
                                     (tst["tokens"], tst["clipped"], tst["masked"]), msg=where)
                    checked += 1
        self.assertEqual(checked, len(fx["cases"]) * len(shoal.rl.KINDS) * len(fx["configs"]))

    def test_corrections_act(self):
        """The fixtures exercise what the corrections do: a token clipped,
        a token masked, TIS's cap (so that a loss that ignored them could
        not pass the comparison by accident)."""
        hand = fixtures()["cases"][0]["tokens"]
        _, _, st, _ = c_loss("mis", {}, hand)
        self.assertEqual(st.masked, 2)
        _, _, st, _ = c_loss("decoupled", {}, hand)
        self.assertGreaterEqual(st.clipped, 2)
        tis, _, _, _ = c_loss("tis", {}, hand)
        dec, _, _, _ = c_loss("decoupled", {}, hand)
        self.assertNotAlmostEqual(tis, dec, delta=1e-6)

    def test_bad_input(self):
        x = torch.zeros(3)
        with self.assertRaisesRegex(ValueError, "kind \"ppo2\": expected one of"):
            shoal.rl.policy_loss(x, x, x, x, kind="ppo2")
        with self.assertRaisesRegex(ValueError, "adv has shape"):
            shoal.rl.policy_loss(x, x, x, torch.zeros(2))
        with self.assertRaisesRegex(ValueError, "needs seq"):
            shoal.rl.policy_loss(x, x, x, x, kind="mis", mis_seq=True)

    def test_grpo_advantages(self):
        r = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.5, 0.5])
        g = torch.tensor([0, 0, 0, 1, 1, 1])
        a = shoal.rl.grpo_advantages(r, g)
        self.assertAlmostEqual(float(a[0]), (1 - 2 / 3) / ((2 / 9) ** 0.5 + 1e-6), places=5)
        self.assertEqual(a[3:].tolist(), [0.0, 0.0, 0.0])


if __name__ == "__main__":
    unittest.main()
