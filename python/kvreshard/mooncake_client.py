"""Mooncake's client as kvreshard meets it: the return codes of
mooncake.store.MooncakeDistributedStore that matter here (ERRORS,
code_name, NOT_FOUND, ...), and connect(url), a client set up as a
mooncake:// URL says (kvreshard.mooncake_url). kvreshard.mooncake
re-exports them; its engine moves objects over such a client.
"""

import socket

from ._lib import StoreError
from .mooncake_url import parse_url

__all__ = ["ERRORS", "NOT_FOUND", "NOT_READY", "LEASE_EXPIRED", "NO_SPACE", "TRANSFER_FAIL", "code_name", "connect"]

# Mooncake's error codes that the engine meets (mooncake-store's types.h).
ERRORS = {
    -1: "INTERNAL_ERROR",
    -10: "BUFFER_OVERFLOW",
    -200: "NO_AVAILABLE_HANDLE",
    -600: "INVALID_PARAMS",
    -703: "REPLICA_IS_NOT_READY",
    -704: "OBJECT_NOT_FOUND",
    -706: "OBJECT_HAS_LEASE",
    -707: "LEASE_EXPIRED",
    -800: "TRANSFER_FAIL",
    -900: "RPC_FAIL",
}
NOT_FOUND = -704
NOT_READY = -703
LEASE_EXPIRED = -707
NO_SPACE = -200
TRANSFER_FAIL = -800


def code_name(rc):
    """A Mooncake return code with its name, as "-704 (OBJECT_NOT_FOUND)"."""
    n = ERRORS.get(rc)
    return "%d (%s)" % (rc, n) if n else str(rc)


def connect(url):
    """A MooncakeDistributedStore set up as the URL says (parse_url), and the
    parsed URL. StoreError when the master cannot be reached or setup fails."""
    cfg = parse_url(url)
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:
        raise StoreError("kvreshard: %s: cannot import mooncake.store (pip install "
                         "mooncake-transfer-engine, or make venv): %s" % (url, e)) from None
    # setup() retries an unreachable master for about 90 s: fail fast instead.
    host, _, port = cfg["master"].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
            pass
    except OSError as e:
        raise StoreError("kvreshard: %s: cannot reach the Mooncake master at %s: %s" % (url, cfg["master"], e)) from None
    client = MooncakeDistributedStore()
    rc = client.setup(cfg["local_hostname"], cfg["metadata"], cfg["segment"], cfg["buffer"], cfg["protocol"],
                      cfg["device"], cfg["master"])
    if rc != 0:
        try:
            client.close()
        except Exception:
            pass
        raise StoreError("kvreshard: %s: Mooncake client setup returned %s" % (url, code_name(rc)))
    return client, cfg

