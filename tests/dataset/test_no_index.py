"""Tar shards without ``index.json`` (written by webdataset's ShardWriter): ShardDataset indexes them in
memory with one read, says so, and then gives every sample-level feature: the same samples and bytes as
webdataset reads, exactly once across workers, exact resume."""

from __future__ import annotations

import gc
import io
import random
import tarfile
import warnings
from pathlib import Path

import pytest
import webdataset as wds

import fastload
from fastload.errors import ConfigError, NotFoundError, VerifyError
from fastload.formats.tar.layout import layout_of

from .helpers import keys_of

NO_INDEX = "no index.json"


def samples(n: int = 40, seed: int = 3) -> dict[str, dict[str, bytes]]:
    rng = random.Random(seed)
    return {
        f"s{i:04d}": {"bin": rng.randbytes(rng.randrange(1, 5000)), "cls": str(i % 7).encode()}
        for i in range(n)
    }


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, bytes]]]:
    """Shards written by webdataset's ShardWriter (no fastload index), 9 samples per shard."""
    root = tmp_path_factory.mktemp("foreign")
    data = samples()
    with wds.ShardWriter(str(root / "part-%04d.tar"), maxcount=9, verbose=0) as sink:
        for key, fields in data.items():
            sink.write({"__key__": key, **fields})
    return root, data


def as_source(sample: dict) -> dict[str, bytes]:
    return {k: v for k, v in sample.items() if not k.startswith("__")}


def test_a_folder_of_foreign_tars_reads_like_webdataset(foreign: tuple[Path, dict]) -> None:
    root, data = foreign
    with pytest.warns(UserWarning, match=NO_INDEX):
        ds = fastload.ShardDataset(root, decode=False)
    got = list(ds)
    assert [s["__key__"] for s in got] == list(data)
    assert all(as_source(s) == data[s["__key__"]] for s in got)
    urls = sorted(str(p) for p in root.glob("*.tar"))
    with warnings.catch_warnings():
        # webdataset leaves its last shard's file for the garbage collector to close
        warnings.simplefilter("ignore", ResourceWarning)
        theirs = [(s["__key__"], s["bin"]) for s in wds.WebDataset(urls, shardshuffle=False)]
        gc.collect()
    assert [(s["__key__"], s["bin"]) for s in got] == theirs
    assert ds.index.samples == len(data) and len(ds.index.shards) == 5
    assert {s.checksum for s in ds.index.shards} and all(len(s.checksum) == 8 for s in ds.index.shards)


def test_a_list_of_shards_and_a_single_shard(foreign: tuple[Path, dict]) -> None:
    root, data = foreign
    urls = sorted(str(p) for p in root.glob("*.tar"))[1:3]
    with pytest.warns(UserWarning, match=NO_INDEX):
        ds = fastload.ShardDataset(urls, decode=False)
    assert [s["__key__"] for s in ds] == list(data)[9:27]
    with pytest.warns(UserWarning, match=NO_INDEX):
        one = fastload.ShardDataset(urls[0], decode=False)
    assert [s["__key__"] for s in one] == list(data)[9:18]


def test_workers_exactly_once_and_exact_resume(foreign: tuple[Path, dict]) -> None:
    root, data = foreign
    with pytest.warns(UserWarning, match=NO_INDEX):
        ds = fastload.ShardDataset(root, seed=4, shuffle_buffer=5)
    loader = fastload.DataLoader(ds, batch_size=4, num_workers=2)
    whole = keys_of(loader)
    assert sorted(whole) == sorted(data)
    # (a new loader: this one would go on to epoch 1 after its complete pass)
    loader = fastload.DataLoader(ds, batch_size=4, num_workers=2)
    it = iter(loader)
    head = [k for _ in range(3) for k in next(it)["__key__"]]
    state = loader.state_dict()
    del it
    with pytest.warns(UserWarning, match=NO_INDEX):
        again = fastload.ShardDataset(root, seed=4, shuffle_buffer=5)
    resumed = fastload.DataLoader(again, batch_size=4, num_workers=2)
    resumed.load_state_dict(state)
    assert head + keys_of(resumed) == whole


