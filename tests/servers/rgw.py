"""A throwaway single-node Ceph RADOS Gateway on 127.0.0.1: a real S3 implementation for tests and benchmarks.

One monitor, one OSD on the in-memory ``memstore`` object store and ``radosgw`` with the beast frontend, all
bound to loopback with authentication between daemons turned off. Everything lives in a scratch folder that is
deleted on ``stop()``, on a failed start and at interpreter exit. The Ceph binaries come from Debian's
packages (``.ci/install-s3-servers``). Memory: the OSD keeps every stored byte in RAM, up to
``memstore_bytes``.

    with RadosGateway() as rgw:
        rgw.client().list_buckets()

As a script, ``python tests/servers/rgw.py --serve`` prints the endpoint and keys as one JSON line and serves
until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

GIB = 1 << 30
DEFAULT_MEMSTORE_BYTES = 2 * GIB
# What `.ci/install-s3-servers` checks too.
REQUIRED_BINARIES = (
    "radosgw",
    "ceph-mon",
    "ceph-osd",
    "ceph",
    "radosgw-admin",
    "monmaptool",
    "ceph-authtool",
)
SCRATCH_PREFIX = "fastload-rgw-"
INSTALL_HINT = "run `bash .ci/install-s3-servers` (as root) to install them"
LOG_TAIL_LINES = 40


class RgwStartError(RuntimeError):
    """The gateway did not come up; the message carries the failing step and the tail of the relevant log."""

    def __init__(self, message: str, *, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class _StepError(Exception):
    """One step of one start attempt failed; ``log_tail`` is what to show the user."""

    def __init__(self, step: str, detail: str, log_tail: str = "") -> None:
        super().__init__(step)
        self.step = step
        self.detail = detail
        self.log_tail = log_tail

    def render(self) -> str:
        text = f"{self.step}: {self.detail}"
        if self.log_tail:
            text += f"\n--- log tail ---\n{self.log_tail}"
        return text


def missing_binaries() -> list[str]:
    """The Ceph executables that are not on PATH (empty when the gateway can start)."""
    return [name for name in REQUIRED_BINARIES if shutil.which(name) is None]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (a race with other processes is possible)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def render_ceph_conf(*, root: Path, fsid: str, mon_port: int, rgw_port: int, memstore_bytes: int) -> str:
    """The ceph.conf of a one-monitor, one-memstore-OSD cluster on loopback rooted at ``root``."""
    return f"""\
[global]
fsid = {fsid}
mon_host = v1:127.0.0.1:{mon_port}
mon_initial_members = a
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
public_network = 127.0.0.0/8
cluster_network = 127.0.0.0/8
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_ipv4 = true
ms_bind_ipv6 = false
ms_bind_msgr2 = false
run_dir = {root}/run
crash_dir = {root}/crash
admin_socket = {root}/run/$cluster-$name.asok
log_file = {root}/log/$cluster-$name.log
pid_file = {root}/run/$cluster-$name.pid
keyring = {root}/keyring
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
mon_max_pg_per_osd = 1000
mon_data_avail_crit = 0
mon_data_avail_warn = 0

[mon]
mon_data = {root}/mon/$cluster-$id
paxos_propose_interval = 0.05

[osd]
osd_data = {root}/osd/$cluster-$id
osd_objectstore = memstore
memstore_device_bytes = {memstore_bytes}
osd_max_object_size = 1073741824
# At boot the OSD would send these two crush updates from a monitor client whose monmap may still carry
# a zero fsid, then exit on the monitor's "wrong fsid" (~20% of starts); start() puts it in crush instead.
osd_class_update_on_start = false
osd_crush_update_on_start = false

