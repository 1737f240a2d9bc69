"""The package as users install it: `pip install .` into a fresh venv that
sees the system's torch, then, from outside the tree, import shoal and a
publish/follow round trip (bit-exact) with the library the wheel carries."""
import os
import subprocess
import sys
import unittest

from pyutil import scratch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

ROUND_TRIP = r'''
import os, sys, torch, shoal
d = sys.argv[1]
assert shoal.__file__.startswith(sys.prefix), shoal.__file__
lib = shoal._lib.lib._name
assert lib.startswith(sys.prefix), lib
st = shoal.Store(os.path.join(d, "store"))
torch.manual_seed(3)
m = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.Linear(16, 4)).to(torch.bfloat16)
rep = shoal.Replica(os.path.join(d, "rep"), store=os.path.join(d, "store"), poll_s=0.01)
live = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.Linear(16, 4)).to(torch.bfloat16)
for v in (1, 2):
    with torch.no_grad():
        m[0].weight[v] += 1
    assert st.publish(m.state_dict()) == v
    rep.wait(v, timeout=30)
    rep.load_into(live)
    for k, t in m.state_dict().items():
        assert torch.equal(t.view(torch.int16), live.state_dict()[k].view(torch.int16)), k
rep.close(); st.close()
print("round trip ok", shoal.__version__, lib)
'''


class InstallTest(unittest.TestCase):
    def test_pip_install_into_a_venv(self):
        d = scratch("install")
        venv = os.path.join(d, "venv")
        # --without-pip: the system's pip installs into the venv (no index
        # is reachable, and ensurepip would only add seconds).
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv],
                       check=True)
        py = os.path.join(venv, "bin", "python")
        env = {k: v for k, v in os.environ.items()
               if k not in ("SHOAL_LIB", "PYTHONPATH", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
        r = subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "--no-index",
                            "--no-build-isolation", "-q", ROOT], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout)
        r = subprocess.run([py, "-c", ROUND_TRIP, d], cwd="/", env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertIn("round trip ok", r.stdout)
        self.assertIn(os.path.join(venv, "lib"), r.stdout)


if __name__ == "__main__":
    unittest.main()
