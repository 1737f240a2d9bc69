"""shoal.rl's Trainer and Worker on shoal's RL protocol, real processes on
loopback: a C trainer (`shoal rl trainer`) trains with Python workers and
drops one that lies about a reward; a Python trainer drops workers that
break the rules (a reward the task does not give, a version older than
asked, dying mid-queue) and gets every group from the honest one; a
request for an exact version a worker is past is refused, one for a
version it cannot get in time is refused and asked for again."""
import json
import os
import subprocess
import sys
import time
import unittest

import torch

import shoal
import shoal.rl
from pyutil import scratch

HERE = os.path.dirname(os.path.abspath(__file__))
SECRET = "6a0e3c1f9b7d5a2e4c8f0b1d3e5a7c9f"
SHOAL = os.environ.get("SHOAL_BIN", "build/shoal")


def env(secret=SECRET):
    e = dict(os.environ, SHOAL_RUN_SECRET=secret)
    e["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "..", "..", "python"), HERE])
    return e


def worker(d, name, *args, secret=SECRET):
    res = os.path.join(d, name + ".json")
    log = open(os.path.join(d, name + ".log"), "w")
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "rl_worker_proc.py"), "--name", name, "--result", res]
                         + list(args), env=env(secret), stdout=log, stderr=subprocess.STDOUT)
    p.result, p.log = res, log
    return p


def result(p, timeout=60):
    p.wait(timeout)
    p.log.close()
    if not os.path.exists(p.result):
        return {}
    with open(p.result) as f:
        return json.load(f)