[client.rgw.a]
rgw_frontends = beast endpoint=127.0.0.1:{rgw_port}
rgw_data = {root}/rgw
"""


def sweep_stale_scratch(tmp_dir: Path | None = None) -> None:
    """Delete scratch folders left by processes that died without cleaning up (the name holds the pid)."""
    for folder in Path(tmp_dir or tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*-*"):
        pid = folder.name[len(SCRATCH_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def _run_captured(argv: list[str], *, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


_live: set[RadosGateway] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all_at_exit() -> None:
    with _live_lock:
        gateways = list(_live)
    for gateway in gateways:
        gateway.stop()


class RadosGateway:
    """A single-node Ceph RGW on a free 127.0.0.1 port with one S3 user; a context manager.

    ``start()`` tries again with a fresh folder and ports when an attempt fails (a safety net: without the
    crush settings in ``render_ceph_conf`` about one OSD start in five died) and gives up after ``timeout_s``
    in all, raising ``RgwStartError`` with the tail of the relevant daemon log. Daemons started from the main
    thread also die with this process if it is killed outright.
    """

    region = "us-east-1"

    def __init__(
        self,
        *,
        memstore_bytes: int = DEFAULT_MEMSTORE_BYTES,
        timeout_s: float = 90.0,
        osd_up_timeout_s: float = 30.0,
        attempts: int = 2,
        access_key: str = "fastload-test-access-key",
        secret_key: str = "fastload-test-secret-key",
    ) -> None:
        if memstore_bytes < 64 << 20:
            raise ValueError(f"{memstore_bytes=} must be >= 64 MiB")
        if attempts < 1:
            raise ValueError(f"{attempts=} must be >= 1")
        self.memstore_bytes = memstore_bytes
        self.timeout_s = timeout_s
        self.osd_up_timeout_s = osd_up_timeout_s
        self.attempts = attempts
        self.access_key = access_key
        self.secret_key = secret_key
        self.port: int | None = None
        self.root: Path | None = None
        self.start_duration_s: float | None = None
        self.start_attempts = 0
        self.start_failures: list[str] = []
        self._procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []

    # ------------------------------------------------------------------ public API

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise RuntimeError("RadosGateway is not started; call start() first")
        return f"http://127.0.0.1:{self.port}"

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this gateway, path-style addressing; ``config`` overrides botocore Config."""
        import boto3
        from botocore.config import Config

        settings: dict[str, Any] = {
            "s3": {"addressing_style": "path"},
            "retries": {"max_attempts": 2, "mode": "standard"},
            "connect_timeout": 5,
            "read_timeout": 30,
        }
        settings.update(config)
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(**settings),
        )

    def info(self) -> dict[str, str]:
        return {
            "endpoint_url": self.endpoint_url,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "region": self.region,
        }

    def start(self) -> RadosGateway:
        if self._procs:
            raise RuntimeError("RadosGateway is already started")
        missing = missing_binaries()
        if missing:
            raise RgwStartError(f"Ceph binaries not found: {', '.join(missing)}; {INSTALL_HINT}", attempts=0)
        began = time.monotonic()
        deadline = began + self.timeout_s
        sweep_stale_scratch()
        failures = self.start_failures = []
        for attempt in range(1, self.attempts + 1):
            self.start_attempts = attempt
            with _live_lock:
                _live.add(self)
            try:
                self._start_once(deadline)
            except _StepError as exc:
                failures.append(f"attempt {attempt}: {exc.render()}")
                self.stop()
                if time.monotonic() + 10 > deadline:
                    break
            except BaseException:
                self.stop()
                raise
            else:
                self.start_duration_s = time.monotonic() - began
                return self
        raise RgwStartError(
            f"Ceph RGW did not start within {self.timeout_s:.0f} s ({len(failures)} attempt(s)):\n"
            + "\n\n".join(failures),
            attempts=len(failures),
        )

    def stop(self) -> None:
        """Kill every daemon and delete the scratch folder; safe to call twice."""
        for _, proc, log in reversed(self._procs):
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            log.close()
        self._procs = []
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
        self.port = None
        with _live_lock:
            _live.discard(self)

    def dead_daemons(self) -> list[str]:
        """Names of daemons that have exited since start (empty while healthy)."""
        return [name for name, proc, _ in self._procs if proc.poll() is not None]

    def __enter__(self) -> RadosGateway:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ one attempt

    def _start_once(self, deadline: float) -> None:
        root = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
        self.root = root
        for sub in ("mon", "osd/ceph-0", "run", "log", "rgw", "crash"):
            (root / sub).mkdir(parents=True)
        fsid = str(uuid.uuid4())
        mon_port, rgw_port = free_port(), free_port()
        while rgw_port == mon_port:
            rgw_port = free_port()
        conf = root / "ceph.conf"
        conf.write_text(
            render_ceph_conf(
                root=root, fsid=fsid, mon_port=mon_port, rgw_port=rgw_port, memstore_bytes=self.memstore_bytes
            )
        )
        keyring, monmap = root / "keyring", root / "monmap"
        c = ("-c", str(conf))

        authtool = ["ceph-authtool", "--create-keyring", str(keyring), "--gen-key", "-n", "mon."]
        self._run("ceph-authtool", [*authtool, "--cap", "mon", "allow *"], deadline)
        mon_addr = f"[v1:127.0.0.1:{mon_port}]"
        self._run(
            "monmaptool",
            ["monmaptool", "--create", "--addv", "a", mon_addr, "--fsid", fsid, str(monmap)],
            deadline,
        )
        self._run(
            "ceph-mon --mkfs",
            ["ceph-mon", *c, "--mkfs", "-i", "a", "--monmap", str(monmap), "--keyring", str(keyring)],
            deadline,
        )
        self._spawn("mon", ["ceph-mon", *c, "-f", "-i", "a"])

        osd_uuid = str(uuid.uuid4())
        ceph = ["ceph", *c, "--connect-timeout", "20"]
        self._run("ceph osd create", [*ceph, "osd", "create", osd_uuid], deadline)
        self._run(
            "ceph osd crush add", [*ceph, "osd", "crush", "add", "osd.0", "1", "root=default"], deadline
        )
        osd_mkfs = ["ceph-osd", *c, "-i", "0", "--mkfs", "--osd-uuid", osd_uuid]
        self._run("ceph-osd --mkfs", osd_mkfs, deadline, log="osd")
        self._spawn("osd", ["ceph-osd", *c, "-f", "-i", "0"])
        self._wait_osd_up(conf, min(deadline, time.monotonic() + self.osd_up_timeout_s))

        self._spawn("rgw", ["radosgw", *c, "-f", "-n", "client.rgw.a"])
        self._wait("rgw port", lambda: _port_open(rgw_port), deadline, log="rgw")
        self.port = rgw_port
        self._run(
            "radosgw-admin user create",
            [
                "radosgw-admin",
                *c,
                "-n",
                "client.rgw.a",
                "user",
                "create",
                "--uid=test",
                "--display-name=test",
                f"--access-key={self.access_key}",
                f"--secret-key={self.secret_key}",
            ],
            deadline,
            log="rgw",
        )
        self._wait_s3_answers(deadline)

    def _log_paths(self, name: str) -> list[Path]:
        if self.root is None:
            return []
        ceph_name = {"mon": "mon.a", "osd": "osd.0", "rgw": "client.rgw.a"}[name]
        return [self.root / "log" / f"{name}.out", self.root / "log" / f"ceph-{ceph_name}.log"]

    def _log_tail(self, name: str) -> str:
        return "\n".join(f"[{path.name}]\n{_tail(path)}" for path in self._log_paths(name) if path.exists())

    def _spawn(self, name: str, argv: list[str]) -> None:
        assert self.root is not None
        # The parent-death signal follows the spawning thread, so only ask for it from the main thread:
        # then the daemons die with this process even when it is killed without running atexit.
        if threading.current_thread() is threading.main_thread() and shutil.which("setpriv"):
            argv = ["setpriv", "--pdeathsig", "KILL", "--", *argv]
        log = (self.root / "log" / f"{name}.out").open("wb")
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._procs.append((name, proc, log))

    def _run(
        self, step: str, argv: list[str], deadline: float, *, log: str = "mon", cap_s: float = 30.0
    ) -> str:
        self._check_daemons(step)
        timeout = max(1.0, min(cap_s, deadline - time.monotonic()))
        try:
            done = _run_captured(argv, timeout_s=timeout)
        except subprocess.TimeoutExpired as exc:
            raise _StepError(step, f"timed out after {timeout:.0f} s", self._log_tail(log)) from exc
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip().splitlines()[-LOG_TAIL_LINES:]
            raise _StepError(step, f"exit status {done.returncode}", "\n".join(output))
        return done.stdout

    def _check_daemons(self, step: str) -> None:
        for name in self.dead_daemons():
            raise _StepError(step, f"ceph {name} daemon exited", self._log_tail(name))

    def _wait(self, step: str, ready: Any, deadline: float, *, log: str, interval_s: float = 0.25) -> None:
        while True:
            self._check_daemons(step)
            if ready():
                return
            if time.monotonic() >= deadline:
                raise _StepError(step, "timed out", self._log_tail(log))
            time.sleep(interval_s)

    def _wait_osd_up(self, conf: Path, deadline: float) -> None:
        argv = ["ceph", "-c", str(conf), "--connect-timeout", "5", "osd", "stat", "-f", "json"]

        def osd_up() -> bool:
            try:
                done = _run_captured(argv, timeout_s=10)
                return done.returncode == 0 and json.loads(done.stdout).get("num_up_osds") == 1
            except (subprocess.TimeoutExpired, ValueError):
                return False

        self._wait("osd 1 up", osd_up, deadline, log="osd", interval_s=0.5)

    def _wait_s3_answers(self, deadline: float) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=5)
        last: list[str] = []

        def answers() -> bool:
            try:
                client.list_buckets()
            except (BotoCoreError, ClientError) as exc:
                last[:] = [repr(exc)]
                return False
            return True

        try:
            self._wait("signed S3 request", answers, deadline, log="rgw")
        except _StepError as exc:
            exc.detail += f" (last error: {last[0] if last else 'none'})"
            raise
        finally:
            client.close()


class _Stop(BaseException):
    pass


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signum)


def _serve(args: argparse.Namespace) -> int:
    # SIGTERM/SIGINT interrupt start() or the wait below alike; stop() then runs with both ignored.
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    gateway = RadosGateway(memstore_bytes=args.memstore_bytes, timeout_s=args.timeout_s)
    try:
        gateway.start()
        print(json.dumps(gateway.info()), flush=True)
        while not gateway.dead_daemons():
            time.sleep(1.0)
        print(f"ceph daemon(s) exited: {', '.join(gateway.dead_daemons())}", file=sys.stderr)
        return 1
    except RgwStartError as exc:
        print(exc, file=sys.stderr)
        return 1
    except _Stop:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        gateway.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--serve", action="store_true", help="start, print JSON, serve until SIGTERM/SIGINT")
    parser.add_argument("--memstore-bytes", type=int, default=DEFAULT_MEMSTORE_BYTES)
    parser.add_argument("--timeout-s", type=float, default=90.0)
    args = parser.parse_args(argv)
    if not args.serve:
        parser.error("nothing to do: pass --serve")
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())
