"""``fastload.loader``: a DataLoader with sensible defaults, an optional device prefetcher, and a record of
how long the training loop waited for data.

The device prefetcher (:mod:`fastload.train.device`) copies the next batch to the GPU on a side CUDA
stream while the current step runs. Resume stays exact: :meth:`Loader.state_dict` describes the batches
handed to the training loop, not the one the prefetcher holds ahead. ``loader.report()`` adds the loop's
wait, step and copy times to the workers' stage times (:mod:`fastload.train.telemetry`).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils.data

from fastload.core.gpuutil import GpuTimeline
from fastload.core.telemetry import merge
from fastload.errors import ConfigError
from fastload.train.autotune import AutotuneConfig
from fastload.train.device import DevicePrefetcher, timed_copy
from fastload.train.device import to_device as to_device  # (where it always was)
from fastload.train.gpumon import GpuMonitor
from fastload.train.publish import Publisher
from fastload.train.telemetry import Tally
from fastload.train.telemetry import report as telemetry_report


def default_workers(cores: int | None = None) -> int:
    """DataLoader workers for this machine: one core left for the training process, between 2 and 8."""
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cores = os.cpu_count() or 1
    return 0 if cores < 2 else min(8, max(2, cores - 1))


def _first(fn: Callable[[Any], Any] | None) -> Callable[[Any], Any] | None:
    """``fn`` applied to the batch of a ``(batch, state)`` pair."""
    if fn is None:
        return None
    return lambda pair: (fn(pair[0]), pair[1])


@dataclass
class LoaderStats:
    """Where the training loop's time went, as seen from the loop: waiting inside ``next(loader)`` for a
    batch (``wait_s``), or in its own step between batches (``step_s``)."""

    batches: int = 0
    wait_s: float = 0.0
    step_s: float = 0.0
    first_batch_s: float | None = None
    recent_waits_s: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    gpu: GpuTimeline | None = None  # with monitor_gpu: NVML utilisation over the last pass, or why not

    @property
    def wait_share(self) -> float:
        """Share of the loop's wall time spent waiting for data (0 = never waits)."""
        total = self.wait_s + self.step_s
        return self.wait_s / total if total > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "wait_s": self.wait_s,
            "step_s": self.step_s,
            "wait_share": self.wait_share,
            "first_batch_s": self.first_batch_s,
            **({"gpu": self.gpu.as_dict()} if self.gpu is not None else {}),
        }

    def summary(self) -> str:
        text = (
            f"{self.batches} batches; waited {self.wait_s:.2f}s for data, {self.step_s:.2f}s in steps "
            f"({100 * self.wait_share:.0f}% waiting); first batch after {self.first_batch_s or 0:.2f}s"
        )
        return text if self.gpu is None else f"{text}; {self.gpu.summary()}"


