"""``fastload bench``: is the training loop waiting for data, and what would fix it.

Modules: ``options`` (BenchOptions, profiles), ``synth`` (the generated JPEG dataset), ``workload`` (what
is measured, the embedded endpoint process), ``pipeline`` (decode and collate shared by all variants),
``variants`` (per-file, fastload, webdataset loaders), ``measure`` (the consumer loop), ``steps`` (the
simulated training step), ``stages`` (per-stage timing), ``ceiling`` (endpoint and ``cat`` references),
``runner`` (the run), ``report`` (table, JSON), ``plot`` (PNG), ``args`` (the command line).

May import every package (``train``, ``packing``, ``formats``, ``storage``, ``s3``, ``testing``, ``core``) and
the base modules; nothing imports it but the CLI.

    from fastload.bench import BenchOptions, run_bench
    report = run_bench(BenchOptions(profile="quick"))

Heavy modules load on first use, so importing this package is cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BenchOptions", "BenchReport", "run_bench"]


def __getattr__(name: str) -> Any:
    if name == "BenchOptions":
        from fastload.bench.options import BenchOptions

        return BenchOptions
    if name in ("BenchReport", "run_bench"):
        from fastload.bench import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'fastload.bench' has no attribute {name!r}")
