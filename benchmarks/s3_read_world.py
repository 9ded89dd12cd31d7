"""The world of ``benchmarks/s3_read.py``: Ceph RGW and the proxies in front of it (``latency_proxy.py``),
the children that run one reader once, and the uploaded objects."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from s3_read_core import (
    BUCKET,
    CHILD_TIMEOUT_S,
    GIB,
    MIB,
    REGION,
    ROOT,
    SCRIPT,
    SEED,
    SMALL_MAX_BYTES,
    SMALL_THREADS,
    Run,
    small_relpath,
    small_sizes,
)


def _load_rgw_module() -> Any:
    spec = importlib.util.spec_from_file_location("fastload_bench_rgw", ROOT / "tests" / "servers" / "rgw.py")
    if spec is None or spec.loader is None:
        raise RuntimeError("cannot load tests/servers/rgw.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _pids_with_arg(needle: str) -> list[int]:
    """PIDs of processes whose command line contains ``needle`` (the RGW scratch folder)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle.encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


class ProxyProcess:
    """``benchmarks/latency_proxy.py`` (or fastload's FaultProxy) in a child process."""

    def __init__(self, upstream: str, *args: str) -> None:
        self.argv = [
            sys.executable,
            str(Path(__file__).with_name("latency_proxy.py")),
            "--upstream",
            upstream,
            *args,
        ]
        self.proc: subprocess.Popen[str] | None = None
        self.endpoint_url = ""
        self.pid = 0

    def start(self) -> ProxyProcess:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"proxy {self.argv} exited with {self.proc.wait()}")
        info = json.loads(line)
        self.endpoint_url, self.pid = info["endpoint_url"], info["pid"]
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@dataclass
class World:
    rgw: Any
    workdir: Path
    env: dict[str, str]
    origin_pids: list[int]
    proxies: dict[str, ProxyProcess]


def child_env(access_key: str, secret_key: str, workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID=access_key,
        AWS_SECRET_ACCESS_KEY=secret_key,
        AWS_REGION=REGION,
        AWS_DEFAULT_REGION=REGION,
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(workdir / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(workdir / "no-aws-credentials"),
    )
    return env


def run_reader(world: World, reader: str, spec: dict[str, Any], *, rep: int, position: int) -> Run:
    """One reader, once, in a child process; raises with the child's stderr if it fails."""
    with tempfile.TemporaryDirectory(dir=world.workdir) as tmp:
        spec = {
            **spec,
            "reader": reader,
            "result_path": str(Path(tmp) / "result.json"),
            "origin_pids": world.origin_pids,
        }
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--child", str(spec_path)],
            env=reader_env(world, reader, spec),
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            cwd=str(ROOT),
        )
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
            raise RuntimeError(f"{reader} failed (exit {done.returncode}):\n{tail}")
        result = json.loads(Path(spec["result_path"]).read_text())
    return Run(
        rep=rep,
        position=position,
        reader=reader,
        seconds=result["seconds"],
        bytes=result["bytes"],
        objects=result["objects"],
        cpu_s=result["cpu_s"],
        proxy_cpu_s=result["proxy_cpu_s"],
        origin_cpu_s=result["origin_cpu_s"],
        machine_busy_cpu_s=result["machine_busy_cpu_s"],
        load_1min=result["load_1min"],
        verified="sha256" if spec["verify"] else "sizes",
    )


