"""SGLang's own HiCache storage files for the tests, without torch.

The tests that drive kvreshard.sglang as SGLang does import SGLang 0.5.23's
sglang/srt/mem_cache/hicache_storage.py (HiCacheStorage,
HiCacheStorageConfig, PoolName, PoolTransfer, PoolTransferResult) and
sglang/srt/mem_cache/storage/backend_factory.py (StorageBackendFactory).
make venv installs sglang into .venv without its dependencies
(python/requirements-nodeps.txt). Those two files need only the standard
library, sglang.srt.environ and a module named torch; but importing any
sglang module first runs sglang/__init__.py, which pulls in most of SGLang
and its dependencies. So the processes that import them put sglang_stub/
first on sys.path (PYTHONPATH): its sglang/__init__.py replaces SGLang's
with a namespace over the installed package, and its torch is an empty
module. The pytest process itself never imports them, so that the other
tests keep exercising kvreshard.sglang's stand-ins; these tests run their
own processes (subprocess_env).
"""

import importlib.metadata
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.path.dirname(HERE)
STUB = os.path.join(HERE, "sglang_stub")
VERSION = "0.5.23"
FILES = ("srt/mem_cache/hicache_storage.py", "srt/mem_cache/storage/backend_factory.py")


def installed_sglang():
    """(the installed sglang package's directory, "") or (None, why not),
    without importing it."""
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None, "sglang is not installed for %s" % sys.executable
    if version != VERSION:
        return None, "sglang %s is installed for %s, not %s" % (version, sys.executable, VERSION)
    stub = os.path.realpath(os.path.join(STUB, "sglang"))
    for entry in sys.path:  # where import finds it, without running its __init__
        d = os.path.join(entry or os.curdir, "sglang")
        if os.path.realpath(d) != stub and all(os.path.isfile(os.path.join(d, f)) for f in FILES):
            return d, ""
    return None, "sglang %s is installed for %s but its %s are not on sys.path" % (
        version, sys.executable, " and ".join(FILES))


def require_sglang():
    """The installed sglang's directory; skips the test (fails it with
    KVRESHARD_REQUIRE_PYTHON=1) when SGLang's files are not there."""
    import pytest
    d, why = installed_sglang()
    if d is None:
        msg = "%s: the tests through SGLang's own files need `make venv` (sglang==%s, no dependencies)" % (
            why, VERSION)
        if os.environ.get("KVRESHARD_REQUIRE_PYTHON") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return d


def subprocess_env(**kw):
    """The environment of a process that imports SGLang's files: sglang_stub
    first on PYTHONPATH, then the package and the tests' modules."""
    env = dict(os.environ)
    path = [STUB, PYTHON, HERE] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(path)
    env.update(kw)
    return env


def load():
    """In a process started with subprocess_env: SGLang's hicache_storage
    and backend_factory modules, checked to be the installed files (not
    stubs) over the empty torch."""
    import sglang
    if list(sglang.__path__)[:1] != [os.path.join(STUB, "sglang")]:
        raise RuntimeError("sglang is not sglang_stub's namespace: %r (start the process with subprocess_env)"
                           % (list(sglang.__path__),))
    from sglang.srt.mem_cache import hicache_storage
    from sglang.srt.mem_cache.storage import backend_factory
    d, why = installed_sglang()
    if d is None:
        raise RuntimeError(why)
    for m, f in zip((hicache_storage, backend_factory), FILES):
        if os.path.realpath(m.__file__) != os.path.realpath(os.path.join(d, f)):
            raise RuntimeError("%s is %s, not SGLang's %s" % (m.__name__, m.__file__, f))
    torch = sys.modules["torch"]
    if os.path.dirname(os.path.realpath(torch.__file__)) != os.path.realpath(os.path.join(STUB, "torch")):
        raise RuntimeError("torch is %s, not the empty stub" % torch.__file__)
    return hicache_storage, backend_factory
