"""Mooncake's client as kvreshard meets it: the return codes of
mooncake.store.MooncakeDistributedStore that matter here (ERRORS,
code_name, NOT_FOUND, ...), and connect(url), a client set up as a
mooncake:// URL says (kvreshard.mooncake_url). kvreshard.mooncake
re-exports them; its engine moves objects over such a client.
"""

import os
import socket
from typing import Any, Dict, Optional, Tuple

from ._lib import EINVAL, InvalidArgument, StoreError
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


# Where Linux lists a host's RDMA devices.
RDMA_DEVICES = "/sys/class/infiniband"


def _check_host(url: str, cfg: Dict[str, Any]) -> None:
    """InvalidArgument naming the parameter of cfg that this host cannot
    honour: protocol rdma without an RDMA device, a device it does not have,
    a segment larger than its memory."""
    def bad(msg: str) -> InvalidArgument:
        return InvalidArgument("kvreshard: mooncake URL %r: %s" % (url, msg), EINVAL)
    if cfg["protocol"] == "rdma":
        try:
            have = sorted(os.listdir(RDMA_DEVICES))
        except OSError:
            have = []
        if not have:
            raise bad("protocol rdma: this host has no RDMA device (%s is empty); use protocol=tcp" % RDMA_DEVICES)
        for d in filter(None, cfg["device"].split(",")):
            if d not in have:
                raise bad("parameter device %r: this host has no RDMA device %s (it has %s)" % (d, d, ", ".join(have)))
    total = _host_memory()
    if total and cfg["segment"] > total:
        raise bad("parameter segment %d: more than the %d bytes of memory of this host" % (cfg["segment"], total))


def _host_memory() -> int:
    """Bytes of memory of this host (MemTotal), or 0 where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _check_metadata(url: str, metadata: str) -> None:
    """StoreError when a metadata server (etcd://host:port,...,
    http://host:port/...) takes no connection within 5 s: none of its
    addresses does. P2PHANDSHAKE has none."""
    if "://" not in metadata:
        return
    addrs = [a.split("/", 1)[0] for a in metadata.partition("://")[2].split(",") if a]
    last = None
    for a in addrs:
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit():
            return  # no port: leave it to Mooncake
        last = refused(a, 5)
        if last is None:
            return
    if last is not None:
        raise StoreError("kvreshard: %s: cannot reach the metadata server %s: %s" % (url, metadata, last))


def refused(address: str, timeout: float) -> Optional[Exception]:
    """Why "host:port" (an IPv6 host in brackets) takes no TCP connection
    within timeout seconds, or None when it takes one."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except (OSError, ValueError) as e:
        return e


def code_name(rc: int) -> str:
    """A Mooncake return code with its name, as "-704 (OBJECT_NOT_FOUND)"."""
    n = ERRORS.get(rc)
    return "%d (%s)" % (rc, n) if n else str(rc)


def connect(url: str) -> Tuple[Any, Dict[str, Any]]:
    """A MooncakeDistributedStore set up as the URL says (parse_url), and the
    parsed URL. InvalidArgument (a ValueError) naming the parameter when
    this host cannot have what it says (an RDMA device it lacks, a segment
    larger than its memory); StoreError when the master or the metadata
    server cannot be reached or setup fails. Mooncake's setup waits for
    minutes on what is missing: these are checked first."""
    cfg = parse_url(url)
    _check_host(url, cfg)
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:
        raise StoreError("kvreshard: %s: cannot import mooncake.store (pip install "
                         "mooncake-transfer-engine, or make venv): %s" % (url, e)) from None
    # setup() retries an unreachable master for about 90 s, and a metadata
    # server for minutes: fail fast instead.
    err = refused(cfg["master"], 5)
    if err is not None:
        raise StoreError("kvreshard: %s: cannot reach the Mooncake master at %s: %s" % (url, cfg["master"], err))
    _check_metadata(url, cfg["metadata"])
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

