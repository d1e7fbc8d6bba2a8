"""Builds the kvreshard package with libkvreshard.so inside it.

The build step runs, from the repository root (the parent of this
directory, or $KVRESHARD_ROOT), ``go build -buildmode=c-shared -o <build>/kvreshard/libkvreshard.so
./cmd/libkvreshard``: Go and the module's dependencies must be present (they
are after any ``go build`` or ``make test`` in the repository), nothing is
downloaded. Install offline with::

    pip install --no-build-isolation ./python

The metadata is in pyproject.toml.
"""

import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
# The repository root: the parent of this directory, or $KVRESHARD_ROOT
# when building a copy of it elsewhere.
ROOT = os.environ.get("KVRESHARD_ROOT") or os.path.dirname(HERE)


class build_py_with_go(build_py):
    """build_py, then the C library into the built package."""

    def run(self):
        super().run()
        if not os.path.isfile(os.path.join(ROOT, "go.mod")) or \
                not os.path.isdir(os.path.join(ROOT, "cmd", "libkvreshard")):
            raise SystemExit("kvreshard: %s is not the kvreshard repository (no go.mod and "
                             "cmd/libkvreshard): build from python/ inside a clone" % ROOT)
        go = os.environ.get("GO") or shutil.which("go")
        if not go:
            raise SystemExit("kvreshard: the build needs the go command (Go 1.26) on PATH or in $GO")
        out = os.path.join(os.path.abspath(self.build_lib), "kvreshard", "libkvreshard.so")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = [go, "build", "-buildmode=c-shared", "-o", out, "./cmd/libkvreshard"]
        self.announce("running %s in %s" % (" ".join(cmd), ROOT), level=2)
        subprocess.check_call(cmd, cwd=ROOT)
        # the header Go writes beside the library is not the API (cmd/libkvreshard/kvreshard.h is)
        h = out[:-3] + ".h"
        if os.path.exists(h):
            os.remove(h)


class BinaryDistribution(Distribution):
    """The package holds a native library: wheels are platform wheels."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": build_py_with_go}, distclass=BinaryDistribution)
