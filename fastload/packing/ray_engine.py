"""``fastload pack --engine ray``: the planned shards written by Ray tasks on any node of a cluster.

The driver lists and plans exactly as the local engine does (:func:`fastload.pack`), then hands each
unfinished shard's plan (its samples, whole) to a Ray task. The task writes the shard with the local
engine's own writer, publishes it under its final name and records it in the resume journal, and returns
its index entry; the driver collects the entries and writes ``index.json`` last. So the output is the local
engine's, byte for byte, and the guarantees carry over:

- a task that dies (worker crash, lost node) is retried by Ray (``max_retries``); each attempt writes to a
  temporary folder of its own, so a shard is published whole or not at all;
- a driver killed mid-run leaves the journal: ``--resume`` keeps the published shards and writes the rest.

Local sources and destinations must be on a file system that every node mounts at the same path (a task
checks and says so); ``s3://`` works from anywhere. Every node needs fastload installed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from fastload.config import PackConfig, S3Config
from fastload.core.keys import Sample
from fastload.core.plan import ShardPlan
from fastload.errors import ConfigError, FastloadError, PackError
from fastload.formats.tar.writer import ShardResult
from fastload.gcpause import gc_paused
from fastload.packing.dest import LocalDestination, destination
from fastload.packing.journal import STATE_DIR, PackJournal
from fastload.storage.inputs import Input
from fastload.storage.listing import FileEntry, LocalSource

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


@dataclass(frozen=True)
class _Columns:
    """A shard's samples as plain columns, each source once: Ray pickles these ~20x faster than the
    samples' objects (0.04 s instead of 0.7 s for 20,000 files, and as much again to unpickle)."""

    sources: list[Any]
    keys: list[str]
    counts: list[int]  # members per sample
    fields: list[str]
    source_ids: list[int]
    relpaths: list[str]
    paths: list[str]
    sizes: list[int]

    @classmethod
    def of(cls, samples: list[Sample[Input]]) -> _Columns:
        out = cls([], [], [], [], [], [], [], [])
        ids: dict[int, int] = {}
        for sample in samples:
            out.keys.append(sample.key)
            out.counts.append(len(sample.members))
            for name, item in sample.members:
                source = ids.get(id(item.source))
                if source is None:
                    source = ids[id(item.source)] = len(out.sources)
                    out.sources.append(item.source)
                out.fields.append(name)
                out.source_ids.append(source)
                out.relpaths.append(item.entry.relpath)
                out.paths.append(item.entry.path)
                out.sizes.append(item.entry.size)
        return out

    def samples(self) -> list[Sample[Input]]:
        """The samples again (entries without versions: writers do not use them)."""
        out: list[Sample[Input]] = []
        i = 0
        for key, n in zip(self.keys, self.counts, strict=True):
            out.append(
                Sample(
                    key,
                    tuple(
                        (
                            self.fields[j],
                            Input(
                                self.sources[self.source_ids[j]],
                                FileEntry(self.relpaths[j], self.paths[j], self.sizes[j], ""),
                            ),
                        )
                        for j in range(i, i + n)
                    ),
                )
            )
            i += n
        return out


def _check_visible(dest: LocalDestination, samples: list[Sample[Input]]) -> None:
    """A local destination or source must be the same shared folder on every node."""
    roots = {it.source.root for s in samples for _, it in s.members if isinstance(it.source, LocalSource)}
    for path, what in [(dest.tmp_dir, f"destination {dest.url}"), *((r, f"source {r}") for r in roots)]:
        if not os.path.isdir(path):
            raise PackError(
                f"the {what} is not visible on Ray node {socket.gethostname()}: local paths must be on a "
                "file system every node mounts at the same path (NFS, Lustre, ...); or use s3:// URLs"
            )


