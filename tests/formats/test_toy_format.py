"""A format defined only here ("toy": a line ``key<TAB>field:size,...`` then the values, per sample),
registered at test time, round-trips through ``fastload.pack``, ``ShardDataset``, ``fastload verify`` and
``fastload inspect``: the proof that formats are chosen only through :mod:`fastload.formats`.

It has per-shard data of its own (:class:`ToyPayload`: a dialect name in ``index.json`` and each sample's
header-line length, a column of its sample table, or listed in a v1 manifest), written at pack, carried by
core unread and read back by the format, which reads samples by it: the proof that a format adds fields
without core knowing them (``docs/INDEX-FORMAT.md``, "Index format note")."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pytest
from crc32c import crc32c

import fastload
from fastload import cli, formats
from fastload.config import PackConfig, S3Config
from fastload.core.index import DatasetIndex, ShardEntry
from fastload.core.keys import Sample
from fastload.core.payload import ShardPayload
from fastload.errors import IndexFormatError, VerifyError
from fastload.formats.shard import ShardOutput, ShardResult, write_shard
from fastload.storage.inputs import Input, Member, read_exactly, read_problem

DIALECT = "tab-v1"


@dataclass(frozen=True)
class ToyPayload:
    """The toy format's per-shard data: its dialect and each sample's header-line bytes."""

    dialect: str
    heads: list[int]

    def manifest(self, *, listed: bool) -> dict[str, Any]:
        return {"toy_dialect": self.dialect, **({"toy_heads": list(self.heads)} if listed else {})}

    def table(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {"toy_dialect": self.dialect}, {"head_bytes": np.asarray(self.heads, dtype="<u4")}

    def nbytes(self) -> int:
        return 8 * len(self.heads)

    def slim(self) -> ShardPayload | None:
        return self


def read_toy_payload(entry: ShardEntry) -> ToyPayload:
    """The toy's reading of what core stored for it, checked."""
    dialect = entry.extra.get("toy_dialect")
    if dialect != DIALECT:
        raise ValueError(f"toy_dialect {dialect!r}; this toy reads {DIALECT!r}")
    stored = entry.table_extra
    if stored is not None:
        if stored.header.get("toy_dialect") != dialect or "head_bytes" not in stored.columns:
            raise ValueError("its sample table has no head_bytes of this dialect")
        heads = [int(h) for h in stored.columns["head_bytes"].tolist()]
    else:
        heads = [int(h) for h in entry.extra.get("toy_heads", [])]
    if len(heads) != entry.samples or not all(
        0 < h <= size for h, size in zip(heads, entry.sizes, strict=False)
    ):
        raise ValueError("head_bytes do not fit its samples")
    return ToyPayload(dialect, heads)


def _head(key: str, fields: Sequence[tuple[str, int]]) -> bytes:
    return f"{key}\t{','.join(f'{f}:{n}' for f, n in fields)}\n".encode()


def _parse(data: bytes, pos: int, *, shard: str) -> tuple[dict[str, Any], int]:
    """The sample at ``pos`` of ``data`` and where the next one starts."""
    end = data.find(b"\n", pos)
    if end < 0:
        raise VerifyError("no sample header line here", shard=shard, offset=pos)
    try:
        key, spec = data[pos:end].decode().split("\t")
        fields = [(f, int(n)) for f, n in (item.split(":") for item in spec.split(",") if item)]
    except ValueError:
        raise VerifyError("malformed sample header line", shard=shard, offset=pos) from None
    sample: dict[str, Any] = {"__key__": key}
    at = end + 1
    for f, n in fields:
        if at + n > len(data):
            raise VerifyError("value runs past the end", shard=shard, key=key, offset=at)
        sample[f] = data[at : at + n]
        at += n
    return sample, at


class ToySamples:
    def __init__(self, entry: ShardEntry, read: Callable[[int, int], bytes]) -> None:
        self.entry, self._read = entry, read

    def close(self) -> None:
        pass

    def load(
        self, positions: Sequence[int], columns: Sequence[str] | None = None, *, defer: bool = False
    ) -> Callable[[], Iterable[dict[str, Any]]]:
        out = []
        payload = self.entry.payload
        if not isinstance(payload, ToyPayload):
            raise VerifyError("no toy payload in the index (core dropped it?)", shard=self.entry.name)
        for i in positions:
            data = self._read(self.entry.offsets[i], self.entry.sizes[i])
            if data[payload.heads[i] - 1 : payload.heads[i]] != b"\n":  # where the index says it ends
                raise VerifyError("header line not where the index says", shard=self.entry.name, key=str(i))
            sample, _ = _parse(data, 0, shard=self.entry.name)
            if sample["__key__"] != self.entry.keys[i]:
                raise VerifyError(
                    "not the sample the index lists", shard=self.entry.name, key=self.entry.keys[i]
                )
            sample["__index__"] = i
            out.append(sample)
        return lambda: out


