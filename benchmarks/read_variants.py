"""The read benchmark's readers, run in a child process each: build one variant, consume it, report.

A variant is (reader, mode, payload): reader ``cat``, ``decode-only``, ``fastload``, ``webdataset``,
``litdata`` or ``perfile``; mode ``inproc`` (iterate the dataset in this process) or ``nw2``
(``DataLoader(num_workers=2, batch_size=B)``; fastload through ``fastload.DataLoader``, litdata through its
``StreamingDataLoader``); payload ``raw`` (the bytes of ``jpg`` and ``cls``) or ``decode`` (the JPEG decoded
and center-cropped to a 224x224x3 uint8 tensor, the label an int; the same function for every reader).

The consumer takes each sample's key and fields, looks the key up in the manifest, checks the jpg's size
(raw) or the tensor's shape and the label (decode), and counts the manifest's payload bytes. With
``digest`` (the untimed verification pass, or ``--touch``) it also adds every sample's CRC32C over key, jpg
and cls to an order-independent sum, which the parent compares with the manifest's.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch.utils.data
from read_data import MASK64, sample_digest

CROP = 224
REGION = "us-east-1"


# ------------------------------------------------------------------------------------------ decoding


def decode_jpeg(data: bytes | memoryview) -> Any:
    """JPEG bytes -> center 224x224 RGB crop as a uint8 HWC tensor (Pillow decode)."""
    import numpy as np
    import torch
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    pixels = np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
    h, w = pixels.shape[:2]
    y, x = (h - CROP) // 2, (w - CROP) // 2
    return torch.from_numpy(np.ascontiguousarray(pixels[y : y + CROP, x : x + CROP]))


def decode_sample(sample: dict[str, Any]) -> dict[str, Any]:
    """The decode payload of one sample (keys as the readers deliver them)."""
    key = sample["__key__"] if "__key__" in sample else sample["key"]
    return {"__key__": key, "jpg": decode_jpeg(sample["jpg"]), "cls": int(sample["cls"])}


# ------------------------------------------------------------------------------------------ datasets


class PerFile(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """The naive baseline: a map-style Dataset reading each sample's two files (or two S3 objects)."""

    def __init__(self, keys: list[str], root: str, decode: bool, s3: dict[str, Any] | None) -> None:
        self.keys, self.root, self.decode, self.s3 = keys, root, decode, s3
        self._client: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.keys)

    def _get(self, name: str) -> bytes:
        if self.s3 is None:
            with open(os.path.join(self.root, name), "rb") as f:
                return f.read()
        if self._client is None or self._pid != os.getpid():  # one client per process (fork-safe)
            self._client, self._pid = _boto_client(self.s3["endpoint_url"]), os.getpid()
        response = self._client.get_object(Bucket=self.s3["bucket"], Key=f"{self.root}/{name}")
        data: bytes = response["Body"].read()
        return data

    def __getitem__(self, i: int) -> dict[str, Any]:
        key = self.keys[i]
        sample = {"__key__": key, "jpg": self._get(f"{key}.jpg"), "cls": self._get(f"{key}.cls")}
        return decode_sample(sample) if self.decode else sample


def _boto_client(endpoint_url: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=REGION,
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=4),
    )