def _write_shard(
    shard: ShardPlan,
    samples: list[Sample[Input]],
    fields: list[str],
    config: PackConfig,
    dest_url: str,
    s3_config: S3Config | None,
    remote: bool,
    fault: _Fault | None,
) -> ShardResult:
    """Write, publish and journal one shard with the local engine's writer (the body of a Ray task)."""
    from fastload.packing.pack import _Plan, _write_all

    dest = destination(dest_url, STATE_DIR, config=s3_config)
    if isinstance(dest, LocalDestination):
        _check_visible(dest, samples)
        attempt_dir = tempfile.mkdtemp(prefix=f"{shard.number:06d}-", dir=dest.tmp_dir)
    else:
        attempt_dir = tempfile.mkdtemp(prefix=f"fastload-ray-{shard.number:06d}-")
    dest.tmp_dir = attempt_dir  # this attempt's own: a straggling earlier attempt never shares its file
    if fault is not None and fault.delay_s:
        time.sleep(fault.delay_s)
    advance: Callable[[int, int], None] = _ignore
    if fault is not None and fault.crashes.get(shard.number):
        advance = _crash_after_one_sample(shard, fault.crash_dir, fault.crashes[shard.number])
    one = replace(shard, start=0, stop=len(samples))
    plan = _Plan(samples, [one], fields, [], "", "", 0, 0)
    results: dict[int, ShardResult] = {}
    try:
        _write_all([one], plan, config, dest, PackJournal(dest), results, advance, remote=remote)
    finally:
        shutil.rmtree(attempt_dir, ignore_errors=True)
    return results[shard.number]


def _write_columns(shard: ShardPlan, columns: _Columns, *args: Any) -> ShardResult:
    """One Ray task: :func:`_write_shard` on the samples shipped as columns."""
    with gc_paused():  # many small objects, no cycles: collections would take 3/4 of the time
        samples = columns.samples()
    return _write_shard(shard, samples, *args)


def _ignore(nbytes: int, files: int) -> None:
    """Progress inside a task goes nowhere; the driver counts finished shards."""


def _crash_after_one_sample(shard: ShardPlan, crash_dir: str, attempts: int) -> Callable[[int, int], None]:
    done = sum(1 for n in os.listdir(crash_dir) if n.startswith(f"{shard.number:06d}."))

    def advance(nbytes: int, files: int) -> None:
        if done < attempts:
            with open(os.path.join(crash_dir, f"{shard.number:06d}.{done}"), "w") as f:
                f.write(str(os.getpid()))
            os._exit(17)

    return advance


def write_on_ray(
    todo: list[ShardPlan],
    samples: list[Sample[Input]],
    fields: list[str],
    config: PackConfig,
    dest_url: str,
    s3_config: S3Config | None,
    results: dict[int, ShardResult],
    advance: Callable[[int, int], None],
    *,
    remote: bool,
    address: str | None,
) -> None:
    """Write the shards ``todo`` (of the plan whose samples in write order are ``samples``) as Ray tasks,
    filling ``results`` and calling ``advance(payload_bytes, files)`` as each shard finishes.

    At most ``config.workers`` shards are in flight if set, else two per CPU of the cluster (Ray runs one
    per CPU). On a failure the shards not yet started are cancelled and the error is raised; shards
    already published stay in the journal for ``--resume``.
    """
    if not todo:
        return
    with connected(address) as ray:
        task = ray.remote(_write_columns).options(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        limit = config.workers or max(1, IN_FLIGHT_PER_CPU * cpus)
        fault = _test_fault
        waiting = iter(todo)
        running: dict[Any, ShardPlan] = {}
        try:
            while True:
                for shard in waiting:
                    ref = task.remote(
                        shard,
                        _Columns.of(samples[shard.start : shard.stop]),
                        fields,
                        config,
                        dest_url,
                        s3_config,
                        remote,
                        fault,
                    )
                    running[ref] = shard
                    if len(running) >= limit:
                        break
                if not running:
                    break
                ready, _ = ray.wait(list(running), num_returns=1)
                for ref in ready:
                    shard = running.pop(ref)
                    result = _result(ray, ref, shard)
                    results[shard.number] = result
                    advance(result.payload_bytes, result.files)
        finally:
            for ref in running:
                with contextlib.suppress(Exception):
                    ray.cancel(ref)


def _result(ray: ModuleType, ref: Any, shard: ShardPlan) -> ShardResult:
    """A task's result, or its error in fastload's terms."""
    try:
        result: ShardResult = ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, (FastloadError, OSError)):
            raise cause from None
        raise PackError(
            f"writing shard {shard.name} on Ray failed: {type(cause).__name__}: {cause}; the shards "
            "finished so far are kept: fix the cause and run the same pack with --resume"
        ) from exc
    except ray.exceptions.RayError as exc:
        raise PackError(
            f"shard {shard.name}: its Ray task failed {MAX_RETRIES + 1} times ({type(exc).__name__}: "
            f"{exc}); the shards finished so far are kept: run the same pack with --resume"
        ) from exc
    return result
