"""The report of a run: the terminal table, the JSON document (every figure and the machine), ratios."""

from __future__ import annotations

import statistics
from typing import Any

from fastload.bench.runner import BenchReport
from fastload.core.advice import STAGES
from fastload.core.units import format_size

JSON_VERSION = 1


def ratios(report: BenchReport) -> dict[str, float]:
    """``"A / B"`` -> best-num_workers median throughput of A over B, for fastload against each peer in the
    same place (local, s3), and fastload s3 against fastload local."""
    out: dict[str, float] = {}
    names = [v["name"] for v in report.variants]
    for where in ("local", "s3"):
        mine = report.median_rate(f"fastload {where}")
        if not mine:
            continue
        for peer in (f"per-file {where}", f"webdataset {where}", "per-file s3 (your endpoint)"):
            if peer in names and (peer.endswith(where) or where == "s3"):
                theirs = report.median_rate(peer)
                if theirs:
                    out[f"fastload {where} / {peer}"] = mine / theirs
    local, s3 = report.median_rate("fastload local"), report.median_rate("fastload s3")
    if local and s3:
        out["fastload s3 / fastload local"] = s3 / local
    return out


def _num(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def _x(r: float) -> str:
    return f"{r:.2f}x" if r < 10 else f"{r:.1f}x"


def _header(report: BenchReport) -> list[str]:
    o, w, m = report.options, report.workload, report.machine
    mean = w.get("file_bytes_mean")
    size = f" (files average {format_size(mean)})" if mean else ""
    s3 = ""
    if w.get("endpoint"):
        cap = f"{o.conn_mbps:g} MB/s per connection" if o.conn_mbps > 0 else "no bandwidth cap"
        s3 = f" · embedded S3: {o.latency_ms:g} ms first byte, {cap}"
    ram = f", {format_size(m['ram_bytes'])} RAM" if m.get("ram_bytes") else ""
    load = m.get("load_average_before")
    if w.get("image_fields", True):  # (a report from before fields were recorded: images)
        work = f"decode to {o.image_px}x{o.image_px}"
    else:
        fields = ", ".join(w.get("fields") or []) or "none"
        work = f"no image fields to decode (fields: {fields}): bytes read and counted"
    return [
        f"fastload bench: {w['label']}{size} · batch {o.batch_size} · {work}{s3}",
        f"machine: {m['cpu'] or '?'}, {m['cores']} cores{ram} · python {m['python']} · "
        f"torch {m['versions'].get('torch')}" + (f" · load {load[0]}" if load else ""),
    ]


def conclusion(report: BenchReport) -> str:
    """The run in one line (closing the table, and on the plot): packed against one request per file where
    both were measured (or fastload's best rate), and how much of the training loop waits for data."""
    names = {v["name"] for v in report.variants}
    where = "s3" if "fastload s3" in names else "local"
    parts: list[str] = []
    mine = report.median_rate(f"fastload {where}")
    theirs = report.median_rate(f"per-file {where}")
    how = "over S3" if where == "s3" else "locally"
    if mine and theirs:
        parts.append(
            f"fastload reads {_x(mine / theirs)} the samples/s of one "
            f"{'GET' if where == 's3' else 'open()'} per file {how} ({mine:,.0f} vs {theirs:,.0f}, each at "
            "its best num_workers)"
        )
    elif mine:
        sweep = report.sweep(f"fastload {where}")
        best = max(sweep, key=lambda w: sweep[w])
        parts.append(f"fastload reads {mine:,.0f} samples/s {how} (best at num_workers={best})")
    waits = {r.variant: r.wait_share for r in report.training if r.error is None and r.computes}
    if waits:
        ordered = sorted(waits, key=lambda n: (not n.startswith("fastload"), n))
        shares = ", ".join(f"{waits[n] * 100:.0f}% with {n}" for n in ordered)
        parts.append(f"the training loop waits for data {shares}")
    return "; ".join(parts) if parts else "no measurement completed"


def table(report: BenchReport) -> str:
    """The human-readable summary printed at the end of a run."""
    o = report.options
    lines = _header(report)
    sweep_workers = list(o.workers or ())
    reps = o.reps or 1
    how = f"median of {reps} interleaved repetitions" if reps > 1 else "one run each: --reps 3 for medians"
    lines += ["", f"loader alone: samples/s by num_workers ({how})"]
    head = f"{'variant':<28}" + "".join(f"{'w=' + str(w):>9}" for w in sweep_workers)
    lines.append(head + f"{'best':>9}{'MB/s':>8}{'1st batch':>11}")
    for v in report.variants:
        name = v["name"]
        sweep = report.sweep(name)
        runs = [r for rs in report.by_workers(name).values() for r in rs]
        if not sweep:
            errors = [r.error for r in report.runs if r.variant == name and r.error]
            lines.append(f"{name:<28}failed: {errors[0] if errors else 'no figures'}")
            continue
        blank = "-" if v["sweep"] else ""
        cells = "".join(f"{_num(sweep[w]) if w in sweep else blank:>9}" for w in sweep_workers)
        if not v["sweep"] and not set(sweep) & set(sweep_workers):
            name = f"{name} (w={o.num_workers})"
        best_w = max(sweep, key=lambda w: sweep[w])
        mb = statistics.median(r.mb_per_s for r in report.by_workers(v["name"])[best_w])
        first = statistics.median(r.first_batch_s for r in runs)
        lines.append(f"{name:<28}{cells}{_num(sweep[best_w]):>9}{mb:>8.1f}{first:>10.2f}s")
    rat = ratios(report)
    if rat:
        lines += [
            "",
            "ratios (each at its best num_workers): " + " · ".join(f"{k} = {_x(v)}" for k, v in rat.items()),
        ]
    lines += _reference_lines(report)
    if report.training:
        step = report.step
        what = (
            f"{step.get('model')} on {step.get('device')}"
            if step.get("kind") == "model"
            else f"{step.get('kind')} {step.get('step_ms'):g} ms per step"
        )
        lines += ["", f"training loop ({what}, num_workers={o.num_workers}):"]
        lines.append(
            f"{'variant':<28}{'batches/s':>10}{'samples/s':>10}{'MB/s':>8}{'waiting':>9}{'steps':>7}"
        )
        for r in report.training:
            if r.error:
                lines.append(f"{r.variant:<28}failed: {r.error}")
                continue
            lines.append(
                f"{r.variant:<28}{r.batches_per_s:>10.1f}{r.samples_per_s:>10,.0f}{r.mb_per_s:>8.1f}"
                f"{r.wait_share * 100:>8.0f}%{r.batches:>7}"
            )
            if r.gpu is not None:
                lines.append(f"{'':<28}{r.gpu.summary()}")
    if report.stages:
        lines += ["", "stages: µs per sample, each timed alone in one thread, no prefetch"]
        lines.append(f"{'variant':<28}" + "".join(f"{s.replace('_', '-'):>11}" for s in STAGES))
        for name, result in report.stages.items():
            st = result["stages"]
            cells = "".join(
                f"{'-' if st.seconds(s) is None else format(st.seconds(s) * 1e6, ',.0f'):>11}" for s in STAGES
            )
            lines.append(f"{name:<28}{cells}")
    for name, advice in report.advice.items():
        lines += ["", f"advice for {name} (num_workers={o.num_workers}):"]
        lines += [f"  - {line}" for line in advice.lines]
    for name, check in report.checks.items():
        if check.get("error"):
            lines += ["", f"delivery check FAILED for {name}: {check['error']}"]
            continue
        same = " (the same bytes as the files)" if check.get("expected_bytes") is not None else ""
        verdict = "ok" if check["ok"] else f"FAILED ({check.get('why') or 'see the JSON report'})"
        lines += [
            "",
            f"delivery check, {name}: {check['delivered']:,} of {check['expected']:,} samples, "
            f"{check['unique']:,} distinct, {check['bytes'] / 1e6:,.1f} MB{same}: {verdict}",
        ]
    bad: dict[tuple[int, tuple[str, ...]], list[str]] = {}  # (count, examples) -> variants
    seen: set[str] = set()
    for run in report.runs:
        if run.bad_samples and run.variant not in seen:
            seen.add(run.variant)
            bad.setdefault((run.bad_samples, tuple(run.bad)), []).append(run.variant)
    for (count, examples), names in bad.items():
        where = "every variant" if len(names) == len(report.variants) else ", ".join(names)
        lines += ["", f"{count:,} sample(s) did not decode ({where}) and were left out of the figures:"]
        lines += [f"  {e}" for e in examples]
    for note in report.notes:
        lines.append(f"note: {note}")
    lines += ["", f"conclusion: {conclusion(report)}"]
    lines.append(f"took {report.timings.get('total_s', 0):.0f} s")
    return "\n".join(lines)


def _reference_lines(report: BenchReport) -> list[str]:
    out = []
    ref = report.reference
    parts = []
    if ref.get("cat_files"):
        c = ref["cat_files"]
        parts.append(f"cat of the files {c['files_per_s']:,.0f} files/s ({c['mb_per_s']:,.0f} MB/s)")
    if ref.get("cat_shards"):
        parts.append(f"cat of the shards {ref['cat_shards']['mb_per_s']:,.0f} MB/s")
    if parts:
        out += ["", "local reference (page cache): " + " · ".join(parts)]
    for label in ("raw", "emulated"):
        figures = report.endpoint.get(label)
        if not figures:
            continue
        bits = []
        if "small_objects" in figures:
            f = figures["small_objects"]
            bits.append(f"{f['requests_per_s']:,.0f} GET/s of files")
        if "shards" in figures:
            bits.append(f"{figures['shards']['mb_per_s']:,.0f} MB/s of shards")
        what = "endpoint ceiling, no latency or cap" if label == "raw" else "endpoint as emulated"
        conns = next(iter(figures.values()))["connections"]
        out.append(f"{what} ({conns} connections, no client logic): " + ", ".join(bits))
    return out


def to_json(report: BenchReport, argv: list[str] | None = None) -> dict[str, Any]:
    """Every figure of the run, the options and the machine, as plain JSON values."""
    from dataclasses import asdict

    summary: dict[str, Any] = {}
    for v in report.variants:
        name = v["name"]
        summary[name] = {
            str(w): {
                "median_samples_per_s": round(statistics.median(r.samples_per_s for r in runs), 3),
                "min_samples_per_s": round(min(r.samples_per_s for r in runs), 3),
                "max_samples_per_s": round(max(r.samples_per_s for r in runs), 3),
                "median_mb_per_s": round(statistics.median(r.mb_per_s for r in runs), 4),
                "median_first_batch_s": round(statistics.median(r.first_batch_s for r in runs), 4),
                "reps": len(runs),
            }
            for w, runs in report.by_workers(name).items()
        }
    return {
        "version": JSON_VERSION,
        "command": argv,
        "options": asdict(report.options),
        "machine": report.machine,
        "workload": report.workload,
        "variants": report.variants,
        "summary": summary,
        "ratios": {k: round(v, 4) for k, v in ratios(report).items()},
        "runs": [r.figures() for r in report.runs],
        "training": {"step": report.step, "runs": [r.figures() for r in report.training]},
        "stages": {
            name: {"samples": res["samples"], **{f"{s}_s": res["stages"].seconds(s) for s in STAGES}}
            for name, res in report.stages.items()
        },
        "endpoint": report.endpoint,
        "reference": report.reference,
        "advice": {
            name: {
                "verdict": a.verdict,
                "wait_share": a.wait_share,
                "suggested_workers": a.suggested_workers,
                "lines": list(a.lines),
            }
            for name, a in report.advice.items()
        },
        "checks": report.checks,
        "timings_s": {k: round(v, 3) for k, v in report.timings.items()},
        "notes": report.notes,
        "conclusion": conclusion(report),
    }
