"""A Mooncake Store on this machine, on loopback only: for kvreshard's tests,
its benchmark and trials (not for serving).

Mooncake's clients (a MooncakeDistributedStore after setup(), and the
mooncake_client binary) open their handshake and data listeners on every
address of the host (0.0.0.0 and [::]) whatever they are told. To keep
their traffic on loopback, run everything of one cluster (master, memory
holder, readers, writers, and the process that talks to them) in a private
network namespace that has only a loopback interface::

    unshare -rn sh -c 'ip link set lo up && exec "$@"' sh python3 driver.py

(a user and network namespace: no root needed). netns_command() builds that
command line, netns_reason() says why it cannot run here, and Master and
Holder refuse to start outside such a namespace (loopback_only()).

- Master(...): mooncake_master on 127.0.0.1 (RPC and metrics), P2P
  handshake metadata (no etcd, no HTTP metadata server). url is the
  mooncake:// URL of kvreshard.Store.
- Holder(master_addr, segment): a process that contributes `segment` bytes of
  memory to the store and does nothing else (python -m
  kvreshard.mooncake_local holder ...), as a Mooncake deployment's memory
  servers do; readers and writers then run with segment 0.

Both are context managers, kill their process on exit, and bound every
wait.
"""

import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, TypeVar

# The directory holding this kvreshard package: first on the PYTHONPATH of
# the processes started here, so that they run this package.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NETNS_SCRIPT = 'ip link set lo up && exec "$@"'


def netns_command(argv: Iterable[str]) -> List[str]:
    """argv run in a new user and network namespace with only loopback (up)."""
    return ["unshare", "-rn", "sh", "-c", NETNS_SCRIPT, "sh"] + list(argv)


_netns = None


def netns_reason() -> Optional[str]:
    """None when netns_command works here, else why not (cached)."""
    global _netns
    if _netns is None:
        if shutil.which("unshare") is None:
            _netns = "no unshare command (util-linux) to make a loopback-only network namespace"
        elif shutil.which("ip") is None:
            _netns = "no ip command (iproute2) to bring up loopback in a network namespace"
        else:
            try:
                p = subprocess.run(netns_command([sys.executable, "-c", "import socket; "
                                                  "print(' '.join(n for _, n in socket.if_nameindex()))"]),
                                   capture_output=True, text=True, timeout=30)
                if p.returncode != 0:
                    _netns = "unshare -rn (a user and network namespace) failed: exit %d: %s" % (
                        p.returncode, (p.stderr.strip() or p.stdout.strip())[-300:])
                elif p.stdout.split() != ["lo"]:
                    _netns = "the network namespace of unshare -rn has interfaces %s, not only lo" % p.stdout.split()
                else:
                    _netns = ""
            except (OSError, subprocess.TimeoutExpired) as e:
                _netns = "unshare -rn failed: %s" % e
    return _netns or None


def loopback_only() -> bool:
    """Whether this process's network namespace has no interface but lo."""
    try:
        return [n for _, n in socket.if_nameindex()] == ["lo"]
    except OSError:
        return False


def require_loopback_only(what: str) -> None:
    if not loopback_only():
        raise RuntimeError("kvreshard: %s: Mooncake's clients listen on every address; run this in a "
                           "network namespace with only loopback: %s" % (what, " ".join(netns_command(["..."]))))


def mooncake_dir() -> str:
    """The directory of the installed mooncake package (its binaries are there)."""
    spec = importlib.util.find_spec("mooncake")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("kvreshard: the mooncake package is not installed "
                           "(make venv installs mooncake-transfer-engine-non-cuda)")
    return list(spec.submodule_search_locations)[0]


