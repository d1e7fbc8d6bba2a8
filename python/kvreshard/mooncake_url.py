"""The mooncake:// URL of a Mooncake store (kvreshard.Store's), and the
mapping of SGLang's own Mooncake backend's extra_config to one.

    mooncake://HOST:PORT?protocol=rdma&device=mlx5_0

The URL names the master (HOST:PORT) and takes these parameters:

- ``metadata``: the metadata server (default ``P2PHANDSHAKE``: none);
- ``protocol``: ``tcp`` (the default) or ``rdma``;
- ``device``: the RDMA device names, comma-separated (default: none);
- ``segment``: bytes of memory this process contributes to the store
  (default 0: none; readers and writers need none when memory servers hold
  the objects). A size is a number of bytes, or one with a unit kb, mb, gb
  or tb (powers of 1024: ``4gb``), or kib, mib, gib, tib;
- ``buffer``: Mooncake's local buffer size (default 0: kvreshard transfers
  from and into registered memory, not through that buffer);
- ``local_hostname``: the address other Mooncake processes reach this one
  at (default ``localhost``; set it when this process contributes memory
  and the store spans hosts);
- ``read_timeout_ms``: how long a read may wait for Mooncake (default 5000;
  0: for ever). Mooncake's ranged reads do not return while a memory holder
  that died is retried (minutes): such a read fails after the timeout, its
  pages are misses of that read, and the thread that made it stays blocked
  inside Mooncake until the client gives up.

Every bad parameter is a ValueError (kvreshard.InvalidArgument) naming it.

parse_url(url) returns them as a dict, with their defaults; parse_size
reads a size as the URL takes it. url_from_sglang(extra_config) maps the
extra_config of SGLang's own Mooncake backend to a mooncake:// URL of the
same meaning. kvreshard.mooncake re-exports the three, and opens stores on
such URLs.
"""

import json
import os
import re
import urllib.parse
from typing import Any, Dict, Optional, Union

from . import _lib
from ._lib import InvalidArgument

__all__ = ["parse_url", "parse_size", "url_from_sglang", "DEFAULT_READ_TIMEOUT_MS"]

# The read_timeout_ms parameter's default (Store.from_mooncake's too).
DEFAULT_READ_TIMEOUT_MS = 5000

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]i?b?)?\s*$", re.I)
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(what: str, v: Union[int, str]) -> int:
    """Bytes of a size: a non-negative int, or a string of digits with an
    optional unit k/kb/kib, m/mb/mib, g/gb/gib, t/tb/tib (any case; powers
    of 1024). ValueError naming `what` otherwise."""
    if isinstance(v, bool):
        raise InvalidArgument("kvreshard: %s must be a size in bytes, not %r" % (what, v), _lib.EINVAL)
    if isinstance(v, int):
        n = v
    elif isinstance(v, str):
        m = _SIZE.match(v)
        if not m:
            raise InvalidArgument("kvreshard: %s %r is not a size (bytes, or a number with kb, mb, gb or tb)"
                                  % (what, v), _lib.EINVAL)
        n = int(m.group(1)) * (_UNITS[m.group(2)[0].lower()] if m.group(2) else 1)
    else:
        raise InvalidArgument("kvreshard: %s must be a size in bytes, not %s" % (what, type(v).__name__),
                              _lib.EINVAL)
    if n < 0 or n >= 1 << 63:
        raise InvalidArgument("kvreshard: %s %r is out of range" % (what, v), _lib.EINVAL)
    return n


_PARAMS = ("metadata", "protocol", "device", "segment", "buffer", "local_hostname", "read_timeout_ms")
# The transports a client may use (Mooncake's names, as its setup takes them).
PROTOCOLS = ("tcp", "rdma")
# SGLang's extra_config key of each URL parameter (url_from_sglang).
_SGLANG_KEYS = {"metadata": "metadata_server", "protocol": "protocol", "device": "device_name",
                "segment": "global_segment_size", "buffer": "local_buffer_size", "local_hostname": "local_hostname"}
_TOKEN = re.compile(r"^[A-Za-z0-9_.\-]+$")


