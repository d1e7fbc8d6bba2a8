"""Builds libkvreshard once per session (go build -buildmode=c-shared into a
temporary directory) and points KVRESHARD_LIB at it, unless KVRESHARD_LIB
is already set. Subprocesses of the tests inherit it."""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)


@pytest.fixture(scope="session", autouse=True)
def libkvreshard():
    """The path of the library the tests use."""
    if os.environ.get("KVRESHARD_LIB"):
        yield os.environ["KVRESHARD_LIB"]
        return
    d = tempfile.mkdtemp(prefix="kvreshard-pytest-")
    out = os.path.join(d, "libkvreshard.so")
    p = subprocess.run(["go", "build", "-buildmode=c-shared", "-o", out, "./cmd/libkvreshard"],
                       cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        shutil.rmtree(d, ignore_errors=True)
        pytest.fail("go build -buildmode=c-shared ./cmd/libkvreshard: exit %d\n%s%s"
                    % (p.returncode, p.stdout, p.stderr), pytrace=False)
    os.environ["KVRESHARD_LIB"] = out
    yield out
    del os.environ["KVRESHARD_LIB"]
    shutil.rmtree(d, ignore_errors=True)