def mooncake_reason() -> Optional[str]:
    """None when Mooncake's Python client and master can run here, else why not."""
    try:
        spec = importlib.util.find_spec("mooncake.store")
    except (ImportError, ValueError) as e:
        return "no mooncake.store: %s" % e
    if spec is None:
        return "no mooncake.store in %s (make venv installs mooncake-transfer-engine-non-cuda)" % sys.executable
    p = subprocess.run([sys.executable, "-c", "from mooncake.store import MooncakeDistributedStore"],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        return "%s cannot import mooncake.store: %s" % (sys.executable, (p.stderr.strip() or "exit %d" % p.returncode)
                                                      .splitlines()[-1])
    if not os.access(os.path.join(mooncake_dir(), "mooncake_master"), os.X_OK):
        return "no executable mooncake_master in %s" % mooncake_dir()
    return None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, outside Mooncake's own ranges."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if not 12000 <= p <= 17100:
            return p
    raise RuntimeError("kvreshard: no free port outside 12000-17100")


def wait_until(what: str, cond: Callable[[], bool], timeout: float, proc: Optional["subprocess.Popen[Any]"] = None,
               log: Optional[str] = None) -> None:
    """Poll cond() until it is true; RuntimeError after timeout seconds or
    when proc exits."""
    end = time.monotonic() + timeout
    while True:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("kvreshard: %s: the process exited with %s%s" % (what, proc.returncode, _tail(log)))
        if time.monotonic() > end:
            raise RuntimeError("kvreshard: %s: not ready within %gs%s" % (what, timeout, _tail(log)))
        time.sleep(0.02)


def _tail(log: Optional[str], n: int = 2000) -> str:
    if not log:
        return ""
    try:
        with open(log, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - n))
            return "\n" + f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def client_env(env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment of a process with a Mooncake client: bytes cross TCP
    even to the process's own segment (MC_STORE_MEMCPY=false), its INFO and
    WARNING lines are off (MC_LOG_LEVEL=ERROR) unless set, and this
    kvreshard package comes first on PYTHONPATH."""
    e = dict(os.environ if env is None else env)
    e["PYTHONPATH"] = os.pathsep.join([PACKAGE_PARENT] + [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p])
    e["MC_STORE_MEMCPY"] = "false"
    e.setdefault("MC_LOG_LEVEL", "ERROR")
    return e


def die_with_parent() -> None:
    """A preexec_fn for Popen: the child is killed when the thread that
    started it ends (PR_SET_PDEATHSIG), so that no process of a cluster
    outlives a driver that was killed. Call Popen from the main thread."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


_P = TypeVar("_P", bound="_Proc")


class _Proc:
    """A process of the cluster, in its own process group, logging to a
    file, killed when the process that started it dies."""

    proc = None
    log: str  # the log file's path, set by each kind of process

    def _spawn(self, argv: List[str], env: Optional[Mapping[str, str]] = None) -> None:
        self.log_file = open(self.log, "ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=self.log_file, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True, preexec_fn=die_with_parent)

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 10) -> None:
        """Send sig to the process (and its group); wait for it to exit when
        the signal ends it."""
        p = self.proc
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass
        if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout)

    def close(self) -> None:
        self.kill()
        if self.proc is not None:
            for f in (self.proc.stdin,):
                try:
                    f.close()
                except OSError:
                    pass
        if getattr(self, "log_file", None):
            self.log_file.close()
            self.log_file = None

    def __enter__(self: _P) -> _P:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def log_tail(self, n: int = 2000) -> str:
        return _tail(self.log, n)


