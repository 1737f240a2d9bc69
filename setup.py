"""Build hooks for pyproject.toml: the wheel carries libshoal.so.0 beside
the package (python/shoal/_lib.py looks there first), built by `make` when
the tree has none.  An editable install carries nothing: the package runs
from python/shoal and finds the tree's build/libshoal.so.0."""
import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join(ROOT, "build", "libshoal.so.0")


class BuildPyWithLib(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        if not os.path.exists(LIB):
            env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
            subprocess.check_call(["make", "-C", ROOT, "build/libshoal.so.0"], env=env)
        dst = os.path.join(self.build_lib, "shoal", "libshoal.so.0")
        shutil.copyfile(os.path.realpath(LIB), dst)
        os.chmod(dst, 0o755)


class BinaryDistribution(Distribution):
    """The wheel holds a native library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLib}, distclass=BinaryDistribution,
      options={"build": {"build_base": os.path.join("build", "py")}})
