"""``fastload bench``: prepare the workload, measure every variant interleaved, simulate training, break
the stages down, ask :mod:`fastload.core.advice`, and assemble the report.

Order of a run: workload (generated or sampled, packed, served) -> endpoint ceiling probe and ``cat``
reference -> the measurement schedule (each repetition runs every (variant, num_workers) pair once, the
order rotated by one per repetition; medians over repetitions) -> training simulation of the headline
variants at the training ``num_workers`` -> stage breakdown -> advice.

(Over 400 lines on purpose: the run's steps share one schedule and one report in progress; each step is a
function here, and the measuring, the stages and the advice live in their own modules.)
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastload.bench import ceiling, stages, variants
from fastload.bench.measure import Run, consume
from fastload.bench.options import BenchOptions
from fastload.bench.pipeline import Decode
from fastload.bench.steps import busy_step, default_device, model_step, sleep_step
from fastload.bench.workload import BUCKET, Endpoint, Workload, prepare
from fastload.core.advice import Advice, Facts, advise
from fastload.core.gpuutil import GpuTimeline
from fastload.train.gpumon import GpuMonitor


@dataclass
class BenchReport:
    """Everything one run measured; :mod:`fastload.bench.report` turns it into a table, JSON and a plot."""

    options: BenchOptions
    workload: dict[str, Any]
    machine: dict[str, Any]
    variants: list[dict[str, Any]] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    training: list[Run] = field(default_factory=list)
    step: dict[str, Any] = field(default_factory=dict)
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    endpoint: dict[str, Any] = field(default_factory=dict)
    reference: dict[str, Any] = field(default_factory=dict)
    advice: dict[str, Advice] = field(default_factory=dict)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    # -- summaries -----------------------------------------------------------------------------------------

    def by_workers(self, variant: str) -> dict[int, list[Run]]:
        out: dict[int, list[Run]] = {}
        for r in self.runs:
            if r.variant == variant and r.error is None:
                out.setdefault(r.workers, []).append(r)
        return dict(sorted(out.items()))

    def median_rate(self, variant: str, workers: int | None = None) -> float | None:
        """Median samples/s of ``variant`` at ``workers`` (None: at its best num_workers)."""
        table = {
            w: statistics.median(r.samples_per_s for r in runs)
            for w, runs in self.by_workers(variant).items()
        }
        if not table:
            return None
        if workers is None:
            return max(table.values())
        return table.get(workers)

    def sweep(self, variant: str) -> dict[int, float]:
        return {
            w: statistics.median(r.samples_per_s for r in runs)
            for w, runs in self.by_workers(variant).items()
        }


def _note(progress: Any) -> Callable[[str], None]:
    def note(text: str) -> None:
        if progress is not None:
            progress.write(text)
        else:
            print(text, file=sys.stderr)

    return note


def _step(options: BenchOptions) -> tuple[Callable[[dict[str, Any]], None], dict[str, Any]]:
    if options.model:
        device = options.device or default_device()
        return model_step(device), {"kind": "model", "device": device, "model": "3-layer CNN, SGD"}
    step_s = options.step_ms / 1000
    if options.step_mode == "busy":
        return busy_step(step_s), {"kind": "busy", "step_ms": options.step_ms}
    return sleep_step(step_s), {"kind": "sleep", "step_ms": options.step_ms}


def _monitor(step: dict[str, Any]) -> GpuMonitor | str | None:
    """For a model step: an NVML monitor on its CUDA device (it says "not measured" where NVML cannot be
    used), or why there is nothing to measure. None without a model."""
    device = str(step.get("device") or "")
    if step.get("kind") != "model":
        return None
    if not device.startswith("cuda"):
        return f"the model step runs on {device}, not a CUDA GPU"
    index = device.partition(":")[2]
    return GpuMonitor(index=int(index) if index.isdigit() else 0, clock=time.monotonic)


def _schedule(
    chosen: list[variants.Variant], options: BenchOptions
) -> list[tuple[int, variants.Variant, int]]:
    pairs = [(v, w) for v in chosen for w in (options.workers or ()) if v.sweep]
    pairs += [(v, options.num_workers or 0) for v in chosen if not v.sweep]
    out = []
    for rep in range(options.reps or 1):
        shift = rep % len(pairs) if pairs else 0
        out += [(rep, v, w) for v, w in pairs[shift:] + pairs[:shift]]
    return out


def _measure(
    variant: variants.Variant, workers: int, rep: int, options: BenchOptions, *, keep_keys: bool
) -> Run:
    run = Run(variant.name, workers, rep)
    try:
        if variant.prepare is not None:
            variant.prepare()
        budget = options.budget_s or 0.5
        with warnings.catch_warnings():
            # a sweep past the core count is the point; torch's advice against it is not news here
            warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
            loader = variant.make(workers)
            consume(
                loader,
                run,
                budget_s=budget,
                keep_keys=keep_keys,
                max_s=budget * 8 + 5,
            )
    except Exception as exc:  # one broken variant must not lose the others' figures
        run.error = f"{type(exc).__name__}: {exc}"
    return run


def _probe(work: Workload, options: BenchOptions, report: BenchReport) -> None:
    seconds = max(0.1, min(2.0, options.budget_s or 0.5))
    small = [f"files/{rel}" for s in (work.samples or [])[:512] for _, rel in s.members]
    big: list[str] = []
    if work.packed_local:
        from fastload.storage.manifest import load_index

        big = [f"packed/{s.name}" for s in load_index(work.packed_local).shards]
    assert work.endpoint is not None and work.serve_root is not None
    emulated = work.endpoint
    raw = Endpoint(work.serve_root, latency_s=0.0, conn_bytes_per_s=None)
    try:
        for label, endpoint in (("raw", raw), ("emulated", emulated)):
            figures: dict[str, Any] = {}
            for kind, keys in (("small_objects", small), ("shards", big)):
                if keys:
                    figures[kind] = ceiling.probe_endpoint(
                        endpoint.endpoint_url, BUCKET, keys, connections=16, seconds=seconds
                    )
            report.endpoint[label] = figures
    finally:
        raw.close()
    report.endpoint["latency_ms"] = options.latency_ms
    report.endpoint["conn_mbps"] = options.conn_mbps


def _reference(work: Workload, report: BenchReport) -> None:
    if work.files_local and work.samples:
        paths = [os.path.join(work.files_local, rel) for s in work.samples for _, rel in s.members]
        report.reference["cat_files"] = ceiling.cat_files(paths)
    if work.packed_local:
        from fastload.storage.manifest import load_index

        shards = [os.path.join(work.packed_local, s.name) for s in load_index(work.packed_local).shards]
        report.reference["cat_shards"] = ceiling.cat_files(shards)


def _stages(
    work: Workload, chosen: list[variants.Variant], options: BenchOptions, report: BenchReport
) -> None:
    transform = Decode(options.image_px, work.classes)
    device = options.device or (default_device() if options.model else None)
    count = options.stage_samples or 256
    bs = options.batch_size
    for v in chosen:
        if v.tool == "per-file" and work.samples is not None:
            root = {"local": work.files_local, "s3": work.files_s3, "s3-user": work.user_files_s3}[v.where]
            config = work.user_config if v.where == "s3-user" else work.s3_config
            if root:
                report.stages[v.name] = stages.per_file(
                    work.samples,
                    root,
                    config=config,
                    count=count,
                    transform=transform,
                    batch=bs,
                    device=device,
                )
        elif v.tool == "fastload" and v.name in ("fastload local", "fastload s3"):
            url = work.packed_local if v.where == "local" else work.packed_s3
            config = None if v.where == "local" else work.s3_config
            if url:
                result = stages.packed(
                    url, config=config, count=count, transform=transform, batch=bs, device=device
                )
                if result is not None:
                    report.stages[v.name] = result


def _headline(chosen: list[variants.Variant]) -> list[variants.Variant]:
    """The variants the training loop is simulated with: per-file and fastload, on S3 when there is S3."""
    names = [v.name for v in chosen]
    where = "s3" if any(n.endswith(" s3") for n in names) else "local"
    wanted = [f"per-file {where}", f"fastload {where}"]
    if "webdataset " + where in names:
        wanted.append("webdataset " + where)
    if "per-file s3 (your endpoint)" in names:
        wanted.insert(0, "per-file s3 (your endpoint)")
    return [v for v in chosen if v.name in wanted]


def _check_delivery(work: Workload, report: BenchReport) -> None:
    """One untimed epoch of the packed data through ``fastload.ShardDataset`` (no decoding): every sample of
    the index delivered exactly once, and, for data also held as files, the same bytes in total."""
    from fastload.train.dataset import ShardDataset

    for name, url, config in (
        ("fastload s3", work.packed_s3, work.s3_config),
        ("fastload local", work.packed_local, None),
    ):
        if url is None:
            continue
        try:
            dataset = ShardDataset(url, decode=False, s3_config=config)
            keys: list[str] = []
            nbytes = 0
            for sample in dataset:
                keys.append(sample["__key__"])
                nbytes += sum(
                    len(v) for k, v in sample.items() if not k.startswith("__") and isinstance(v, bytes)
                )
            expected = dataset.index.samples
            check: dict[str, Any] = {
                "expected": expected,
                "delivered": len(keys),
                "unique": len(set(keys)),
                "bytes": nbytes,
                "expected_bytes": work.file_bytes if work.samples is not None else None,
            }
            why = []
            if len(keys) != expected:
                why.append(f"{len(keys) - expected:+,} samples against the index")
            if len(set(keys)) != len(keys):
                why.append(f"{len(keys) - len(set(keys)):,} delivered twice")
            if check["expected_bytes"] is not None and nbytes != check["expected_bytes"]:
                why.append(f"{nbytes - check['expected_bytes']:+,} bytes against the files")
            check["ok"] = not why
            check["why"] = "; ".join(why)
        except Exception as exc:
            check = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        report.checks[name] = check
        return


def _advice(work: Workload, report: BenchReport, options: BenchOptions) -> None:
    cores = os.cpu_count() or 1
    for run in report.training:
        tool_where = run.variant
        stage = report.stages.get(tool_where, {}).get("stages")
        per_file = tool_where.startswith("per-file")
        where = tool_where.split(" ", 1)[1]
        packed_rate = report.median_rate(f"fastload {where.split(' ')[0]}")
        own_rate = report.median_rate(tool_where)
        ratio = packed_rate / own_rate if per_file and packed_rate and own_rate else None
        prefetch_gain = cache_gain = None
        if tool_where == "fastload s3":
            on = report.median_rate("fastload s3", options.num_workers)
            off = report.median_rate("fastload s3 prefetch off", options.num_workers)
            prefetch_gain = on / off if on and off else None
            cold = report.median_rate("fastload s3 cache cold", options.num_workers)
            warm = report.median_rate("fastload s3 cache warm", options.num_workers)
            cache_gain = warm / cold if warm and cold else None
        facts = Facts(
            batch_size=options.batch_size,
            num_workers=run.workers,
            wait_share=min(1.0, max(0.0, run.wait_share)),
            step_s=statistics.median(run.computes[1:] or run.computes or [0.0]),
            cores=cores,
            throughput_by_workers=report.sweep(tool_where),
            stages=stage,
            remote="s3" in where,
            files=work.file_count if per_file else None,
            file_bytes_mean=work.file_bytes_mean if per_file else None,
            packed_vs_per_file=ratio,
            prefetch_gain=prefetch_gain,
            cache_gain=cache_gain,
            gpu_util_pct=tuple(run.gpu.utils) if run.gpu is not None and run.gpu.measured else None,
            gpu_not_measured=None if run.gpu is None or run.gpu.measured else run.gpu.not_measured,
        )
        report.advice[tool_where] = advise(facts)


def machine() -> dict[str, Any]:
    """CPU model, cores, RAM, OS and the versions that matter."""
    import importlib.metadata
    import platform

    import torch

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ram = None
    with contextlib.suppress(ValueError, OSError, AttributeError):
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    versions: dict[str, str | None] = {}
    for dist in ("fastload", "torch", "pillow", "numpy", "boto3", "webdataset", "matplotlib"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    load = None
    with contextlib.suppress(OSError):
        load = [round(x, 2) for x in os.getloadavg()]
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_bytes": ram,
        "os": platform.platform(),
        "python": platform.python_version(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "versions": versions,
        "load_average_before": load,
    }


def run_bench(options: BenchOptions) -> BenchReport:
    """Run ``fastload bench`` with ``options`` and return the :class:`BenchReport`."""
    from tqdm import tqdm

    options = options.resolved()
    show = sys.stderr.isatty() if options.progress is None else options.progress
    began = time.perf_counter()
    note = _note(None)
    if not show:

        def note(text: str) -> None:
            pass

    work = prepare(options, note)
    report = BenchReport(options=options, workload=work.describe(), machine=machine())
    report.timings["prepare_s"] = time.perf_counter() - began
    try:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="fastload-bench-cache-") as scratch:
            chosen = variants.build(work, options, scratch=scratch)
            report.variants = [
                {"name": v.name, "tool": v.tool, "where": v.where, "sweep": v.sweep, "note": v.note}
                for v in chosen
            ]
            report.notes += variants.not_measured(work, options, chosen)
            t = time.perf_counter()
            if work.endpoint is not None and work.serve_root is not None:
                _probe(work, options, report)
            _reference(work, report)
            report.timings["reference_s"] = time.perf_counter() - t
            schedule = _schedule(chosen, options)
            step, report.step = _step(options)
            headline = _headline(chosen)
            t = time.perf_counter()
            with tqdm(
                total=len(schedule) + len(headline),
                desc="fastload bench",
                unit="run",
                disable=not show,
                file=sys.stderr,
                dynamic_ncols=True,
            ) as bar:
                for rep, variant, workers in schedule:
                    bar.set_postfix_str(f"{variant.name}, num_workers={workers}", refresh=False)
                    keep = variant.tool == "fastload" and rep == 0
                    report.runs.append(_measure(variant, workers, rep, options, keep_keys=keep))
                    bar.update()
                report.timings["sweep_s"] = time.perf_counter() - t
                t = time.perf_counter()
                for variant in headline:
                    bar.set_postfix_str(f"training loop: {variant.name}", refresh=False)
                    run = Run(variant.name, options.num_workers or 0, 0)
                    monitor = _monitor(report.step)
                    try:
                        loader = variant.make(options.num_workers or 0)
                        if isinstance(monitor, GpuMonitor):
                            monitor.start()
                        consume(
                            loader,
                            run,
                            budget_s=options.train_s or 2.0,
                            step=step,
                            max_s=(options.train_s or 2.0) * 4 + 5,
                        )
                        stats = getattr(loader, "stats", None)  # fastload.loader's own wait accounting
                        if stats is not None and hasattr(stats, "as_dict"):
                            run.loader_stats = stats.as_dict()
                    except Exception as exc:
                        run.error = f"{type(exc).__name__}: {exc}"
                    finally:
                        if isinstance(monitor, GpuMonitor):
                            run.gpu = monitor.stop()
                        elif monitor is not None:
                            run.gpu = GpuTimeline(not_measured=monitor)
                    report.training.append(run)
                    bar.update()
                report.timings["training_s"] = time.perf_counter() - t
            t = time.perf_counter()
            _stages(work, chosen, options, report)
            report.timings["stages_s"] = time.perf_counter() - t
            t = time.perf_counter()
            _check_delivery(work, report)
            report.timings["check_s"] = time.perf_counter() - t
        _advice(work, report, options)
    finally:
        if work.endpoint is not None:
            report.endpoint["server_cpu_s"] = work.endpoint.cpu_s()
        work.close()
    report.timings["total_s"] = time.perf_counter() - began
    return report
