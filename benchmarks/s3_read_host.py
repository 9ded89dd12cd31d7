"""The machine ``benchmarks/s3_read.py`` runs on: what it is (CPU, OS, packages, Ceph, fastload's commit) and
what its processes spent (CPU seconds from ``/proc``)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Sequence
from typing import Any

from s3_read_core import GIB, ROOT


def proc_cpu_s(pids: Sequence[int]) -> float | None:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += int(fields[11]) + int(fields[12])  # utime, stime of every thread
    return total / ticks


def machine_busy_s() -> float | None:
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    # user, nice, system, irq, softirq: not idle, iowait or steal (another VM's time)
    busy = values[0] + values[1] + values[2] + sum(values[5:7])
    return busy / os.sysconf("SC_CLK_TCK")


def cpu_delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def _first_line(cmd: Sequence[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0] if out else ""


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "load_avg_at_start": os.getloadavg(),
    }
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            models = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        info["cpu_model"] = models[0] if models else platform.processor()
        with open("/proc/meminfo") as f:
            mem = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in f}
        info["ram_bytes"] = mem["MemTotal"]
    info["packages"] = {}
    for name in (
        "fastload",
        "boto3",
        "botocore",
        "s3transfer",
        "s3torchconnector",
        "s3torchconnectorclient",
        "torch",
    ):
        try:
            info["packages"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info["packages"][name] = None
    info["ceph"] = _first_line(["radosgw", "--version"])
    commit = _first_line(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    if commit:
        dirty = _first_line(["git", "-C", str(ROOT), "status", "--porcelain", "--", "fastload"])
        info["fastload_git"] = {"commit": commit, "uncommitted_changes_in_fastload": bool(dirty)}
    return info


def describe(info: dict[str, Any]) -> str:
    cpu = f"{info.get('cpu_model')}, {info['cpus_usable']} usable of {info['cpu_count']} cores"
    if info.get("ram_bytes"):
        cpu += f", {info['ram_bytes'] / GIB:.0f} GiB RAM"
    packages = ", ".join(f"{k} {v}" for k, v in info["packages"].items())
    git = info.get("fastload_git")
    where = ""
    if git:
        where = f"fastload git {git['commit'][:10]}"
        if git["uncommitted_changes_in_fastload"]:
            where += " + uncommitted changes"
    return "; ".join(x for x in (cpu, info["os"], info["python"], packages, str(info["ceph"]), where) if x)
