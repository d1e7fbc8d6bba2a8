"""An empty module named torch, for the tests that import SGLang's HiCache
storage files without PyTorch (see sglang_env.py).

hicache_storage.py imports torch but uses it only in annotations, which
are strings there (from __future__ import annotations) and never
evaluated; nothing else of torch is touched at import. The tests' host
pools are numpy arrays. Should anything in those files start to use torch,
the import fails here and the tests say so.
"""