class Loader:
    """Iterable over batches: a DataLoader, optionally moved to a device ahead of time, with wait accounting
    in :attr:`stats`. ``state_dict``/``load_state_dict``/``set_epoch`` work as on :class:`fastload.DataLoader`
    (when the underlying loader has them) and count only batches already handed to the loop."""

    def __init__(
        self,
        dataloader: Iterable[Any],
        *,
        device: str | torch.device | None = None,
        non_blocking: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        monitor_gpu: bool | GpuMonitor = False,
        on_device: Callable[[Any], Any] | None = None,
        telemetry: Any = None,
        telemetry_every: int | None = None,
    ) -> None:
        self.dataloader = dataloader
        self.device = None if device is None else checked_device(device)
        self.non_blocking = non_blocking
        if monitor_gpu is True:
            index = self.device.index if self.device is not None and self.device.type == "cuda" else None
            monitor_gpu = GpuMonitor(index=index or 0)
        self.monitor = monitor_gpu or None
        self.on_device = on_device
        self.stats = LoaderStats()
        self._clock = clock
        self._state: dict[str, Any] | None = None
        self._tally = Tally()  # the loop's wait, step and host-to-device copy
        self.publisher = Publisher.of(self, telemetry, telemetry_every)

    def telemetry_vector(self) -> list[int]:
        """The loop's own counters plus its loader's (workers included) as one
        :mod:`fastload.core.telemetry` vector."""
        own = self._tally.peek()
        inner = getattr(self.dataloader, "telemetry_vector", None)
        if inner is None:  # a torch DataLoader over a fastload dataset: the dataset's block
            inner = getattr(self.dataset, "telemetry_vector", None)
        return own if inner is None else merge(own, inner())

    def report(self) -> dict[str, Any]:
        """Per-stage telemetry of the whole pipeline (see :func:`fastload.core.telemetry.summary`) with
        ``loop``: :attr:`stats` as a dict, and the last straggler finding across ranks (``telemetry_every``).
        """
        extra: dict[str, Any] = {"loop": self.stats.as_dict()}
        if self.publisher is not None:
            extra["stragglers"] = self.publisher.stragglers
        tuner = getattr(self.dataloader, "tuner", None)
        if tuner is not None:
            extra["autotune"] = tuner.report()
        return telemetry_report(self.telemetry_vector(), **extra)

    @property
    def dataset(self) -> Any:
        return getattr(self.dataloader, "dataset", None)

    def __len__(self) -> int:
        return len(self.dataloader)  # type: ignore[arg-type]

    @property
    def skipped(self) -> int:
        """Samples left out with ``on_error="skip"`` so far (0 for loaders that cannot skip)."""
        return int(getattr(self.dataloader, "skipped", 0))

    def set_epoch(self, epoch: int) -> None:
        own = getattr(self.dataloader, "set_epoch", None)
        if own is not None:  # fastload.DataLoader keeps track of its epochs
            own(epoch)
            return
        dataset = self.dataset
        if dataset is None or not hasattr(dataset, "set_epoch"):
            raise ConfigError("set_epoch needs a dataset with set_epoch (e.g. fastload.ShardDataset)")
        dataset.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed to the training loop."""
        if self._state is not None:
            return dict(self._state)
        return self._loader_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load = getattr(self.dataloader, "load_state_dict", None)
        if load is None:
            raise ConfigError("this loader cannot resume: build it from a fastload.ShardDataset")
        load(state)
        self._state = None

    def _loader_state(self) -> dict[str, Any]:
        state = getattr(self.dataloader, "state_dict", None)
        if state is None:
            raise ConfigError("this loader cannot resume: build it from a fastload.ShardDataset")
        return state()  # type: ignore[no-any-return]

    def _with_state(self) -> Iterator[tuple[Any, dict[str, Any] | None]]:
        resumable = hasattr(self.dataloader, "state_dict")
        for batch in self.dataloader:
            yield batch, (self._loader_state() if resumable else None)

    def close(self) -> None:
        """Flush and close the telemetry exporters (a store's last records written; also done at exit)."""
        if self.publisher is not None:
            self.publisher.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Any]:
        if self.monitor is None:
            yield from self._timed()
            return
        self.monitor.start()
        try:
            yield from self._timed()
        finally:
            self.stats.gpu = self.monitor.stop()

    def _timed(self) -> Iterator[Any]:
        source: Iterable[tuple[Any, dict[str, Any] | None]] = self._with_state()
        tally = self._tally
        if self.device is not None:
            source = DevicePrefetcher(
                source,
                self.device,
                non_blocking=self.non_blocking,
                after=_first(self.on_device),
                copy=timed_copy(tally),
            )
        elif self.on_device is not None:
            source = ((self.on_device(batch), state) for batch, state in source)
        stats = self.stats
        clock = self._clock
        publisher = self.publisher
        started = clock()
        handed: float | None = None
        iterator = iter(source)
        while True:
            asked = clock()
            if handed is not None:
                stats.step_s += asked - handed
                tally.stage("step", int(1e9 * (asked - handed)))
                if publisher is not None and stats.batches % publisher.every == 0:
                    publisher.publish(self)  # (its own time is neither step nor wait)
                    asked = clock()
            try:
                batch, state = next(iterator)
            except StopIteration:
                self._state = None
                return
            got = clock()
            stats.wait_s += got - asked
            stats.recent_waits_s.append(got - asked)
            waited = int(1e9 * (got - asked))
            tally.stage("wait", waited)
            tally.observe("wait_ns", waited)
            if stats.first_batch_s is None:
                stats.first_batch_s = got - started
            stats.batches += 1
            self._state = state
            handed = clock()
            yield batch


