"""What ``fastload bench`` measures: the embedded synthetic dataset, or the user's SOURCE, as files and/or
packed shards, locally and over S3 (the embedded endpoint in a process of its own, or the user's store).

Nothing under SOURCE is written: a folder of small files is sampled (``images`` samples spread over the
whole folder), the sample is packed into a temporary folder, and both are served read-only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastload.config import S3Config
from fastload.errors import ConfigError, FastloadError
from fastload.storage import access as storage
from fastload.storage.manifest import has_index, refuse_unfinished

BUCKET = "bench"


@dataclass(frozen=True)
class FileSample:
    """One sample stored as separate files: its key and ``(field, path relative to the files root)``."""

    key: str
    members: tuple[tuple[str, str], ...]


class Endpoint:
    """``python -m fastload.testing.s3serve ROOT`` in a child process (its CPU is not the measured
    process's)."""

    def __init__(self, root: str, *, latency_s: float, conn_bytes_per_s: float | None) -> None:
        command = [
            sys.executable,
            "-m",
            "fastload.testing.s3serve",
            root,
            "--bucket",
            BUCKET,
            "--latency-ms",
            str(latency_s * 1000),
            "--conn-mbps",
            str((conn_bytes_per_s or 0) / 1e6),
        ]
        self.latency_s, self.conn_bytes_per_s = latency_s, conn_bytes_per_s
        # stderr goes to a file, not a pipe nobody drains while the endpoint serves
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by close()
        self._proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait()
            self._stderr.seek(0)
            err = self._stderr.read().strip()
            self._stderr.close()
            self._proc.stdout.close()
            raise FastloadError(f"the embedded S3 endpoint did not start: {err or 'no output'}")
        self.endpoint_url: str = json.loads(line)["endpoint_url"]
        self.pid = self._proc.pid

    def config(self) -> S3Config:
        return S3Config(endpoint_url=self.endpoint_url, region="us-east-1", addressing_style="path")

    def cpu_s(self) -> float | None:
        """User + system CPU seconds the endpoint has used so far (Linux ``/proc``), or None."""
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._stderr.close()


@dataclass
class Workload:
    """The data of one run. ``*_local`` are folders, ``*_s3`` are ``s3://`` prefixes (``s3_config`` for
    the embedded endpoint, ``user_config`` for the user's store)."""

    label: str
    kind: str
    samples: list[FileSample] | None = None
    files_local: str | None = None
    packed_local: str | None = None
    files_s3: str | None = None
    packed_s3: str | None = None
    user_files_s3: str | None = None
    s3_config: S3Config | None = None
    user_config: S3Config | None = None
    endpoint: Endpoint | None = None
    serve_root: str | None = None
    file_count: int = 0
    file_bytes: int = 0
    classes: dict[str, int] = field(default_factory=dict)
    scratch: str = ""
    _temp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def file_bytes_mean(self) -> float | None:
        return self.file_bytes / self.file_count if self.file_count else None

    def fields(self) -> list[str]:
        """The samples' field names (file extensions), from the files or the packed index."""
        if self.samples is not None:
            return sorted({name for s in self.samples for name, _ in s.members})
        from fastload.storage.manifest import load_index

        where = self.packed_local or self.packed_s3
        if where is None:
            return []
        config = None if self.packed_local else self.s3_config
        return sorted(load_index(where, s3_config=config).fields)

    def describe(self) -> dict[str, Any]:
        from fastload.train.decode import IMAGE_EXTENSIONS

        fields = self.fields()
        return {
            "label": self.label,
            "kind": self.kind,
            "fields": fields,
            "image_fields": [f for f in fields if f.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS],
            "samples_per_file_view": len(self.samples) if self.samples is not None else None,
            "files": self.file_count or None,
            "file_bytes": self.file_bytes or None,
            "file_bytes_mean": self.file_bytes_mean,
            "files_local": self.files_local,
            "packed_local": self.packed_local,
            "files_s3": self.files_s3,
            "packed_s3": self.packed_s3,
            "user_files_s3": self.user_files_s3,
            "endpoint": None if self.endpoint is None else self.endpoint.endpoint_url,
        }

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
        if self._temp is not None:
            self._temp.cleanup()
            self._temp = None


def _classes(samples: list[FileSample]) -> dict[str, int]:
    folders = sorted({s.key.rpartition("/")[0] for s in samples})
    return {f: i for i, f in enumerate(folders)}


def _spread(items: list[Any], n: int) -> list[Any]:
    """``n`` items spread evenly over ``items`` (all when there are fewer)."""
    if len(items) <= n:
        return items
    return [items[i * len(items) // n] for i in range(n)]


def _list_local(root: str, limit: int) -> tuple[list[FileSample], int]:
    from fastload.core.keys import group_samples
    from fastload.storage.listing import FileEntry, LocalSource

    entries = [e for e in LocalSource(root).list() if isinstance(e, FileEntry)]
    sizes = {e.relpath: e.size for e in entries}
    grouped, _ = group_samples((e.relpath, e.relpath) for e in entries)
    chosen = _spread(grouped, limit)
    samples = [FileSample(s.key, s.members) for s in chosen]
    return samples, sum(sizes[rel] for s in samples for _, rel in s.members)


def _start_endpoint(work: Workload, root: str, options: Any) -> None:
    work.serve_root = root
    work.endpoint = Endpoint(root, latency_s=options.latency_s, conn_bytes_per_s=options.conn_bytes_per_s)
    work.s3_config = work.endpoint.config()
    # the embedded endpoint accepts any credentials; botocore needs some to sign with
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "fastload-bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "fastload-bench")


def _pack_subset(work: Workload, source_root: str) -> None:
    """Link the sampled files into ``scratch/subset`` and pack them into ``scratch/packed``."""
    from fastload.packing.pack import pack

    assert work.samples is not None
    subset = os.path.join(work.scratch, "subset")
    for s in work.samples:
        for _, rel in s.members:
            link = os.path.join(subset, rel)
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(os.path.join(source_root, rel), link)
    packed = os.path.join(work.scratch, "packed")
    pack(subset, packed, max_samples=max(1, -(-len(work.samples) // 16)), progress=False, allow_skip=True)
    work.packed_local = packed


def prepare(options: Any, note: Callable[[str], None]) -> Workload:
    """The :class:`Workload` for resolved :class:`~fastload.bench.options.BenchOptions`."""
    source: str | None = options.source
    if source is None:
        from fastload.bench.synth import CLASSES, ensure_synthetic, relpath

        data = ensure_synthetic(options.cache_dir, options.images, seed=options.seed, progress=note)
        samples = [
            FileSample(relpath(i).rsplit(".", 1)[0], (("jpg", relpath(i)),)) for i in range(data.images)
        ]
        work = Workload(
            label=f"synthetic: {data.images:,} JPEGs",
            kind="synthetic",
            samples=samples,
            files_local=data.files,
            packed_local=data.packed,
            file_count=data.images,
            file_bytes=data.file_bytes,
            classes={f"class_{c:02d}": c for c in range(CLASSES)},
        )
        _start_endpoint(work, data.root, options)
        work.files_s3, work.packed_s3 = f"s3://{BUCKET}/files", f"s3://{BUCKET}/packed"
        return work
    if source.startswith("s3://"):
        return _prepare_s3(source, options, note)
    root = os.path.abspath(source)
    if not os.path.isdir(root):
        raise ConfigError(
            f"SOURCE {source} is not a folder or s3:// prefix; give the folder holding the data"
        )
    temp = tempfile.TemporaryDirectory(prefix="fastload-bench-")
    work = Workload(label=root, kind="files", scratch=temp.name, _temp=temp)
    try:
        serve = os.path.join(temp.name, "serve")
        os.makedirs(serve)
        if has_index(root):
            work.kind, work.packed_local = "dataset", root
            os.symlink(root, os.path.join(serve, "packed"))
        else:
            refuse_unfinished(root, what="benchmarked")
            note(f"listing {root} (read-only; {options.images:,} samples of it are packed to a temp folder)")
            work.samples, work.file_bytes = _list_local(root, options.images)
            if not work.samples:
                raise ConfigError(f"SOURCE {root} holds no usable files; point it at a folder of samples")
            work.file_count = sum(len(s.members) for s in work.samples)
            work.classes = _classes(work.samples)
            work.files_local = root
            _pack_subset(work, root)
            os.symlink(root, os.path.join(serve, "files"))
            assert work.packed_local is not None
            os.symlink(work.packed_local, os.path.join(serve, "packed"))
            work.files_s3 = f"s3://{BUCKET}/files"
        _start_endpoint(work, serve, options)
        work.packed_s3 = f"s3://{BUCKET}/packed"
    except BaseException:
        work.close()
        raise
    return work


def _prepare_s3(source: str, options: Any, note: Callable[[str], None]) -> Workload:
    from fastload.s3.client import parse_s3_url
    from fastload.s3.listing import ObjectInfo, list_objects

    config = S3Config.from_env(endpoint_url=options.endpoint_url)
    prefix_url = source.rstrip("/")
    if has_index(prefix_url, s3_config=config):
        return Workload(
            label=source, kind="s3-dataset", packed_s3=prefix_url, s3_config=config, user_config=config
        )
    refuse_unfinished(prefix_url, s3_config=config, what="benchmarked")
    bucket, prefix = parse_s3_url(prefix_url + "/")
    note(f"listing {source} (read-only; a sample of {options.images:,} samples is copied to a temp folder)")
    objects = [o for o in list_objects(bucket, prefix, config=config) if isinstance(o, ObjectInfo)]
    from fastload.core.keys import group_samples

    grouped, _ = group_samples((o.key[len(prefix) :], o) for o in objects)
    chosen = _spread(grouped, options.images)
    if not chosen:
        raise ConfigError(f"SOURCE {source} holds no usable objects; point it at a prefix of samples")
    temp = tempfile.TemporaryDirectory(prefix="fastload-bench-")
    work = Workload(label=source, kind="s3-files", scratch=temp.name, _temp=temp, user_config=config)
    try:
        local = os.path.join(temp.name, "serve", "files")
        samples = []
        for s in chosen:
            members = []
            for name, obj in s.members:
                rel = obj.key[len(prefix) :]
                data = storage.read_bytes(f"s3://{bucket}/{obj.key}", config=config)
                path = os.path.join(local, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
                members.append((name, rel))
                work.file_bytes += len(data)
            samples.append(FileSample(s.key, tuple(members)))
        work.samples, work.file_count = samples, sum(len(s.members) for s in samples)
        work.classes = _classes(samples)
        work.files_local, work.user_files_s3 = local, prefix_url
        _pack_subset(work, local)
        serve = os.path.join(temp.name, "serve")
        assert work.packed_local is not None
        os.symlink(work.packed_local, os.path.join(serve, "packed"))
        _start_endpoint(work, serve, options)
        work.files_s3, work.packed_s3 = f"s3://{BUCKET}/files", f"s3://{BUCKET}/packed"
    except BaseException:
        work.close()
        raise
    return work