def parse_url(url: str) -> Dict[str, Any]:
    """The parameters of a mooncake:// URL as a dict: master ("HOST:PORT"),
    metadata, protocol, device, segment, buffer, local_hostname,
    read_timeout_ms, with their defaults. ValueError
    (kvreshard.InvalidArgument) naming what is wrong."""
    if not isinstance(url, str):
        raise TypeError("kvreshard: store url must be a str, not %s" % type(url).__name__)

    def bad(msg: str) -> InvalidArgument:
        return InvalidArgument("kvreshard: mooncake URL %r: %s" % (url, msg), _lib.EINVAL)

    try:
        u = urllib.parse.urlsplit(url)
    except ValueError as e:
        raise bad(str(e)) from None
    if u.scheme.lower() != "mooncake":
        raise bad("the scheme must be mooncake://")
    if u.path not in ("", "/") or u.fragment or u.username is not None or u.password is not None:
        raise bad("want mooncake://HOST:PORT?PARAMETERS, the master's address and nothing else before '?'")
    try:
        port = u.port
    except ValueError:
        raise bad("the master's port %r is not a port number" % u.netloc.rpartition(":")[2]) from None
    host = u.hostname
    if not host or port is None:
        raise bad("want mooncake://HOST:PORT, the master's host and port")
    if port == 0:
        raise bad("the master's port 0 is not a port number")
    cfg = {"master": "%s:%d" % ("[%s]" % host if ":" in host else host, port), "metadata": "P2PHANDSHAKE",
           "protocol": "tcp", "device": "", "segment": 0, "buffer": 0, "local_hostname": "localhost",
           "read_timeout_ms": DEFAULT_READ_TIMEOUT_MS}
    seen = set()
    for part in u.query.split("&") if u.query else ():
        if not part:
            continue
        name, eq, value = part.partition("=")
        name = urllib.parse.unquote(name)
        value = urllib.parse.unquote(value)
        if name not in _PARAMS:
            raise bad("unknown parameter %r; the parameters are %s" % (name, ", ".join(_PARAMS)))
        if name in seen:
            raise bad("parameter %s is given twice" % name)
        seen.add(name)
        if not eq:
            raise bad("parameter %s has no value (want %s=VALUE)" % (name, name))
        if name in ("segment", "buffer"):
            try:
                cfg[name] = parse_size("mooncake URL parameter " + name, value)
            except InvalidArgument as e:
                raise bad(str(e)[len("kvreshard: "):]) from None
        elif name == "read_timeout_ms":
            if not value.isdigit() or int(value) >= 1 << 62:
                raise bad("parameter read_timeout_ms %r is not a number of milliseconds" % value)
            cfg[name] = int(value)
        elif name == "protocol":
            if value not in PROTOCOLS:
                raise bad("parameter protocol %r is not one of %s" % (value, ", ".join(PROTOCOLS)))
            cfg[name] = value
        elif name == "device":
            if value and not all(_TOKEN.match(d) for d in value.split(",")):
                raise bad("parameter device %r is not a list of device names (mlx5_0,mlx5_1)" % value)
            cfg[name] = value
        else:  # metadata, local_hostname
            if not value or "\0" in value or any(c.isspace() for c in value):
                raise bad("parameter %s %r is empty or holds blanks" % (name, value))
            cfg[name] = value
    return cfg