def reader_env(world: World, reader: str, spec: dict[str, Any]) -> dict[str, str]:
    """The child's environment: ``spec["pythonpath"]`` first on PYTHONPATH (``--fastload-before``), and for
    s3torchconnector the folder ``FASTLOAD_BENCH_S3TC_PATH`` names, if set."""
    env = dict(world.env)
    paths = [spec["pythonpath"]] if spec.get("pythonpath") else []
    paths += [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
    if reader == "s3torchconnector" and os.environ.get("FASTLOAD_BENCH_S3TC_PATH"):
        paths.append(os.environ["FASTLOAD_BENCH_S3TC_PATH"])
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def upload_client(world: World, **config: Any) -> Any:
    # botocore's default aws-chunked checksum trailers are not for every S3-compatible store
    return world.rgw.client(
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        **config,
    )


def make_large(world: World, total_bytes: int, object_bytes: int) -> tuple[list[list[Any]], float]:
    """Upload the large objects (random bytes, fixed seed) straight to RGW; ``[key, size, sha256]``."""
    import numpy as np

    client = upload_client(world)
    objects, began = [], time.perf_counter()
    for i, start in enumerate(range(0, total_bytes, object_bytes)):
        size = min(object_bytes, total_bytes - start)
        data = np.random.default_rng(SEED + 100 + i).bytes(size)
        key = f"large/object-{i:04d}.bin"
        client.put_object(Bucket=BUCKET, Key=key, Body=data)
        objects.append([key, size, hashlib.sha256(data).hexdigest()])
        del data
    return objects, time.perf_counter() - began


def make_small(world: World, count: int) -> dict[str, Any]:
    """Write the small objects locally, PUT each to RGW (timed), pack them, upload the shards."""
    import numpy as np

    import fastload

    src, packed = world.workdir / "small-src", world.workdir / "small-packed"
    sizes = small_sizes(count)
    pool = np.random.default_rng(SEED + 2).bytes(64 * MIB)
    offsets = np.random.default_rng(SEED + 3).integers(0, len(pool) - SMALL_MAX_BYTES, size=count)
    objects = []
    for i, size in enumerate(sizes):
        rel = small_relpath(i)
        data = pool[int(offsets[i]) : int(offsets[i]) + size]
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        objects.append([f"small/{rel}", size, hashlib.sha256(data).hexdigest()])
    client = upload_client(world, max_pool_connections=SMALL_THREADS)

    def put(obj: list[Any]) -> None:
        key = obj[0]
        client.put_object(Bucket=BUCKET, Key=key, Body=(src / key[len("small/") :]).read_bytes())

    began = time.perf_counter()
    with ThreadPoolExecutor(SMALL_THREADS) as ex:
        list(ex.map(put, objects))
    put_s = time.perf_counter() - began
    began = time.perf_counter()
    report = fastload.pack(str(src), str(packed), progress=False)
    pack_s = time.perf_counter() - began
    config = fastload.S3Config(endpoint_url=world.rgw.endpoint_url, region=REGION, addressing_style="path")
    began = time.perf_counter()
    fastload.copy(str(packed) + "/", f"s3://{BUCKET}/packed/", recursive=True, config=config)
    copy_s = time.perf_counter() - began
    shards = sorted(p.name for p in packed.iterdir() if p.suffix == ".tar")
    shutil.rmtree(src)
    return {
        "objects": objects,
        "shards": [f"packed/{name}" for name in shards],
        "shard_bytes": sum((packed / n).stat().st_size for n in shards),
        "payload_bytes": sum(sizes),
        "put_s": put_s,
        "puts_per_s": count / put_s,
        "pack_s": pack_s,
        "copy_s": copy_s,
        "pack_summary": report.summary(),
    }


@contextlib.contextmanager
def world_up(args: argparse.Namespace, data_bytes: int) -> Iterator[World]:
    rgw_module = _load_rgw_module()
    memstore = int(args.memstore_gib * GIB) if args.memstore_gib else 2 * data_bytes + GIB
    workdir = Path(tempfile.mkdtemp(prefix="fastload-s3-read-"))
    rgw = rgw_module.RadosGateway(memstore_bytes=memstore, timeout_s=150)
    proxies: dict[str, ProxyProcess] = {}
    saved_env: dict[str, str] | None = None
    try:
        began = time.perf_counter()
        rgw.start()
        print(
            f"RGW up at {rgw.endpoint_url} in {time.perf_counter() - began:.0f} s "
            f"(memstore {memstore / GIB:.1f} GiB)",
            flush=True,
        )
        direct = rgw.endpoint_url
        proxies["capped"] = ProxyProcess(
            direct, "--latency-ms", str(args.latency_ms), "--conn-mbps", str(args.conn_mbps)
        ).start()
        if args.probe != "no":
            proxies["lean"] = ProxyProcess(direct).start()
            proxies["lean-copy"] = ProxyProcess(direct, "--copy").start()
            proxies["fault"] = ProxyProcess(direct, "--faultproxy").start()
        assert rgw.root is not None
        env = child_env(rgw.access_key, rgw.secret_key, workdir)
        # this process uploads with fastload.copy, which takes credentials from the environment
        saved_env = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        world = World(
            rgw=rgw,
            workdir=workdir,
            env=env,
            origin_pids=_pids_with_arg(str(rgw.root)),
            proxies=proxies,
        )
        upload_client(world).create_bucket(Bucket=BUCKET)
        yield world
    finally:
        if saved_env is not None:
            os.environ.clear()
            os.environ.update(saved_env)
        for proxy in proxies.values():
            proxy.stop()
        rgw.stop()
        shutil.rmtree(workdir, ignore_errors=True)