def _webdataset_s3_opener(endpoint_url: str) -> Callable[..., Any]:
    """A ``webdataset.gopen`` handler for ``s3://``: one boto3 GET per shard, its body streamed."""
    state: dict[str, Any] = {}

    def gopen_s3(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
        if state.get("pid") != os.getpid():
            state.update(pid=os.getpid(), client=_boto_client(endpoint_url))
        bucket, key = url[len("s3://") :].split("/", 1)
        return state["client"].get_object(Bucket=bucket, Key=key)["Body"]

    return gopen_s3


def build(spec: dict[str, Any]) -> tuple[Iterable[Any], bool]:
    """The variant's iterable and whether it yields batches (dicts of lists) rather than samples."""
    reader, mode, decode = spec["reader"], spec["mode"], spec["payload"] == "decode"
    batch, s3 = spec["batch_size"], spec.get("s3")
    if reader in ("fastload", "fastload-nocrc"):
        import fastload

        s3_config = (
            fastload.S3Config(endpoint_url=s3["endpoint_url"], region=REGION, addressing_style="path")
            if s3
            else None
        )
        options = {"verify_samples": False} if reader == "fastload-nocrc" else {}
        ds = fastload.ShardDataset(
            spec["source"],
            decode=False,
            map=decode_sample if decode else None,
            s3_config=s3_config,
            **options,
        )
        if mode == "inproc":
            return ds, False
        return fastload.DataLoader(ds, batch_size=batch, num_workers=2), True
    if reader == "webdataset":
        import torch.utils.data
        import webdataset as wds

        if s3:
            # webdataset's documented extension point: its gopen dispatch table by URL scheme
            importlib.import_module("webdataset.gopen").gopen_schemes["s3"] = _webdataset_s3_opener(
                s3["endpoint_url"]
            )
        wd = wds.WebDataset(spec["urls"], shardshuffle=False, empty_check=False)
        if decode:
            wd = wd.map(decode_sample)
        if mode == "inproc":
            return wd, False
        return torch.utils.data.DataLoader(wd, batch_size=batch, num_workers=2), True
    if reader == "litdata":
        import litdata

        lit = litdata.StreamingDataset(spec["source"], transform=decode_sample if decode else None)
        if mode == "inproc":
            return lit, False
        return litdata.StreamingDataLoader(lit, batch_size=batch, num_workers=2), True
    if reader == "perfile":
        import torch.utils.data

        pf = PerFile(spec["keys"], spec["source"], decode, s3)
        if mode == "inproc":
            return (pf[i] for i in range(len(pf))), False
        return torch.utils.data.DataLoader(pf, batch_size=batch, num_workers=2), True
    raise ValueError(f"unknown reader {reader!r}")


# ------------------------------------------------------------------------------------------ consuming


class Tally:
    """What the consumer saw: samples, payload bytes (from the manifest), the digest."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.sizes: dict[str, tuple[int, int, int]] = {s[0]: (s[1], s[2], s[3]) for s in spec["manifest"]}
        self.decode = spec["payload"] == "decode"
        self.want_digest = spec["digest"]
        self.samples = self.bytes = self.digest = 0
        self.seen: set[str] = set()

    def add(self, key: str, jpg: Any, cls: Any) -> None:
        jpg_size, cls_size, label = self.sizes[key]
        if self.decode:
            if tuple(jpg.shape) != (CROP, CROP, 3) or int(cls) != label:
                raise RuntimeError(
                    f"sample {key}: decoded {tuple(jpg.shape)} label {cls}, want label {label}"
                )
        elif len(jpg) != jpg_size or len(cls) != cls_size:
            raise RuntimeError(
                f"sample {key}: jpg {len(jpg)} bytes, cls {len(cls)}; want {jpg_size}, {cls_size}"
            )
        if self.want_digest:
            if self.decode:
                self.seen.add(key)
            else:
                self.digest = (self.digest + sample_digest(key, jpg, cls)) & MASK64
        self.samples += 1
        self.bytes += jpg_size + cls_size


def _key(sample: dict[str, Any]) -> str:
    return str(sample["__key__"] if "__key__" in sample else sample["key"])


def consume(items: Iterable[Any], batched: bool, tally: Tally, limit: int | None) -> None:
    """Take every sample (or the first ``limit``) from the variant; one ``for`` loop over ``items``."""
    for item in items:
        if batched:
            keys = item["__key__"] if "__key__" in item else item["key"]
            for i, key in enumerate(keys):
                tally.add(key, item["jpg"][i], item["cls"][i])
        else:
            tally.add(_key(item), item["jpg"], item["cls"])
        if limit is not None and tally.samples >= limit:
            break


def decode_only(spec: dict[str, Any], tally: Tally) -> Callable[[], None]:
    """The decode reference: the JPEGs read into memory first (untimed), then only decoded."""
    root = Path(spec["source"])
    blobs = [(k, (root / f"{k}.jpg").read_bytes(), (root / f"{k}.cls").read_bytes()) for k in spec["keys"]]

    def run() -> None:
        for key, jpg, cls in blobs:
            tally.add(key, decode_jpeg(jpg), int(cls))

    return run


def _peak_rss_kib() -> int:
    """This process's peak RSS (VmHWM). Not ``ru_maxrss``: Linux carries that over from the forking
    parent across exec, so a child of a big parent would report the parent's size."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_child(spec_path: str) -> int:
    """Run one variant once as the JSON spec says; write the result JSON next to it."""
    spec = json.loads(Path(spec_path).read_text())
    tally = Tally(spec)
    limit = spec.get("limit")
    if spec["reader"] == "cat":
        paths = spec["urls"]

        def run() -> None:
            with open(os.devnull, "wb") as sink:
                subprocess.run(["cat", *paths], stdout=sink, check=True)
            tally.bytes = sum(os.path.getsize(p) for p in paths)
            tally.samples = len(spec["keys"])

    elif spec["reader"] == "decode-only":
        run = decode_only(spec, tally)
    else:
        items, batched = build(spec)

        def run() -> None:
            consume(items, batched, tally, limit)

    self0, kids0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    run()  # DataLoader workers are started and shut down (at the end or at the limit) inside the clock
    seconds = time.perf_counter() - t0
    self1, kids1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)

    def cpu(a: Any, b: Any) -> float:
        return float(b.ru_utime - a.ru_utime + b.ru_stime - a.ru_stime)

    result = {
        "seconds": seconds,
        "samples": tally.samples,
        "bytes": tally.bytes,
        "digest": tally.digest if spec["digest"] else None,
        "keys_seen": len(tally.seen) if tally.seen else None,
        "cpu_s": cpu(self0, self1) + cpu(kids0, kids1),
        "maxrss_main_kib": _peak_rss_kib(),
        "maxrss_child_kib": kids1.ru_maxrss,
        "load_1min": os.getloadavg()[0],
        "fastload_file": getattr(sys.modules.get("fastload"), "__file__", None),
    }
    Path(spec["result_path"]).write_text(json.dumps(result))
    return 0