class ToyFormat(formats.ShardFormat):
    name = "toy"
    label = "toy"
    suffixes: tuple[str, ...] = (".toy",)
    pack_options: tuple[str, ...] = ()
    foreign = False
    projects_columns = False

    def matches(self, name: str) -> bool:
        return name.endswith(self.suffixes)

    def sample_sizes(
        self, samples: Sequence[Sample[Input]], *, n_fields: int, config: PackConfig
    ) -> tuple[list[int], int]:
        sizes = []
        for s in samples:
            fields = [(f, it.entry.size) for f, it in s.members]
            sizes.append(len(_head(s.key, fields)) + sum(n for _, n in fields))
        return sizes, 0

    def write(
        self,
        name: str,
        samples: Sequence[Sample[Input]],
        tmp_path: str,
        *,
        fields: Sequence[str],
        config: PackConfig,
        on_sample: Callable[[int, int], None] | None = None,
        open_threads: int = 0,
    ) -> ShardResult:
        heads: list[int] = []

        def write_sample(out: ShardOutput, key: str, members: Sequence[Member]) -> Any:
            head = _head(key, [(m.field, m.size) for m in members])
            out.write(head)
            heads.append(len(head))
            for m in members:
                buf = bytearray(m.size)
                try:
                    read_exactly(m.file, memoryview(buf))
                except OSError as exc:
                    from fastload.errors import Skip

                    return Skip(m.item.shown, read_problem(exc))
                out.write(bytes(buf))
            return None

        result = write_shard(
            name, samples, tmp_path, write_sample, on_sample=on_sample, open_threads=open_threads
        )
        result.entry.payload = ToyPayload(DIALECT, heads) if len(heads) == result.entry.samples else None
        return result

    def check_entry(self, entry: ShardEntry) -> str | None:
        return None if len(entry.offsets) == entry.samples else "lacks per-sample offsets"

    def read_payload(self, entry: ShardEntry) -> ToyPayload:
        return read_toy_payload(entry)

    def table(
        self, named: Sequence[tuple[str, str]], *, threads: int, s3_config: S3Config | None
    ) -> tuple[DatasetIndex, list[VerifyError]]:
        raise NotImplementedError

    def samples(
        self, entry: ShardEntry, *, read: Callable[[int, int], bytes], file: BinaryIO, fd: int | None
    ) -> ToySamples:
        return ToySamples(entry, read)

    def verify(self, file: BinaryIO, shard: ShardEntry) -> list[VerifyError]:
        data = file.read()
        problems = []
        pos, i = 0, 0
        try:
            while pos < len(data):
                sample, end = _parse(data, pos, shard=shard.name)
                if i >= shard.samples or (sample["__key__"], pos, end - pos) != (
                    shard.keys[i],
                    shard.offsets[i],
                    shard.sizes[i],
                ):
                    problems.append(
                        VerifyError("sample not where the index says", shard=shard.name, offset=pos)
                    )
                    break
                pos, i = end, i + 1
        except VerifyError as exc:
            problems.append(exc)
        if f"{crc32c(data):08x}" != shard.checksum:
            problems.append(VerifyError("CRC32C differs from the index's", shard=shard.name))
        return problems

    def lint(self, url: str, *, s3_config: S3Config | None) -> tuple[list[VerifyError], int, int]:
        raise NotImplementedError

    def describe(self, index: DatasetIndex) -> list[str]:
        return [f"toy:      {len(index.shards)} toy shard(s)"]


Tree = tuple[Path, dict[str, dict[str, bytes]]]


@pytest.fixture
def toy() -> Iterator[ToyFormat]:
    fmt = ToyFormat()
    formats.register(fmt)
    try:
        yield fmt
    finally:
        formats.unregister(fmt.name)


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    src = tmp_path / "src"
    expected: dict[str, dict[str, bytes]] = {}
    for i in range(40):
        key = f"d{i % 3}/s{i:03d}"
        values = {"txt": f"sample {i}\n".encode(), "bin": os.urandom(1 + i * 37 % 300)}
        expected[key] = values
        for field, value in values.items():
            path = src / f"{key}.{field}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(value)
    return src, expected


def _cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(out):
        code = cli.main(list(args))
    return code, out.getvalue()


@pytest.fixture
def written(tree: Tree, tmp_path: Path) -> Tree:
    """A toy dataset written here, byte by byte (not by pack): two shards and their index."""
    _, expected = tree
    dst = tmp_path / "written"
    dst.mkdir()
    keys = sorted(expected)
    shards = []
    for number, part in enumerate((keys[:25], keys[25:])):
        data, offsets, sizes, heads = b"", [], [], []
        for key in part:
            values = expected[key]
            head = _head(key, [(f, len(v)) for f, v in values.items()])
            record = head + b"".join(values.values())
            heads.append(len(head))
            offsets.append(len(data))
            sizes.append(len(record))
            data += record
        name = f"shard-{number:06d}.toy"
        (dst / name).write_bytes(data)
        entry = ShardEntry(name, len(data), f"{crc32c(data):08x}", part, offsets, sizes)
        entry.payload = ToyPayload(DIALECT, heads)  # (a v1 index: listed in index.json)
        shards.append(entry)
    (dst / "index.json").write_bytes(DatasetIndex("toy", ["bin", "txt"], shards).to_json())
    return dst, expected