def checked_device(device: str | torch.device) -> torch.device:
    """``device`` as a torch device, or :class:`ConfigError` when this machine has none such (asking for
    ``"cuda"`` without CUDA otherwise fails at the first batch with torch's own message)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"device={device!r} is not a torch device ({exc}); e.g. 'cuda', 'cuda:1', 'cpu'"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device={device!r}, but this machine has no CUDA GPU torch can use (torch "
                f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); pass device=None to keep "
                "batches on the CPU, or install a CUDA build of torch on a GPU machine"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device={device!r}, but this machine has {torch.cuda.device_count()} CUDA device(s) "
                f"(cuda:0..cuda:{torch.cuda.device_count() - 1})"
            )
    return dev


def loader(
    source: Any,
    batch_size: int = 1,
    *,
    num_workers: int | None = None,
    device: str | torch.device | None = None,
    pin_memory: bool | None = None,
    prefetch_factor: int | None = None,
    persistent_workers: bool | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    drop_last: bool = False,
    non_blocking: bool = True,
    monitor_gpu: bool = False,
    telemetry: Any = None,
    telemetry_every: int | None = None,
    autotune: bool | AutotuneConfig = False,
    **dataset_kwargs: Any,
) -> Loader:
    """A ready-to-train :class:`Loader` over ``source``: a dataset folder or ``s3://`` prefix (opened as a
    :class:`~fastload.ShardDataset` with ``dataset_kwargs``), a ``ShardDataset`` or ``fastload.Mix``, or any
    torch Dataset.

    Defaults: ``num_workers`` from the cores (:func:`default_workers`), ``pin_memory`` when CUDA is
    available, ``prefetch_factor=4`` and ``persistent_workers=True`` with workers. ``device`` (e.g.
    ``"cuda"``) moves each batch there ahead of time on a side stream; None leaves batches on the CPU.
    ``monitor_gpu=True`` samples NVML utilisation while iterating (``loader.stats.gpu``; "not measured"
    without NVML or a GPU). ``decode="cuda"`` (with ``device="cuda"``) keeps images as bytes in the workers
    and decodes JPEGs in batches on the GPU after the transfer (:mod:`fastload.train.gpudecode`).
    ``loader.report()``: per-stage telemetry over the workers. ``telemetry``: where to export it (a folder
    for JSON lines, a file per rank; an ``s3://``, ``gs://`` or ``az://`` prefix for the same in a store,
    where every rank of a multi-node job can write; or exporters of :mod:`fastload.train.exporters`), every
    ``telemetry_every`` steps (default 100), which also compares the ranks' data waits and names a
    straggler (docs/observe.md). ``autotune=True`` (or a ``fastload.AutotuneConfig``): the
    ``fastload.DataLoader`` tunes its prefetch depth, fetches at once, read task size and workers as it runs
    (a ShardDataset only; docs/observe.md, "A loader that tunes itself").
    """
    from fastload.train.dataset import ShardDataset
    from fastload.train.loader import DataLoader
    from fastload.train.mix import Mix

    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be >= 1")
    if device is not None:
        device = checked_device(device)
    on_device = None
    if dataset_kwargs.get("decode") == "cuda":
        from fastload.train.gpudecode import DeviceImageDecoder

        if device is None or torch.device(device).type != "cuda":
            raise ConfigError(
                f'decode="cuda" decodes on the GPU after the transfer: it needs device="cuda" (got '
                f"device={device!r}); or leave decode at its default to decode on the CPU workers"
            )
        on_device = DeviceImageDecoder(device)
        del dataset_kwargs["decode"]
        if isinstance(source, (str, os.PathLike)):
            dataset_kwargs["images"] = False  # the workers keep images as bytes
    if isinstance(source, (str, os.PathLike)):
        dataset: Any = ShardDataset(source, **dataset_kwargs)
    else:
        if dataset_kwargs:
            raise ConfigError(
                f"{', '.join(sorted(dataset_kwargs))}: dataset options apply only when loader() opens a "
                "source itself; pass them to ShardDataset instead"
            )
        dataset = source
    workers = default_workers() if num_workers is None else num_workers
    if workers < 0:
        raise ConfigError(f"num_workers={workers} must be >= 0")
    cuda = torch.cuda.is_available()
    kwargs: dict[str, Any] = {
        "num_workers": workers,
        "pin_memory": (cuda and (device is None or torch.device(device).type == "cuda"))
        if pin_memory is None
        else pin_memory,
    }
    if workers > 0:
        kwargs["prefetch_factor"] = 4 if prefetch_factor is None else prefetch_factor
        kwargs["persistent_workers"] = True if persistent_workers is None else persistent_workers
    if isinstance(dataset, (ShardDataset, Mix)):
        dl: Iterable[Any] = DataLoader(
            dataset, batch_size, collate_fn=collate_fn, drop_last=drop_last, autotune=autotune, **kwargs
        )
    else:
        if autotune:
            raise ConfigError(
                "autotune= tunes a fastload.ShardDataset's reads (through fastload.DataLoader); this "
                f"source is a {type(dataset).__name__}: leave autotune off"
            )
        dl = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, collate_fn=collate_fn, drop_last=drop_last, **kwargs
        )
    return Loader(
        dl,
        device=device,
        non_blocking=non_blocking,
        monitor_gpu=monitor_gpu,
        on_device=on_device,
        telemetry=telemetry,
        telemetry_every=telemetry_every,
    )
