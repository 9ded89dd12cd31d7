"""``fastload top http://HOST:PORT/metrics[,...]``: each rank's row rebuilt from the Prometheus endpoints of
:class:`fastload.train.exporters.Prometheus` (one per rank, or several ranks behind one), from the gauges
:func:`fastload.train.exporters.metrics` names: step, samples/s, wait share, the slowest stage (of the
stage seconds since the last refresh; the run's, at the first), S3 requests, errors and 503s, stragglers.

A gauge carries no more than its value, so three things of a JSON record are missing: the first-byte p50
(``-``), a straggler's cause (it is in the rank's log), and the record's time (``age`` here counts from
when top first saw the rank at its step). ``--plot`` needs the history only JSON lines keep.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from fastload.config import S3Config
from fastload.errors import ConfigError, FastloadError, SourceError

_LINE = re.compile(r"^fastload_([A-Za-z0-9_]+)\{([^}]*)\}\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
LOOP_STAGES = ("wait", "step", "h2d")  # the loop's own: not a data stage (core.telemetry.summary)
COUNTERS = ("s3_requests", "s3_retries", "s3_failures", "s3_throttles")


def is_endpoints(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def parse(text: str) -> dict[int, dict[str, Any]]:
    """``{rank: {metric: value, "stage_seconds_total": {stage: value}}}`` of the fastload gauges of a page."""
    out: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        labels = dict(_LABEL.findall(m.group(2)))
        try:
            rank, value = int(labels["rank"]), float(m.group(3))
        except (KeyError, ValueError):
            continue
        mine = out.setdefault(rank, {})
        if "stage" in labels:
            mine.setdefault(m.group(1), {})[labels["stage"]] = value
        else:
            mine[m.group(1)] = value
    return out


class Endpoints:
    """The endpoints of ``source`` (comma-separated), read at each :meth:`read`; what a rank's last read
    showed is kept for the next (the stage seconds between them, and when its step last changed)."""

    def __init__(self, source: str, *, config: S3Config) -> None:
        self.urls = [u.strip() for u in source.split(",") if u.strip()]
        bad = [u for u in self.urls if not is_endpoints(u)]
        if bad:
            raise ConfigError(f"{bad[0]!r}: give Prometheus endpoints as http://HOST:PORT/metrics[,...]")
        self.config = dataclasses.replace(config, deadline_s=min(config.deadline_s, 10.0))
        self._last: dict[int, tuple[dict[str, Any], float]] = {}  # rank: (its gauges, when its step was new)

    def read(self) -> dict[int, list[dict[str, Any]]]:
        from fastload.s3.httpstore import get_document

        now = time.time()
        ranks: dict[int, dict[str, Any]] = {}
        for url in self.urls:
            try:
                body, _headers = get_document(url, self.config, dict(self.config.headers))
            except (FastloadError, OSError) as exc:
                reason = str(getattr(exc, "last_error", None) or exc).split(";")[0]
                raise SourceError(
                    f"cannot read {url} ({reason}); check that the rank's fastload.train.exporters."
                    "Prometheus(port=...) serves there and that this machine reaches it",
                    path=url,
                ) from None
            found = parse(body.decode("utf-8", errors="replace"))
            if not found:
                raise ConfigError(
                    f"{url} serves no fastload gauges (fastload_step{{rank=...}}); give the endpoints of "
                    "fastload.train.exporters.Prometheus(port=...), as http://HOST:PORT/metrics"
                )
            ranks.update(found)
        out = {}
        for rank, gauges in sorted(ranks.items()):
            before, since = self._last.get(rank, ({}, now))
            if gauges.get("step") != before.get("step"):
                since = now
            self._last[rank] = (gauges, since)
            out[rank] = [record(rank, gauges, before, since)]
        return out


def record(rank: int, gauges: dict[str, Any], before: dict[str, Any], at: float) -> dict[str, Any]:
    """A JSON record's fields that ``fastload top``'s table shows, from one rank's gauges (and the previous
    read's, ``before``, for the slowest stage since then)."""
    stages = gauges.get("stage_seconds_total", {})
    earlier = before.get("stage_seconds_total", {})
    data = {s: v - earlier.get(s, 0.0) for s, v in stages.items() if s not in LOOP_STAGES}
    if not any(v > 0 for v in data.values()):  # nothing new since the last read: the run's
        data = {s: v for s, v in stages.items() if s not in LOOP_STAGES}
    slowest = max(data, key=lambda s: data[s]) if any(v > 0 for v in data.values()) else None
    counters = {name: int(gauges.get(f"{name}_total", 0)) for name in COUNTERS}
    stragglers = []
    if gauges.get("straggler"):
        stragglers.append({"rank": rank, "cause": "its cause is in the rank's log (a gauge carries none)"})
    return {
        "time": at,
        "rank": rank,
        "step": int(gauges.get("step", 0)),
        "samples_per_s": gauges.get("samples_per_second", 0.0),
        "wait_share": gauges.get("wait_share", 0.0),
        "slowest_stage": slowest,
        "total": {"counters": counters, "latency": {}},
        "stragglers": stragglers,
    }
