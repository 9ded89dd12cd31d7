"""Sampling GPU utilisation and memory from NVML on a thread while a run goes on.

:class:`GpuMonitor` calls a *sampler* ``() -> (util_pct, mem_used_bytes)`` every ``1/hz`` seconds between
:meth:`~GpuMonitor.start` and :meth:`~GpuMonitor.stop` and returns a
:class:`~fastload.core.gpuutil.GpuTimeline`.
The default sampler is NVML's (``pynvml``, from ``pip install nvidia-ml-py``, imported only when a monitor
starts). No ``pynvml``, no driver or no GPU never fails a run: the timeline says "not measured" and why.
Tests inject a sampler.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from fastload.core.gpuutil import GpuSample, GpuTimeline

Sampler = Callable[[], tuple[float, int]]
DEFAULT_HZ = 25.0


class NotMeasured(Exception):
    """Why GPU utilisation cannot be sampled here (a sentence for the user)."""


def nvml_sampler(index: int = 0) -> tuple[Sampler, str, int | None]:
    """An NVML sampler for GPU ``index``, its name and total memory; :class:`NotMeasured` when NVML cannot
    be used (no ``pynvml``, no driver, no such GPU)."""
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise NotMeasured("pynvml is not installed (pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, InvalidArgument, ...
        raise NotMeasured(f"NVML: {type(exc).__name__}: {exc}") from None

    def sample() -> tuple[float, int]:
        util = pynvml.nvmlDeviceGetUtilizationRates(handle)
        return float(util.gpu), int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)

    return sample, name.decode() if isinstance(name, bytes) else str(name), total


class GpuMonitor:
    """Samples at ``hz`` (20-50 is right: NVML's utilisation is itself an average over its last 1/6-1 s)
    on a daemon thread. ``sampler`` replaces NVML (tests; other accelerators); ``index`` picks the GPU."""

    def __init__(
        self,
        *,
        hz: float = DEFAULT_HZ,
        index: int = 0,
        sampler: Sampler | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not 0 < hz <= 1000:
            raise ValueError(f"{hz=} must be in (0, 1000]; 20-50 is usual")
        self.hz = hz
        self.index = index
        self._sampler = sampler
        self._clock = clock
        self._samples: list[GpuSample] = []
        self._errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._not_measured: str | None = None
        self._device: str | None = None
        self._total: int | None = None
        self._started = 0.0

    def start(self) -> GpuMonitor:
        if self._thread is not None:
            return self
        sampler = self._sampler
        if sampler is None:
            try:
                sampler, self._device, self._total = nvml_sampler(self.index)
            except NotMeasured as exc:
                self._not_measured = str(exc)
                return self
        self._samples, self._errors = [], 0
        self._stop.clear()
        self._started = self._clock()
        self._thread = threading.Thread(
            target=self._run, args=(sampler,), name="fastload-gpumon", daemon=True
        )
        self._thread.start()
        return self

    def _run(self, sampler: Sampler) -> None:
        period = 1.0 / self.hz
        while True:
            try:
                util, used = sampler()
                self._samples.append(GpuSample(self._clock() - self._started, util, used))
            except Exception:  # one failed reading (GPU busy resetting, ...) must not end the run
                self._errors += 1
            if self._stop.wait(period):
                return

    def stop(self) -> GpuTimeline:
        """Stop sampling (idempotent) and return the timeline so far."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout=5.0)
        return self.timeline()

    def timeline(self) -> GpuTimeline:
        if self._not_measured is not None:
            return GpuTimeline(not_measured=self._not_measured)
        return GpuTimeline(
            samples=tuple(self._samples),
            device=self._device,
            mem_total_bytes=self._total,
            hz=self.hz,
            errors=self._errors,
            not_measured=None if self._samples else "no samples were taken (the run was too short)",
        )

    def __enter__(self) -> GpuMonitor:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
