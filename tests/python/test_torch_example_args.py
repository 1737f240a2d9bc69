"""examples/torch/run.py refuses bad arguments before it starts anything,
and never empties a folder it did not make."""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RUN = os.path.join(ROOT, "examples", "torch", "run.py")
SHOAL = os.path.abspath(os.environ.get("SHOAL_BIN", os.path.join(ROOT, "build", "shoal")))


def run(*args):
    p = subprocess.run([sys.executable, RUN, "--shoal", SHOAL] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    return p.returncode, p.stdout


class RunArgsTest(unittest.TestCase):
    def test_a_folder_of_someone_elses_is_kept(self):
        work = tempfile.mkdtemp(prefix="shoal-py-args.", dir=os.environ.get("SHOAL_TEST_TMP"))
        keep = os.path.join(work, "precious.txt")
        with open(keep, "w") as f:
            f.write("mine")
        rc, out = run("--workdir", work, "--versions", "1")
        self.assertEqual(rc, 2, out)
        self.assertIn("is not empty and not an earlier run's", out)
        with open(keep) as f:
            self.assertEqual(f.read(), "mine")

    def test_bad_numbers_and_binary(self):
        for args, want in ((["--versions", "0"], "--versions must be at least 1, got 0"),
                           (["--followers", "-1"], "--followers must be at least 1, got -1"),
                           (["--shoal", "/nonexistent/shoal"], "--shoal /nonexistent/shoal is not an executable")):
            rc, out = run(*args)
            self.assertEqual(rc, 2, out)
            self.assertIn(want, out)


if __name__ == "__main__":
    unittest.main()