def test_members_of_a_sample_that_are_not_adjacent_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("a.cls", "b.cls", "a.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"1"))
    with pytest.raises(VerifyError, match="not adjacent") as info:
        fastload.ShardDataset(path)
    assert info.value.shard == "bad.tar" and info.value.key == "a"


def test_a_truncated_foreign_tar_is_named(tmp_path: Path, foreign: tuple[Path, dict]) -> None:
    root, _ = foreign
    src = sorted(root.glob("*.tar"))[0].read_bytes()
    (tmp_path / "cut.tar").write_bytes(src[: len(src) // 2])
    with pytest.raises(VerifyError, match=r"cut\.tar") as info:
        fastload.ShardDataset(tmp_path)
    assert "re-download" in str(info.value)


def test_a_folder_with_neither_index_nor_tars_says_what_it_wanted(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(NotFoundError, match=r"index\.json"):
        fastload.ShardDataset(tmp_path)


def test_tfrecord_shards_without_index_are_indexed_in_memory_too(tmp_path: Path) -> None:
    src = tmp_path / "src"
    data = samples(25, seed=9)
    for key, fields in data.items():
        for field_name, value in fields.items():
            (src / f"{key}.{field_name}").parent.mkdir(parents=True, exist_ok=True)
            (src / f"{key}.{field_name}").write_bytes(value)
    dst = tmp_path / "tfr"
    fastload.pack(src, dst, shard_format="tfrecord", max_samples=10, progress=False)
    (dst / "index.json").unlink()
    with pytest.warns(UserWarning, match=NO_INDEX):
        ds = fastload.ShardDataset(dst, decode=False)
    got = list(ds)
    assert ds.index.shard_format == "tfrecord"
    assert [s["__key__"] for s in got] == list(data)
    assert all(as_source(s) == data[s["__key__"]] for s in got)
    shards = sorted(str(p) for p in dst.glob("*.tfrecord"))
    with pytest.warns(UserWarning, match=NO_INDEX):
        assert [s["__key__"] for s in fastload.ShardDataset(shards[1:], decode=False)] == list(data)[10:]
    (dst / "extra.tar").write_bytes(b"")
    with pytest.raises(ConfigError, match="both tar and TFRecord"):
        fastload.ShardDataset(dst)


def test_foreign_tars_get_a_member_layout_where_their_headers_are_plain(
    foreign: tuple[Path, dict], tmp_path: Path
) -> None:
    root, data = foreign
    with pytest.warns(UserWarning, match=NO_INDEX):
        ds = fastload.ShardDataset(root, decode=False)
    assert all(layout_of(s) is None for s in ds.index.shards)  # webdataset writes a pax header per member
    (tmp_path / "plain.tar").write_bytes(ustar_tar(data))
    with pytest.warns(UserWarning, match=NO_INDEX):
        ds = fastload.ShardDataset(tmp_path / "plain.tar", decode=False)
    assert getattr(layout_of(ds.index.shards[0]), "fields", None) == ["bin", "cls"]
    assert {s["__key__"]: as_source(s) for s in ds} == data


def ustar_tar(data: dict[str, dict[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, fields in data.items():
            for field, value in fields.items():
                info = tarfile.TarInfo(f"{key}.{field}")
                info.size = len(value)
                tar.addfile(info, io.BytesIO(value))
    return buf.getvalue()


def test_headers_formatted_differently_from_fastloads_still_read_right(tmp_path: Path) -> None:
    """A writer that ends the size field with a space (legal; some tar implementations do) makes every
    header differ from what the layout check expects: the reader falls back to parsing, same bytes."""
    data = samples(12)
    raw = bytearray(ustar_tar(data))
    pos = 0
    while raw[pos : pos + 512].strip(b"\0"):
        header = raw[pos : pos + 512]
        size = int(header[124:135], 8)
        header[124:136] = b"%011o " % size
        header[148:156] = b" " * 8
        header[148:156] = b"%06o\0 " % sum(header)
        raw[pos : pos + 512] = header
        pos += 512 + (size + 511) // 512 * 512
    (tmp_path / "odd.tar").write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match=NO_INDEX):
        ds = fastload.ShardDataset(tmp_path / "odd.tar", decode=False)
    assert getattr(layout_of(ds.index.shards[0]), "fields", None) == ["bin", "cls"]
    for options in ({"prefetch_bytes": 0}, {"prefetch_bytes": 1 << 20}):
        with pytest.warns(UserWarning, match=NO_INDEX):
            got = fastload.ShardDataset(tmp_path / "odd.tar", decode=False, **options)
        assert {s["__key__"]: as_source(s) for s in got} == data
