"""Where loader telemetry records go (:class:`~fastload.train.publish.Publisher`): JSON lines (the default,
a log per rank in a folder or an ``s3://``/``gs://``/``az://`` prefix, what ``fastload top`` reads),
Prometheus (a textfile for node_exporter and/or an HTTP endpoint), TensorBoard scalars, OpenTelemetry
metrics. Each is one small adapter; the last three need their package (``pip install
'fastload[telemetry]'``) and say so when it is missing.

Every adapter exports the same metrics (:func:`metrics`): per rank, samples/s, wait share, the window's
data wait, each stage's seconds (cumulative), S3 requests/bytes/errors/throttles, and 1 for a straggler.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from fastload.config import S3Config
from fastload.core.telemetry import STAGES
from fastload.errors import ConfigError
from fastload.storage.objectlog import SegmentLog, is_store
from fastload.storage.urls import check_writable


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
    """One JSON line per record, a log per rank: appended to ``folder/telemetry-rank{R}.jsonl`` (opened for
    each record: records are steps apart, and a reader such as ``fastload top`` sees each whole line at
    once), or, for an ``s3://``, ``gs://`` or ``az://`` URL, written to the store as segment objects
    ``URL/telemetry-rank{R}/{seq:08d}.jsonl`` by a background thread, at most every ``interval_s``
    (:class:`~fastload.storage.objectlog.SegmentLog`: the loop never waits for the store, and a failing
    store is logged once and counted in :attr:`failures` and :attr:`dropped`, never raised). ``close()``
    writes what is left (so does the process's exit)."""

    def __init__(
        self, folder: str | os.PathLike[str], *, interval_s: float = 5.0, config: S3Config | None = None
    ) -> None:
        text = os.fspath(folder)
        check_writable(text)
        self.url = text.rstrip("/") if is_store(text) else None
        self.folder = Path(text)
        self.interval_s = interval_s
        self.config = config
        self._logs: dict[int, SegmentLog] = {}

    def path(self, rank: int) -> Path:
        return self.folder / f"telemetry-rank{rank}.jsonl"

    def export(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"))
        if self.url is not None:
            self._log(int(record["rank"])).append(line)
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.path(record["rank"]), "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def _log(self, rank: int) -> SegmentLog:
        log = self._logs.get(rank)
        if log is None:
            if self.config is None:
                self.config = S3Config.from_env()
            url = str(self.url)
            log = SegmentLog(url, f"telemetry-rank{rank}", config=self.config, interval_s=self.interval_s)
            self._logs[rank] = log
        return log

    @property
    def failures(self) -> int:
        """Failed writes to the store so far (0 for a folder)."""
        return sum(log.failures for log in self._logs.values())

    @property
    def dropped(self) -> int:
        """Records given up (the store failing for long, or not answering at close; 0 for a folder)."""
        return sum(log.dropped for log in self._logs.values())

    def close(self) -> None:
        for log in self._logs.values():
            log.close()


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
    folder or an ``s3://``, ``gs://`` or ``az://`` URL (JSON lines), an exporter, or a list of them."""
    if telemetry is None:
        return []
    if isinstance(telemetry, (str, os.PathLike)):
        return [JsonLines(telemetry)]
    if isinstance(telemetry, (list, tuple)):
        return [e for t in telemetry for e in exporters_from(t)]
    if hasattr(telemetry, "export"):
        return [telemetry]
    raise ConfigError(
        f"telemetry={telemetry!r}: pass a folder or an s3://, gs:// or az:// URL (JSON lines, a log per "
        "rank) or exporters from "
        "fastload.train.exporters (JsonLines, Prometheus, TensorBoard, OpenTelemetry)"
    )
