"""Stands in for SGLang's own sglang/__init__.py in the processes of the
tests that drive kvreshard.sglang through SGLang's HiCache storage files
(see sglang_env.py beside this directory).

SGLang's __init__.py imports most of SGLang and its dependencies (numpy,
transformers, torch, triton, ...), which the tests' .venv does not have:
make venv installs sglang without its dependencies. This one only makes
the package a namespace over the installed sglang, so that every
submodule (sglang.srt.mem_cache.hicache_storage,
sglang.srt.mem_cache.storage.backend_factory, sglang.srt.environ) is
SGLang's own file.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
