"""GPU utilisation sampling (fastload.train.gpumon) and fastload.loader(monitor_gpu=...), with a fake NVML."""

from __future__ import annotations

import itertools
import sys

import pytest

import fastload
from fastload.train.feed import Loader
from fastload.train.gpumon import GpuMonitor, NotMeasured, nvml_sampler


def fake_nvml(values: list[float]):  # type: ignore[no-untyped-def]
    """A sampler cycling through ``values`` percent, memory rising 1 MiB a reading."""
    counter = itertools.count()
    cycle = itertools.cycle(values)
    return lambda: (next(cycle), (1 << 30) + (next(counter) << 20))


def test_monitor_samples_until_stopped() -> None:
    monitor = GpuMonitor(hz=1000, sampler=fake_nvml([90.0, 0.0]))
    with monitor:
        while len(monitor._samples) < 5:
            pass
    timeline = monitor.stop()
    assert timeline.measured and len(timeline.samples) >= 5
    assert [s.util_pct for s in timeline.samples[:4]] == [90.0, 0.0, 90.0, 0.0]
    times = [s.t_s for s in timeline.samples]
    assert times == sorted(times) and timeline.samples[1].mem_used_bytes == (1 << 30) + (1 << 20)
    count = len(timeline.samples)
    assert len(monitor.stop().samples) == count  # stopped: no more readings


def test_failed_readings_are_counted_not_raised() -> None:
    calls = itertools.count()

    def flaky() -> tuple[float, int]:
        if next(calls) % 2:
            raise OSError("GPU is lost")
        return 50.0, 0

    with GpuMonitor(hz=1000, sampler=flaky) as monitor:
        while monitor._errors < 2:
            pass
    timeline = monitor.stop()
    assert timeline.errors >= 2 and all(s.util_pct == 50.0 for s in timeline.samples)


def test_no_nvml_is_not_measured_never_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as if not installed
    with pytest.raises(NotMeasured, match="pip install nvidia-ml-py"):
        nvml_sampler()
    with GpuMonitor() as monitor:
        pass
    assert "pynvml is not installed" in (monitor.stop().not_measured or "")


def test_nvml_without_a_driver_is_not_measured() -> None:
    pytest.importorskip("pynvml")
    try:
        nvml_sampler()
    except NotMeasured as exc:
        assert str(exc).startswith("NVML: ")
    else:
        pytest.skip("this machine has an NVIDIA driver")


def test_loader_monitors_while_iterating() -> None:
    monitor = GpuMonitor(hz=1000, sampler=fake_nvml([80.0]))
    loader = Loader(iter_batches(), monitor_gpu=monitor)
    assert list(loader) == [[0], [1], [2]]
    gpu = loader.stats.gpu
    assert gpu is not None and gpu.measured and gpu.utils[0] == 80.0
    assert "mean 80%" in loader.stats.summary() and loader.stats.as_dict()["gpu"]["mean_util_pct"] == 80.0
    assert monitor._thread is None  # stopped with the pass


def test_loader_stops_the_monitor_when_the_loop_breaks() -> None:
    monitor = GpuMonitor(hz=1000, sampler=fake_nvml([80.0]))
    loader = Loader(iter_batches(), monitor_gpu=monitor)
    for _ in loader:
        break
    assert monitor._thread is None and loader.stats.gpu is not None


def test_loader_monitor_gpu_true_on_this_machine_never_fails() -> None:
    loader = fastload.loader(list(range(6)), batch_size=2, num_workers=0, monitor_gpu=True)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
    gpu = loader.stats.gpu
    assert gpu is not None
    if not gpu.measured:
        assert gpu.not_measured and "not measured" in loader.stats.summary()


class iter_batches:
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter([[0], [1], [2]])


def test_bench_monitors_model_steps_on_cuda_only() -> None:
    from fastload.bench.runner import _monitor

    assert _monitor({"kind": "sleep", "step_ms": 5}) is None
    assert _monitor({"kind": "model", "device": "cpu"}) == "the model step runs on cpu, not a CUDA GPU"
    monitor = _monitor({"kind": "model", "device": "cuda:1"})
    assert isinstance(monitor, GpuMonitor) and monitor.index == 1
