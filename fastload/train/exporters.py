"""Where loader telemetry records go (:class:`~fastload.train.publish.Publisher`): JSON lines (the default,
a file per rank, what ``fastload top`` reads), Prometheus (a textfile for node_exporter and/or an HTTP
endpoint), TensorBoard scalars, OpenTelemetry metrics. Each is one small adapter; the last three need
their package (``pip install 'fastload[telemetry]'``) and say so when it is missing.

Every adapter exports the same metrics (:func:`metrics`): per rank, samples/s, wait share, the window's
data wait, each stage's seconds (cumulative), S3 requests/bytes/errors/throttles, and 1 for a straggler.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from fastload.core.telemetry import STAGES
from fastload.errors import ConfigError


class Exporter(Protocol):
    def export(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def metrics(record: dict[str, Any]) -> Iterator[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` for each metric of one record (labels always include ``rank``)."""
    rank = {"rank": str(record["rank"])}
    yield "samples_per_second", rank, float(record["samples_per_s"])
    yield "wait_share", rank, float(record["wait_share"])
    yield "wait_seconds_window", rank, float(record["wait_s"])
    yield "step", rank, float(record["step"])
    total = record["total"]
    for stage in STAGES:
        yield "stage_seconds_total", {**rank, "stage": stage}, float(total["stages"][stage]["s"])
    c = total["counters"]
    for name in ("s3_requests", "s3_bytes", "s3_retries", "s3_throttles", "s3_failures", "cache_hits"):
        yield f"{name}_total", rank, float(c[name])
    straggling = any(s["rank"] == record["rank"] for s in record["stragglers"])
    yield "straggler", rank, 1.0 if straggling else 0.0


def _need(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"this telemetry exporter needs the {module.split('.')[0]!r} package: "
            f"pip install 'fastload[{extra}]'"
        ) from None


class JsonLines:
    """One JSON line per record appended to ``folder/telemetry-rank{R}.jsonl`` (opened for each record:
    records are steps apart, and a reader such as ``fastload top`` sees each whole line at once)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)

    def path(self, rank: int) -> Path:
        return self.folder / f"telemetry-rank{rank}.jsonl"

    def export(self, record: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.path(record["rank"]), "a", encoding="utf-8") as f:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        pass


class Prometheus:
    """Gauges named ``fastload_<metric>`` in their own registry: written to ``textfile`` after each record
    (node_exporter's textfile collector; written whole, then renamed) and/or served on ``port``."""

    def __init__(
        self,
        *,
        textfile: str | os.PathLike[str] | None = None,
        port: int | None = None,
        addr: str = "0.0.0.0",
    ) -> None:
        client = _need("prometheus_client", "telemetry")
        self._client = client
        self.registry = client.CollectorRegistry()
        self.textfile = None if textfile is None else os.fspath(textfile)
        self._gauges: dict[str, Any] = {}
        self.server: Any = None
        if port is not None:
            self.server = client.start_http_server(port, addr=addr, registry=self.registry)

    def export(self, record: dict[str, Any]) -> None:
        for name, labels, value in metrics(record):
            gauge = self._gauges.get(name)
            if gauge is None:
                gauge = self._client.Gauge(
                    f"fastload_{name}", f"fastload loader {name}", sorted(labels), registry=self.registry
                )
                self._gauges[name] = gauge
            gauge.labels(**labels).set(value)
        if self.textfile is not None:
            self._client.write_to_textfile(self.textfile, self.registry)

    def close(self) -> None:
        if self.server is not None:
            server = self.server[0] if isinstance(self.server, tuple) else self.server
            server.shutdown()
            server.server_close()
            self.server = None


class TensorBoard:
    """Scalars ``fastload/<metric>[/<stage>]`` at the loop's step, in ``log_dir`` (or into ``writer``)."""

    def __init__(self, log_dir: str | os.PathLike[str] | None = None, *, writer: Any = None) -> None:
        if writer is None:
            _need("tensorboard", "telemetry")
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(log_dir=None if log_dir is None else os.fspath(log_dir))
        self.writer = writer

    def export(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        for name, labels, value in metrics(record):
            tag = f"fastload/{name}" + (f"/{labels['stage']}" if "stage" in labels else "")
            if record["world"] > 1:
                tag += f"/rank{labels['rank']}"
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class OpenTelemetry:
    """Gauges ``fastload.<metric>`` (attributes: rank, stage) on ``meter`` (default: the global meter
    provider's meter ``fastload``); the SDK's reader/exporter decides where they go."""

    def __init__(self, meter: Any = None) -> None:
        if meter is None:
            metrics_api = _need("opentelemetry.metrics", "telemetry")
            meter = metrics_api.get_meter("fastload")
        self.meter = meter
        self._gauges: dict[str, Any] = {}

    def export(self, record: dict[str, Any]) -> None:
        for name, labels, value in metrics(record):
            gauge = self._gauges.get(name)
            if gauge is None:
                gauge = self._gauges[name] = self.meter.create_gauge(f"fastload.{name}")
            gauge.set(value, attributes=labels)

    def close(self) -> None:
        pass


def exporters_from(telemetry: Any) -> list[Exporter]:
    """The exporters ``telemetry=`` names: None (none: records are still made, stragglers still logged), a
    folder (JSON lines), an exporter, or a list of them."""
    if telemetry is None:
        return []
    if isinstance(telemetry, (str, os.PathLike)):
        return [JsonLines(telemetry)]
    if isinstance(telemetry, (list, tuple)):
        return [e for t in telemetry for e in exporters_from(t)]
    if hasattr(telemetry, "export"):
        return [telemetry]
    raise ConfigError(
        f"telemetry={telemetry!r}: pass a folder (JSON lines, a file per rank) or exporters from "
        "fastload.train.exporters (JsonLines, Prometheus, TensorBoard, OpenTelemetry)"
    )