class TestRlProto(unittest.TestCase):
    def test_c_trainer_with_python_workers(self):
        d = scratch("rl_proto_c")
        store, res = os.path.join(d, "store"), os.path.join(d, "result.json")
        with open(os.path.join(d, "trainer.log"), "w") as tlog:
            tr = subprocess.Popen([SHOAL, "rl", "trainer", "--store", store, "--result", res, "--steps", "3", "--warm", "10",
                                   "--eval-n", "8", "--prompts", "4", "--group", "4"], env=env(), stdout=tlog,
                                  stderr=subprocess.STDOUT)
        tj = os.path.join(store, "trainer.json")
        # Another tenant's worker, with its own secret: never served.  It
        # knocks and is refused before any worker of the run starts, so the
        # trainer is still waiting for workers when it comes.
        thief = worker(d, "thief", "--trainer-json", tj, "--max-new", "8", secret="0123456789abcdef0123456789abcdef")
        thief_res = result(thief, timeout=90)
        # The liar next, alone, so that it is asked for work (and dropped
        # for its rewards) before an honest worker can finish the run.
        liar = worker(d, "liar", "--trainer-json", tj, "--max-new", "8", "--cheat", "reward")
        result(liar, timeout=90)
        ok = worker(d, "honest", "--trainer-json", tj, "--max-new", "8")
        try:
            self.assertEqual(tr.wait(120), 0, "see " + os.path.join(d, "trainer.log"))
        finally:
            tr.kill()
        with open(res) as f:
            r = json.load(f)
        w_ok = result(ok)
        self.assertEqual(r["steps"], 3)
        self.assertEqual(r["workers_dropped_for_violations"], 1)
        self.assertGreaterEqual(r["workers_refused"], 1)
        by = {w["name"]: w for w in r["workers"]}
        self.assertIn("reward", by["liar"]["dropped_for"])
        # The honest worker applied every delta: it ends on the trainer's
        # last version with the same image, bit for bit.
        self.assertEqual(by["honest"]["final"], {"version": r["final_version"], "image_xxh3": r["final_image_xxh3"]})
        self.assertEqual(w_ok["final"], r["final_version"])
        self.assertGreater(by["honest"]["trajectories"], 0)
        self.assertIn("secret", thief_res.get("error", ""))

    def _publisher(self, d, n):
        st = shoal.Store(os.path.join(d, "store"))
        for i in range(n):
            st.publish({"w": torch.full((8,), float(i))})
        return st

    def test_python_trainer_drops_cheats(self):
        d = scratch("rl_proto_py")
        st = self._publisher(d, 3)  # policy versions 0..2 (store 1..3)
        tr = shoal.rl.Trainer(task="code", seed=5, group=4, max_new=8, max_len=24, max_lag=1, secret=SECRET)
        tr.set_version(2)
        store = os.path.join(d, "store")
        ws = [worker(d, n, "--addr", tr.addr, "--store", store, "--rep-dir", os.path.join(d, "rep-" + n), *c)
              for n, c in (("honest", []), ("liar", ["--cheat", "reward"]), ("stale", ["--cheat", "version"]),
                           ("dies", ["--cheat", "die"]))]
        deadline = time.monotonic() + 60
        while tr.workers < 4 and time.monotonic() < deadline:
            tr.poll(0.2)
        self.assertEqual(tr.workers, 4)
        for _ in range(16):
            tr.ask(1)  # at least version 2 - max_lag = 1
        b = tr.collect(16 * 4, timeout=90)
        s = tr.stop(drain=20)
        res = {p.result: result(p) for p in ws}
        tr.close()
        st.close()
        # Every group exactly once (lost ones were asked for again), all of
        # them checked: rewards recomputed, versions within the bounds.
        self.assertEqual(sorted(b["group"].tolist()), sorted(list(range(16)) * 4))
        task = shoal.rl.Task("code")
        for k in range(64):
            L, P = int(b["length"][k]), int(b["prompt_len"][k])
            resp = b["tokens"][k, P:L].tolist()
            self.assertEqual(float(b["reward"][k]), task.reward(int(b["problem"][k]), resp))
            self.assertTrue(1 <= int(b["version_start"][k]) <= int(b["version_end"][k]) <= 2)
            self.assertTrue(torch.all(b["behav_logp"][k, P:L] <= 0))
        self.assertEqual(s["workers_dropped_for_violations"], 2, s)
        why = {w["name"]: w.get("dropped_for", "") for w in s["workers"]}
        self.assertIn("reward", why["liar"])
        self.assertIn("min_version", why["stale"])
        self.assertEqual(why["honest"], "")
        self.assertGreaterEqual(s["worker_deaths"], 3)  # the two dropped, and the one that died
        self.assertEqual(sum(s["staleness_hist"]), 64)
        honest = [w for w in s["workers"] if w["name"] == "honest"][0]
        self.assertEqual(honest["final"]["version"], 2)
        self.assertEqual(res[ws[0].result]["final"], 2)

    def test_exact_and_unreachable_versions_are_refused(self):
        d = scratch("rl_proto_exact")
        st = self._publisher(d, 2)  # policy versions 0 and 1
        tr = shoal.rl.Trainer(task="code", seed=9, group=2, max_new=8, max_lag=8, secret=SECRET)
        tr.set_version(1)
        w = worker(d, "w", "--addr", tr.addr, "--store", os.path.join(d, "store"), "--rep-dir", os.path.join(d, "rep"))
        g0 = tr.ask(1, min_version=1)
        first = tr.collect(2, timeout=60)
        self.assertEqual(first["version_start"].tolist(), [1, 1])
        # Exactly version 0: the worker holds 1 and weights never go back.
        g1 = tr.ask(1, min_version=0, exact=True)
        g2 = tr.ask(1, min_version=1, exact=True)
        second = tr.collect(2, timeout=60)
        self.assertEqual(second["group"].tolist(), [g2, g2])
        self.assertEqual((second["version_start"].tolist(), second["version_end"].tolist()), ([1, 1], [1, 1]))
        s = tr.stats()
        self.assertEqual(s["refused_requests"], 1)
        self.assertEqual(s["refused_exact"], [{"group0": g1, "nprompts": 1, "version": 0, "held": 1}])
        # At least version 3, which nobody has yet: refused after the
        # worker's 1 s wait and asked for again until it exists.
        tr.set_version(3)
        g3 = tr.ask(1, min_version=3)
        deadline = time.monotonic() + 30
        while tr.stats()["refused_requests"] < 2 and time.monotonic() < deadline:
            self.assertIsNone(tr.poll(0.2))
        self.assertGreaterEqual(tr.stats()["refused_requests"], 2)
        st.publish({"w": torch.full((8,), 2.0)})
        st.publish({"w": torch.full((8,), 3.0)})
        third = tr.collect(2, timeout=60)
        self.assertEqual(third["group"].tolist(), [g3, g3])
        self.assertEqual(third["version_start"].tolist(), [3, 3])
        s = tr.stop(drain=20)
        self.assertEqual(s["workers"][0]["final"]["version"], 3)
        self.assertEqual(result(w)["refused"], s["refused_requests"])
        self.assertEqual(g0, 0)
        tr.close()
        st.close()

    def test_bounded_staleness(self):
        d = scratch("rl_proto_stale")
        st = self._publisher(d, 1)  # policy version 0
        tr = shoal.rl.Trainer(task="code", seed=2, group=2, max_new=8, max_lag=0, secret=SECRET)
        tr.set_version(0)
        w = worker(d, "w", "--addr", tr.addr, "--store", os.path.join(d, "store"), "--rep-dir", os.path.join(d, "rep"))
        deadline = time.monotonic() + 60
        while tr.workers < 1 and time.monotonic() < deadline:
            self.assertIsNone(tr.poll(0.1))  # nothing asked yet: nothing comes back
        g = tr.ask(1)
        self.assertIsNone(tr.poll(0))  # sends the request
        time.sleep(3)  # the worker answers with version 0 meanwhile (buffered)
        st.publish({"w": torch.full((8,), 1.0)})
        tr.set_version(1)
        b = tr.collect(2, timeout=60)  # version 0's answer is one version too old: asked again
        self.assertEqual(b["group"].tolist(), [g, g])
        self.assertEqual(b["version_start"].tolist(), [1, 1])
        s = tr.stop(drain=20)
        self.assertEqual(s["dropped_stale"], 2, s)
        self.assertEqual(s["staleness_hist"], [2])
        self.assertEqual(result(w)["served"], 2)
        tr.close()
        st.close()


if __name__ == "__main__":
    unittest.main()
