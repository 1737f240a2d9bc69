"""examples/torch-rl end to end (make run-torch, shortened): a local fleet
(`shoal up`), the trainer as a 2-rank gloo gang and two rollout workers as
an elastic job, one run, code shipped with --workdir.  The held-out reward
rises, every worker ends on the trainer's last version (taken by the push
tree), no trajectory broke a rule, and the job files hold no address, port
or secret: the jobs found each other through the run's services."""
import json
import os
import re
import subprocess
import sys
import unittest

from pyutil import scratch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class TorchRlExampleTest(unittest.TestCase):
    def test_grpo_on_a_local_fleet(self):
        work = scratch("torch-rl")
        shoal_bin = os.path.abspath(os.environ.get("SHOAL_BIN", os.path.join(ROOT, "build", "shoal")))
        # Seed 1, 60 steps: held-out reward +0.12 (seeds 1-4: +0.12, +0.04,
        # +0.08, +0.02; docs/python-rl.md).
        p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "torch-rl", "run.py"), "--steps", "60",
                            "--seed", "1", "--eval-every", "30", "--workdir", work, "--shoal", shoal_bin,
                            "--timeout", "300"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400)
        print(p.stdout[-3000:])
        self.assertEqual(p.returncode, 0, p.stdout[-3000:])
        with open(os.path.join(work, "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(s["steps"], 60)
        self.assertGreater(s["reward_end"], s["reward_start"] + 0.02, s["curve"])
        self.assertEqual(s["workers_final_versions"], [60, 60])
        self.assertEqual(s["violations"], 0)
        self.assertEqual(sum(s["staleness_hist"]), 60 * 16 * 8)
        self.assertLessEqual(len(s["staleness_hist"]), 3)  # max_lag 2
        self.assertEqual(len([l for l in p.stdout.splitlines() if l.startswith("trainer: step")]), 60)
        for path in s["job_files"]:
            with open(path) as f:
                text = f.read()
            self.assertNotIn("SECRET", text)
            self.assertIsNone(re.search(r"\d+\.\d+\.\d+\.\d+|:\d{2,5}\b|[0-9a-f]{32}", text), text)


if __name__ == "__main__":
    unittest.main()