def _read_all(dst: Path) -> dict[str, dict[str, Any]]:
    return {s["__key__"]: s for s in fastload.ShardDataset(dst, decode=False)}


def test_toy_pack(toy: ToyFormat, tree: Tree, tmp_path: Path) -> None:
    src, expected = tree
    dst = tmp_path / "packed"
    fastload.pack(src, dst, shard_format="toy", shard_size_bytes=4096, workers=2, progress=False)
    index = formats.load_index(dst, tables=True)
    assert index.shard_format == "toy" and index.samples == len(expected)
    assert len(index.shards) > 1 and all(s.name.endswith(".toy") for s in index.shards)
    assert {k for s in index.shards for k in s.keys} == set(expected)
    code, out = _cli("verify", str(dst))
    assert code == 0 and out.startswith("OK:"), out


def test_toy_payload_round_trips_through_index_and_tables(toy: ToyFormat, tree: Tree, tmp_path: Path) -> None:
    """The toy's own per-shard data, written at pack, comes back from index.json and the sample tables as
    the toy wrote it (each header line's length, measured here from the shard bytes), and a value the toy
    does not accept is refused by the toy, naming the shard."""
    src, expected = tree
    dst = tmp_path / "packed"
    fastload.pack(src, dst, shard_format="toy", shard_size_bytes=4096, progress=False)
    raw = json.loads((dst / "index.json").read_text())
    assert raw["version"] == 2 and all(s["toy_dialect"] == DIALECT for s in raw["shards"])
    index = formats.load_index(dst, tables=True)
    for shard in index.shards:
        data = (dst / shard.name).read_bytes()
        heads = [data.index(b"\n", o) + 1 - o for o in shard.offsets]
        assert shard.payload == ToyPayload(DIALECT, heads), shard.name
    got = _read_all(dst)  # (the read path cuts each sample by its payload)
    assert {k: {f: bytes(got[k][f]) for f in v} for k, v in expected.items()} == expected

    raw["shards"][1]["toy_dialect"] = "comma-v0"
    (dst / "index.json").write_text(json.dumps(raw))
    with pytest.raises(
        IndexFormatError, match=f"toy shard {raw['shards'][1]['name']}: toy_dialect 'comma-v0'"
    ):
        formats.load_index(dst, tables=True)


def test_toy_shard_dataset(toy: ToyFormat, written: Tree) -> None:
    dst, expected = written
    got = _read_all(dst)
    assert sorted(got) == sorted(expected)
    for key, values in expected.items():
        assert {f: bytes(got[key][f]) for f in values} == values


def test_toy_pack_then_read(toy: ToyFormat, tree: Tree, tmp_path: Path) -> None:
    src, expected = tree
    dst = tmp_path / "packed"
    fastload.pack(src, dst, shard_format="toy", shard_size_bytes=4096, progress=False)
    assert all(s.name.endswith(".toy") for s in formats.load_index(dst).shards)
    got = _read_all(dst)
    assert {k: {f: bytes(got[k][f]) for f in v} for k, v in expected.items()} == expected


def test_toy_verify_and_inspect(toy: ToyFormat, written: Tree) -> None:
    dst, _ = written
    index = formats.load_index(dst)
    code, out = _cli("verify", str(dst))
    assert code == 0 and out.startswith(
        f"OK: 2 shards checked against index.json: {index.samples:,} samples"
    ), out
    shard = dst / index.shards[1].name
    data = bytearray(shard.read_bytes())
    data[0] ^= 0x20  # the first key's first letter: the sample is no longer where the index says
    shard.write_bytes(bytes(data))
    code, out = _cli("verify", str(dst))
    assert code == 1 and "FAILED" in out and index.shards[1].name in out and "not where the index says" in out

    code, out = _cli("inspect", str(dst))
    assert code == 0 and "format:   toy" in out and "toy:      2 toy shard(s)" in out, out
    code, out = _cli("inspect", str(dst), "--shard", "1", "--limit", "2")
    assert code == 0 and index.shards[1].keys[0] in out and "offset 0" in out, out


def test_unregistered_toy_dataset_is_refused(written: Tree) -> None:
    """Without its format registered, the index names the format it does not know."""
    dst, _ = written
    with pytest.raises(IndexFormatError, match="unknown shard_format 'toy'"):
        formats.load_index(dst)
    code, _ = _cli("verify", str(dst))
    assert code != 0
