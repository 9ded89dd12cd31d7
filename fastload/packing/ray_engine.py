"""``fastload pack --engine ray``: the planned shards written by Ray tasks on any node of a cluster.

:class:`RayEngine` implements :class:`fastload.packing.engine.Engine`. The driver lists and plans exactly as
for the local engine (:func:`fastload.pack`), then hands each unfinished shard's job (its samples, whole) to
a Ray task. The task writes the shard through the same :func:`~fastload.packing.engine.publish_shard`
(job's writer, publish under the final name, journal), and returns its index entry; the driver collects the
entries and writes ``index.json`` last. So the output is the local engine's, byte for byte, and the
guarantees carry over:

- a task that dies (worker crash, lost node) is retried by Ray (``max_retries``); each attempt writes to a
  temporary folder of its own, so a shard is published whole or not at all;
- a driver killed mid-run leaves the journal: ``--resume`` keeps the published shards and writes the rest.

Local sources and destinations must be on a file system that every node mounts at the same path (a task
checks and says so); ``s3://`` works from anywhere. Every node needs fastload installed.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from fastload.config import S3Config
from fastload.errors import ConfigError, FastloadError, PackError
from fastload.formats.shard import ShardResult
from fastload.packing.dest import LocalDestination, destination
from fastload.packing.engine import Advance, Done, ShardJob, publish_shard
from fastload.packing.journal import STATE_DIR, PackJournal
from fastload.packing.staging import StagingFolder, sweep_stale

INSTALL_HINT = "pip install 'fastload[ray]'"
MAX_RETRIES = 3  # attempts per shard after the first, when its worker process or node dies
IN_FLIGHT_PER_CPU = 2  # shards submitted ahead per cluster CPU: no node waits on the driver


def require_ray(address: str | None = None) -> ModuleType:
    """The ``ray`` module, or a :class:`ConfigError` saying how to install it. With an ``address`` (or
    ``RAY_ADDRESS``) of the form ``[ray://]host:port``, also check that something listens there: Ray itself
    retries an unreachable cluster for minutes."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"the Ray engine needs Ray, which is not installed: {INSTALL_HINT}") from None
    target = address if address is not None else os.environ.get("RAY_ADDRESS")
    host, sep, port = (target or "").split("://", 1)[-1].rpartition(":")
    if target and sep and host and port.isdigit():
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
        except OSError as exc:
            raise PackError(
                f"cannot reach the Ray cluster at {target} ({exc.strerror or exc}); check --ray-address "
                "(the head node's host:6379, or ray://host:10001) and that `ray start --head` runs there"
            ) from None
    return ray


@contextlib.contextmanager
def connected(address: str | None) -> Iterator[ModuleType]:
    """Ray, initialised: the connection this process already has, else ``ray.init(address)`` (None: the
    ``RAY_ADDRESS`` cluster, else a running local one, else a new local one), shut down again on exit."""
    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    try:
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
    except (ConnectionError, ValueError) as exc:
        raise PackError(
            f"cannot connect to the Ray cluster at {address or 'the default address'} ({exc}); check "
            "--ray-address (e.g. ray://head:10001 or head:6379) and that the cluster is up"
        ) from None
    try:
        yield ray
    finally:
        ray.shutdown()


@dataclass(frozen=True)
class _Fault:
    """Test-only fault injection, shipped to every task (see ``tests/ray``); never set in normal use.

    ``crashes`` maps a shard number to how many attempts at it kill their worker process (``os._exit``)
    after writing one sample; each such attempt leaves a marker file ``{number:06d}.{attempt}`` in
    ``crash_dir``. ``delay_s``: each task sleeps this long before writing.
    """

    crash_dir: str = ""
    crashes: dict[int, int] = field(default_factory=dict)
    delay_s: float = 0.0


_test_fault: _Fault | None = None  # set by tests only


def write_in_task(
    job: ShardJob,
    dest_url: str,
    s3_config: S3Config | None,
    *,
    open_threads: int = 0,
    fault: _Fault | None = None,
) -> ShardResult:
    """Write, publish and journal one job inside a Ray worker (a pack's task, or a ``ray.data`` write
    task): into a temporary folder of this attempt's own, so a straggling earlier attempt never shares it."""
    dest = destination(dest_url, STATE_DIR, config=s3_config)
    if isinstance(dest, LocalDestination):
        _check_visible(dest, job.local_folders())
        attempt_dir = tempfile.mkdtemp(prefix=f"{job.number:06d}-", dir=dest.tmp_dir)
        staging = None
    else:
        sweep_stale()  # (those of tasks killed on this node)
        staging = StagingFolder(f"fastload-ray-{job.number:06d}-")
        attempt_dir = staging.path
    dest.tmp_dir = attempt_dir
    if fault is not None and fault.delay_s:
        time.sleep(fault.delay_s)
    advance: Advance = _ignore
    if fault is not None and fault.crashes.get(job.number):
        advance = _crash_after_one_sample(job.number, fault.crash_dir, fault.crashes[job.number])
    try:
        return publish_shard(job, dest, PackJournal(dest), on_sample=advance, open_threads=open_threads)
    finally:
        shutil.rmtree(attempt_dir, ignore_errors=True)
        if staging is not None:
            staging.close()


def _check_visible(dest: LocalDestination, folders: set[str]) -> None:
    """A local destination or source must be the same shared folder on every node."""
    for path, what in [
        (dest.tmp_dir, f"destination {dest.url}"),
        *((r, f"source {r}") for r in sorted(folders)),
    ]:
        if not os.path.isdir(path):
            raise PackError(
                f"the {what} is not visible on Ray node {socket.gethostname()}: local paths must be on a "
                "file system every node mounts at the same path (NFS, Lustre, ...); or use s3:// URLs"
            )


def _ignore(nbytes: int, files: int) -> None:
    """Progress inside a task goes nowhere; the driver counts finished shards."""


def _crash_after_one_sample(number: int, crash_dir: str, attempts: int) -> Advance:
    done = sum(1 for n in os.listdir(crash_dir) if n.startswith(f"{number:06d}."))

    def advance(nbytes: int, files: int) -> None:
        if done < attempts:
            with open(os.path.join(crash_dir, f"{number:06d}.{done}"), "w") as f:
                f.write(str(os.getpid()))
            os._exit(17)

    return advance


class RayEngine:
    """Jobs written by Ray tasks (one CPU each) on the cluster at ``address``, through
    :func:`write_in_task`; at most ``workers`` in flight if set, else two per CPU of the cluster."""

    def __init__(
        self,
        dest_url: str,
        *,
        s3_config: S3Config | None,
        workers: int | None,
        open_threads: int = 0,
        address: str | None = None,
    ) -> None:
        self.dest_url = dest_url
        self.s3_config = s3_config
        self.workers = workers
        self.open_threads = open_threads
        self.address = address

    def write(self, jobs: Iterable[ShardJob], *, advance: Advance, done: Done) -> None:
        """Submit jobs as room frees up; ``advance(payload_bytes, files)`` as each shard finishes. On a
        failure the jobs not yet started are cancelled and the error is raised."""
        waiting = iter(jobs)
        first = next(waiting, None)
        if first is None:
            return
        waiting = itertools.chain([first], waiting)
        with connected(self.address) as ray:
            task = ray.remote(_run).options(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)
            cpus = int(ray.cluster_resources().get("CPU", 1))
            limit = self.workers or max(1, IN_FLIGHT_PER_CPU * cpus)
            fault = _test_fault
            running: dict[Any, ShardJob] = {}
            try:
                while True:
                    for job in waiting:
                        ref = task.remote(job, self.dest_url, self.s3_config, self.open_threads, fault)
                        running[ref] = job
                        if len(running) >= limit:
                            break
                    if not running:
                        break
                    ready, _ = ray.wait(list(running), num_returns=1)
                    for ref in ready:
                        job = running.pop(ref)
                        result = _result(ray, ref, job.name)
                        done(job.number, result)
                        advance(result.payload_bytes, result.files)
            finally:
                for ref in running:
                    with contextlib.suppress(Exception):
                        ray.cancel(ref)


def _run(
    job: ShardJob, dest_url: str, s3_config: S3Config | None, open_threads: int, fault: _Fault | None
) -> ShardResult:
    """One Ray task."""
    return write_in_task(job, dest_url, s3_config, open_threads=open_threads, fault=fault)


def _result(ray: ModuleType, ref: Any, name: str) -> ShardResult:
    """A task's result, or its error in fastload's terms."""
    try:
        result: ShardResult = ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, (FastloadError, OSError)):
            raise cause from None
        raise PackError(
            f"writing shard {name} on Ray failed: {type(cause).__name__}: {cause}; the shards "
            "finished so far are kept: fix the cause and run the same pack with --resume"
        ) from exc
    except ray.exceptions.RayError as exc:
        raise PackError(
            f"shard {name}: its Ray task failed {MAX_RETRIES + 1} times ({type(exc).__name__}: "
            f"{exc}); the shards finished so far are kept: run the same pack with --resume"
        ) from exc
    return result