class Master(_Proc):
    """mooncake_master on 127.0.0.1:port (a free port by default), metrics on
    metrics_port. client_ttl (seconds): how long after a client stops
    heartbeating its memory and objects are dropped; lease_ms: the lease
    reads and exist checks grant (no eviction or plain remove meanwhile);
    extra: more flags. start() is called by the constructor; after kill(),
    start() runs it again on the same ports (its objects are lost: the
    master keeps them in memory only)."""

    def __init__(self, port: Optional[int] = None, metrics_port: Optional[int] = None, client_ttl: Optional[int] = None,
                 lease_ms: Optional[int] = None, extra: Iterable[str] = (), logdir: Optional[str] = None,
                 timeout: float = 30) -> None:
        require_loopback_only("mooncake master")
        self.port = port or free_port()
        self.metrics_port = metrics_port or free_port()
        self.flags = ["--rpc_address=127.0.0.1", "--rpc_port=%d" % self.port, "--metrics_host=127.0.0.1",
                      "--metrics_port=%d" % self.metrics_port, "--logtostderr", "--minloglevel=1"]
        if client_ttl is not None:
            self.flags.append("--client_ttl=%d" % client_ttl)
        if lease_ms is not None:
            self.flags.append("--default_kv_lease_ttl=%dms" % lease_ms)
        self.flags += list(extra)
        self._own_dir = logdir is None  # removed with its logs at close
        self.dir = logdir or tempfile.mkdtemp(prefix="kvreshard-mooncake-")
        self.log = os.path.join(self.dir, "master-%d.log" % self.port)
        self.timeout = timeout
        self.start()

    @property
    def addr(self) -> str:
        return "127.0.0.1:%d" % self.port

    def close(self) -> None:
        super().close()
        if getattr(self, "_own_dir", False):
            shutil.rmtree(self.dir, ignore_errors=True)
            self._own_dir = False

    @property
    def url(self) -> str:
        """The mooncake:// URL of a reader or writer contributing no memory."""
        return "mooncake://%s?local_hostname=127.0.0.1&protocol=tcp&metadata=P2PHANDSHAKE" % self.addr

    def start(self) -> None:
        if self.alive():
            return
        if getattr(self, "log_file", None):
            self.log_file.close()
        self._spawn([os.path.join(mooncake_dir(), "mooncake_master")] + self.flags)
        wait_until("mooncake master on %s" % self.addr, self.healthy, self.timeout, self.proc, self.log)

    def healthy(self) -> bool:
        """Whether the master answers its health check as the serving leader."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                pass
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % self.metrics_port, timeout=2) as r:
                return json.loads(r.read().decode()).get("service_ready") is True
        except (OSError, ValueError):
            return False

    def metrics(self) -> Dict[str, float]:
        """The master's Prometheus metrics as {name: value} (unlabelled ones)."""
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics_port, timeout=5) as r:
            out = {}
            for line in r.read().decode().splitlines():
                if line and not line.startswith("#"):
                    name, _, v = line.rpartition(" ")
                    try:
                        out[name] = float(v)
                    except ValueError:
                        pass
            return out

    def capacity(self) -> int:
        """Bytes of memory the holders contribute now, as the master counts them."""
        try:
            return int(self.metrics().get("master_total_capacity_bytes", 0))
        except (OSError, ValueError):
            return 0


class Holder(_Proc):
    """A process contributing `segment` bytes of memory to the store of the
    master at master_addr (host:port), with a Python client (setup with
    that segment) and nothing else. Ready when its setup returned and the
    master counts its memory. kill() it as a holder dies; stop() closes it
    as it shuts down (its objects go at once)."""

    def __init__(self, master: Master, segment: int, logdir: Optional[str] = None, timeout: float = 60,
                 env: Optional[Mapping[str, str]] = None) -> None:
        require_loopback_only("mooncake memory holder")
        self.master = master
        self.segment = segment
        self.dir = logdir or getattr(master, "dir", None) or tempfile.mkdtemp(prefix="kvreshard-mooncake-")
        os.makedirs(self.dir, exist_ok=True)
        self.log = os.path.join(self.dir, "holder-%d.log" % time.monotonic_ns())
        before = master.capacity()
        self._spawn([sys.executable, "-m", "kvreshard.mooncake_local", "holder", "--master", master.addr,
                     "--segment", str(segment)], env=client_env(env))
        wait_until("mooncake memory holder", lambda: master.capacity() >= before + segment, timeout,
                   self.proc, self.log)

    def stop(self, timeout: float = 30) -> None:
        """Close the holder's client (it unmounts its memory) and wait for its exit."""
        p = self.proc
        if p is None or p.poll() is not None:
            return
        try:
            p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


def _holder_main(a: argparse.Namespace) -> int:
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", a.segment, 0, "tcp", "", a.master)
    if rc != 0:
        print("kvreshard holder: setup returned %d" % rc, file=sys.stderr, flush=True)
        return 1
    print("kvreshard holder: ready, %d bytes for %s" % (a.segment, a.master), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.stdin.close())
    try:
        sys.stdin.read()  # until the end of stdin: stop()
    except (OSError, ValueError):
        pass
    s.close()
    os._exit(0)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kvreshard.mooncake_local")
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("holder", help="contribute memory to a master until stdin ends")
    h.add_argument("--master", required=True, help="host:port of the master")
    h.add_argument("--segment", type=int, required=True, help="bytes to contribute")
    a = ap.parse_args(argv)
    if a.cmd == "holder":
        require_loopback_only("mooncake memory holder")
        return _holder_main(a)
    return 2


if __name__ == "__main__":
    sys.exit(main())