def url_from_sglang(extra_config: Dict[str, Any], ranks: int = 1, tp_rank: Optional[int] = None) -> str:
    """The mooncake:// URL of the same Mooncake store, client and memory as
    SGLang's own Mooncake backend (sglang.srt.mem_cache.storage.mooncake_store)
    makes of extra_config, so that switching an instance's backend is one
    word. Keys, with SGLang's defaults:

    - master_server_address (required): the master, HOST:PORT;
    - metadata_server (P2PHANDSHAKE);
    - protocol (MOONCAKE_PROTOCOL of the environment, else rdma);
    - device_name (none): RDMA devices; a JSON object maps TP ranks to
      devices (tp_rank picks; none without it, as SGLang does);
    - global_segment_size (4gb): the memory of the whole instance, an int
      of bytes or a string as SGLang takes it ("4gb", "1073741824"); SGLang
      gives each rank global_segment_size // (tp_size x pp_size): pass
      ranks = tp_size x pp_size to do the same;
    - local_buffer_size (16 MiB, SGLang's constant);
    - local_hostname (MOONCAKE_LOCAL_HOSTNAME or LOCAL_HOSTNAME of the
      environment first, as SGLang; else localhost).

    Keys of SGLang's backend that have no meaning here
    (client_server_address and standalone_storage: a dummy client in front
    of a local real one) are refused; others are ignored. ValueError
    naming the key for a bad value."""
    if not isinstance(extra_config, dict):
        raise TypeError("kvreshard: extra_config must be a dict, not %s" % type(extra_config).__name__)

    def bad(key: str, msg: str) -> InvalidArgument:
        return InvalidArgument("kvreshard: extra_config %s: %s" % (key, msg), _lib.EINVAL)

    if extra_config.get("standalone_storage") or extra_config.get("client_server_address"):
        key = "standalone_storage" if extra_config.get("standalone_storage") else "client_server_address"
        raise bad(key, "kvreshard runs its own Mooncake client in each rank; a standalone (dummy) client "
                       "is not supported: give master_server_address")
    master = extra_config.get("master_server_address")
    if not isinstance(master, str) or not master:
        raise bad("master_server_address", "required: the Mooncake master, HOST:PORT, not %r" % (master,))
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise InvalidArgument("kvreshard: url_from_sglang: ranks must be a positive int, not %r" % (ranks,),
                              _lib.EINVAL)

    def text(key: str, default: str) -> str:
        v = extra_config.get(key, default)
        if not isinstance(v, str):
            raise bad(key, "must be a string, not %s" % type(v).__name__)
        return v

    def sglang_size(key: str, default: Union[int, str]) -> int:
        v = extra_config.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise bad(key, "must be bytes (an int) or a size such as \"4gb\", not %r" % (v,))
        if isinstance(v, str) and v.strip().lower().endswith("gb") and v.strip()[:-2].strip().isdigit():
            v = int(v.strip()[:-2].strip()) << 30  # SGLang: "<n>gb" only, else int(...)
        try:
            return parse_size("extra_config " + key, v)
        except InvalidArgument as e:
            raise bad(key, "%r is not a size in bytes or gb" % (v,)) from None

    segment = sglang_size("global_segment_size", "4gb") // ranks
    buffer = sglang_size("local_buffer_size", 16 << 20)
    metadata = text("metadata_server", "P2PHANDSHAKE")
    protocol = text("protocol", os.environ.get("MOONCAKE_PROTOCOL", "rdma"))
    device: Any = text("device_name", "")  # a JSON value until checked below
    if device.strip().startswith("{"):
        try:
            devices = json.loads(device)
        except ValueError:
            raise bad("device_name", "%r is not JSON" % device) from None
        if not isinstance(devices, dict):
            raise bad("device_name", "JSON must be an object of TP rank to devices")
        device = "" if tp_rank is None else devices.get(str(tp_rank), devices.get(tp_rank, ""))
        if not isinstance(device, str):
            raise bad("device_name", "TP rank %s's devices must be a string" % tp_rank)
    host = (os.environ.get("MOONCAKE_LOCAL_HOSTNAME") or os.environ.get("LOCAL_HOSTNAME")
            or text("local_hostname", "") or "localhost")
    q = [("metadata", metadata), ("protocol", protocol)]
    if device:
        q.append(("device", device))
    q += [("segment", str(segment)), ("buffer", str(buffer)), ("local_hostname", host)]
    url = "mooncake://%s?%s" % (master, urllib.parse.urlencode(q, safe=",:/", quote_via=urllib.parse.quote))
    try:
        parse_url(url)
    except InvalidArgument as e:
        m = re.search(r"parameter (\w+)", str(e))
        key = _SGLANG_KEYS.get(m.group(1), m.group(1)) if m else "master_server_address"
        raise bad(key, str(e)[len("kvreshard: "):]) from None
    return url
