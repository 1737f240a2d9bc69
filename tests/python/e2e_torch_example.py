"""examples/torch end to end: a PyTorch trainer publishes 20 bf16 versions;
two PyTorch followers receive them through the push tree (root -> one follower -> the other,
real UCX on loopback) and check each against the trainer's sha256."""
import json
import os
import subprocess
import sys
import unittest

from pyutil import scratch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class TorchExampleTest(unittest.TestCase):
    def test_trainer_and_two_followers_stay_bit_identical(self):
        work = scratch("torch-example")
        shoal_bin = os.path.abspath(os.environ.get("SHOAL_BIN", os.path.join(ROOT, "build", "shoal")))
        p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "torch", "run.py"), "--versions", "20",
                            "--followers", "2", "--workdir", work, "--shoal", shoal_bin, "--timeout", "400"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=480)
        print(p.stdout[-4000:])
        self.assertEqual(p.returncode, 0, p.stdout[-3000:])
        with open(os.path.join(work, "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(sorted(s["followers"]), ["f1", "f2"])
        for name, f in s["followers"].items():
            self.assertEqual(f["verified"], 20, name)  # every version, none skipped
            self.assertEqual(f["mismatched"], 0, name)
            self.assertEqual(f["last_version"], 20, name)
            self.assertGreater(f["bytes_received"], 0, name)
        # The root takes one child (--fanout 1): the follower that attaches
        # second is redirected below the first (root -> fA -> fB).
        self.assertEqual(sorted(f["children"] for f in s["followers"].values()), [0, 1])
        lines = [l for l in p.stdout.splitlines() if "bit-identical to the trainer's bf16 copy: yes" in l]
        self.assertEqual(len(lines), 40)


if __name__ == "__main__":
    unittest.main()
