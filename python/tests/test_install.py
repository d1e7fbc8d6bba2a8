"""The package builds offline with pip (its build runs go build) and finds
the library it installed next to itself, with its py.typed marker (PEP
561); it imports without numpy, SGLang or torch."""

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def env_without_lib(**kw):
    e = {k: v for k, v in os.environ.items() if k != "KVRESHARD_LIB"}
    e.update(kw)
    return e


def test_pip_install_offline(tmp_path):
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        msg = "pip is missing for %s: apt-get install python3-pip" % sys.executable
        if os.environ.get("KVRESHARD_REQUIRE_PYTHON") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    # a copy of python/, so that the build leaves nothing in the tree
    src = tmp_path / "python"
    shutil.copytree(os.path.join(ROOT, "python"), src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache",
                                                  "libkvreshard.*"))
    target = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
                        "--target", str(target), str(src)], capture_output=True, text=True,
                       env=env_without_lib(KVRESHARD_ROOT=ROOT), timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(x for x in os.listdir(target / "kvreshard") if x != "__pycache__") == [
        "__init__.py", "__main__.py", "_args.py", "_lib.py", "_types.py", "bench.py", "demo.py", "libkvreshard.so",
        "mooncake.py", "mooncake_client.py", "mooncake_local.py", "mooncake_url.py", "py.typed", "sglang"]
    assert (target / "kvreshard" / "py.typed").read_bytes() == b""
    assert sorted(x for x in os.listdir(target / "kvreshard" / "sglang") if x != "__pycache__") == [
        "__init__.py", "binding.py", "compat.py", "storage.py"]
    code = ("import kvreshard as kv, kvreshard.sglang as ks\n"
            "print(kv.library_path())\n"
            "print(kv.Model(layers=2, kv_heads=1, head_dim=4, dtype='fp16', page=2).domain())\n"
            "print(ks.__file__, ks.KvreshardStorage.__name__)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tmp_path),
                       env=env_without_lib(PYTHONPATH=str(target)), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    path, domain, sglang, storage = p.stdout.split()
    assert path == str(target / "kvreshard" / "libkvreshard.so")
    assert len(domain) == 64
    # the SGLang backend is in the install, where SGLang's factory imports it
    assert (sglang, storage) == (str(target / "kvreshard" / "sglang" / "__init__.py"), "KvreshardStorage")


def test_imports_without_numpy_sglang_or_torch():
    code = ("import sys\n"
            "sys.modules['numpy'] = None\n"
            "import kvreshard, kvreshard.sglang as ks\n"
            "assert not ks.HAVE_SGLANG and 'torch' not in sys.modules\n"
            "assert kvreshard._args.numpy() is None\n"
            "print(ks.KvreshardStorage.__mro__[1].__name__)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")), timeout=120)
    assert (p.returncode, p.stdout, p.stderr) == (0, "HiCacheStorage\n", "")


def test_missing_library_is_a_clear_error(tmp_path):
    code = ("import kvreshard as kv\n"
            "try:\n"
            "    kv.Store('mem://')\n"
            "except kv.KvreshardError as e:\n"
            "    print(e)\n")
    lib = str(tmp_path / "nolib.so")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), KVRESHARD_LIB=lib), timeout=120)
    assert (p.returncode, p.stderr) == (0, "")
    assert p.stdout == ("kvreshard: no C library at %s: run `make python` in the repository, pip install the "
                        "package, or set KVRESHARD_LIB to libkvreshard.so\n" % lib)
