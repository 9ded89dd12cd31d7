"""What a sample holds: decoded fields, bytes with decode=False, ``__shard__``/``__index__`` as in the index,
pickles refused unless allowed, decode errors that name shard and key (or are skipped), Parquet columns,
and shards that do not match their index refused instead of read."""

from __future__ import annotations

import io
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import fastload
from fastload.errors import ConfigError, FastloadError, VerifyError

from .helpers import Packed, keys_of, make_loader, pack_files, small_files, take

DECODED_FIELDS = {"__key__", "__shard__", "__index__", "cls", "txt", "json", "bin"}


def all_samples(packed: Packed | str, *, num_workers: int = 0, batch_size: int = 7, **kw: Any) -> list[dict]:
    _, dl = make_loader(
        packed, batch_size=batch_size, num_workers=num_workers, loader={"collate_fn": list}, **kw
    )
    return [s for batch in dl for s in batch]


def check_position(packed: Packed, sample: dict[str, Any]) -> None:
    assert (sample["__shard__"], sample["__index__"]) == packed.where(sample["__key__"])


# --- fields -----------------------------------------------------------------------------------------


def test_fields_are_decoded_by_extension(uneven: Packed) -> None:
    samples = all_samples(uneven, num_workers=2, seed=3, shuffle_buffer=16)
    assert sorted(s["__key__"] for s in samples) == sorted(uneven.keys)
    for s in samples:
        src = uneven.samples[s["__key__"]]
        assert set(s) == DECODED_FIELDS
        assert s["cls"] == int(src["cls"]) and type(s["cls"]) is int
        assert s["txt"] == src["txt"].decode("utf-8") and type(s["txt"]) is str
        assert s["json"] == json.loads(src["json"]) and type(s["json"]) is dict
        assert s["bin"] == src["bin"] and type(s["bin"]) is bytes
        check_position(uneven, s)


def test_decode_false_gives_the_packed_bytes(uneven: Packed) -> None:
    samples = all_samples(uneven, num_workers=1, decode=False, seed=5)
    assert len(samples) == len(uneven.keys)
    for s in samples:
        fields = {k: v for k, v in s.items() if not k.startswith("__")}
        assert fields == uneven.samples[s["__key__"]]
        check_position(uneven, s)


def test_default_collation_of_decoded_fields(small: Packed) -> None:
    _, dl = make_loader(small, batch_size=4, num_workers=1)
    batch = next(iter(dl))
    keys = list(batch["__key__"])
    assert keys == small.keys[:4]
    assert batch["cls"].tolist() == [int(small.samples[k]["cls"]) for k in keys]
    assert list(batch["txt"]) == [small.samples[k]["txt"].decode() for k in keys]
    assert list(batch["bin"]) == [small.samples[k]["bin"] for k in keys]
    assert batch["__index__"].tolist() == [0, 1, 2, 3]


def test_map_is_applied_in_the_workers(small: Packed) -> None:
    samples = all_samples(small, num_workers=2, map=_cls_and_key)
    assert samples == [(int(small.samples[k]["cls"]), k) for k in small.keys]


def _cls_and_key(sample: dict[str, Any]) -> tuple[int, str]:
    return sample["cls"], sample["__key__"]


def test_long_and_non_ascii_names_read_back(tmp_path: Path, tree_files: Any) -> None:
    # Names over 100 bytes and non-ASCII names are stored with pax headers inside each sample's byte range.
    packed = pack_files(tmp_path, tree_files.rich(), max_samples=4)
    samples = all_samples(packed, num_workers=2, batch_size=3, decode=False, seed=1, shuffle_buffer=4)
    assert sorted(s["__key__"] for s in samples) == sorted(packed.keys)
    for s in samples:
        assert {k: v for k, v in s.items() if not k.startswith("__")} == packed.samples[s["__key__"]]
        check_position(packed, s)


# --- pickles ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pickled(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    files: dict[str, bytes] = {}
    for i in range(6):
        tensor = io.BytesIO()
        torch.save(torch.arange(i + 1), tensor)
        files[f"p/{i:03d}.pth"] = tensor.getvalue()
        files[f"p/{i:03d}.pickle"] = pickle.dumps({"i": i})
        files[f"p/{i:03d}.cls"] = b"%d" % i
    return pack_files(tmp_path_factory.mktemp("pickled"), files, max_samples=4)


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.usefixtures("prompt_worker_shutdown")
def test_pickled_fields_are_refused_unless_allowed(pickled: Packed, num_workers: int) -> None:
    with pytest.raises(FastloadError) as info:
        all_samples(pickled, num_workers=num_workers)
    message = str(info.value)
    assert "allow_pickle=True" in message
    assert "shard-000000.tar" in message and "'p/000'" in message
    assert "pickle" in message or "pth" in message


def test_pickled_fields_are_decoded_when_allowed(pickled: Packed) -> None:
    samples = all_samples(pickled, num_workers=1, allow_pickle=True)
    assert [s["__key__"] for s in samples] == pickled.keys
    for i, s in enumerate(samples):
        assert s["pickle"] == {"i": i}
        assert torch.equal(s["pth"], torch.arange(i + 1))
    raw = all_samples(pickled, decode=False)  # bytes are always fine
    assert [s["pickle"] for s in raw] == [pickled.samples[k]["pickle"] for k in pickled.keys]


# --- fields that do not decode -------------------------------------------------------------------------

# Fields that pack fine but do not decode (an empty value stays b"" undecoded: whitespace instead).
BAD = {"b/0003": ("cls", b"three"), "b/0014": ("json", b"{not json"), "b/0020": ("cls", b" ")}


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    files: dict[str, bytes] = {}
    for i in range(24):
        key = f"b/{i:04d}"
        files[f"{key}.cls"] = b"%d" % (i % 4)
        files[f"{key}.json"] = json.dumps({"i": i}).encode()
    for key, (field, data) in BAD.items():
        files[f"{key}.{field}"] = data
    return pack_files(tmp_path_factory.mktemp("broken"), files, max_samples=5)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.usefixtures("prompt_worker_shutdown")
def test_undecodable_field_names_shard_and_key(broken: Packed, num_workers: int) -> None:
    with pytest.raises(FastloadError) as info:
        all_samples(broken, num_workers=num_workers, batch_size=2)
    message = str(info.value)
    assert "shard-000000.tar" in message and "'b/0003'" in message
    assert "on_error='skip'" in message


def test_on_error_skip_leaves_out_only_the_bad_samples(broken: Packed) -> None:
    ds, dl = make_loader(broken, batch_size=4, on_error="skip")
    keys = keys_of(dl)
    assert keys == [k for k in broken.keys if k not in BAD]
    assert ds.epoch_report()["skipped_on_error"] == len(BAD)


def test_on_error_skip_order_does_not_depend_on_num_workers(broken: Packed) -> None:
    orders = [
        keys_of(make_loader(broken, batch_size=4, num_workers=n, on_error="skip")[1]) for n in (0, 2, 3)
    ]
    assert orders[0] == [k for k in broken.keys if k not in BAD]
    assert orders[1] == orders[0], "2 workers"
    assert orders[2] == orders[0], "3 workers"


def test_on_error_skip_resume_is_exact(broken: Packed) -> None:
    full = keys_of(make_loader(broken, batch_size=4, on_error="skip")[1])
    _, dl = make_loader(broken, batch_size=4, on_error="skip")
    iterator = iter(dl)
    before = keys_of(take(iterator, 2))  # b/0003 was skipped inside these batches
    state = dl.state_dict()
    iterator.close()
    _, dl = make_loader(broken, batch_size=4, on_error="skip")
    dl.load_state_dict(state)
    after = keys_of(dl)
    assert before + after == full


def test_on_error_skip_is_counted_with_workers(broken: Packed) -> None:
    ds, dl = make_loader(broken, batch_size=4, num_workers=2, on_error="skip")
    assert len(keys_of(dl)) == len(broken.keys) - len(BAD)
    assert ds.epoch_report()["skipped_on_error"] == len(BAD)


def test_bad_options_are_refused(small: Packed) -> None:
    with pytest.raises(ConfigError, match="on_error"):
        fastload.ShardDataset(small.root, on_error="ignore")
    with pytest.raises(ConfigError, match="even"):
        fastload.ShardDataset(small.root, even="evenly")
    with pytest.raises(ConfigError, match=r"(?i)parquet"):
        fastload.ShardDataset(small.root, columns=["cls"])


# --- Parquet ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parquet(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    # The same files as ``small``, as Parquet: the same shards, so the same canonical order.
    packed = pack_files(
        tmp_path_factory.mktemp("parquet"),
        small_files(),
        max_samples=7,
        shard_format="parquet",
        row_group_bytes=4096,
    )
    assert packed.counts == [7, 7, 7, 7, 2]
    assert any(len(s["row_groups"]) > 1 for s in packed.index["shards"])
    return packed


def test_parquet_column_projection(parquet: Packed, small: Packed) -> None:
    kw = {"seed": 4, "shuffle_buffer": 5}
    samples = all_samples(parquet.root.as_posix(), num_workers=2, columns=["cls"], **kw)
    assert [s["__key__"] for s in samples] == keys_of(make_loader(small, batch_size=7, **kw)[1])
    for s in samples:
        assert set(s) == {"__key__", "__shard__", "__index__", "cls"}
        assert s["cls"] == int(parquet.samples[s["__key__"]]["cls"])
        check_position(parquet, s)


def test_parquet_all_columns(parquet: Packed) -> None:
    samples = all_samples(parquet, num_workers=1, decode=False)
    assert [s["__key__"] for s in samples] == parquet.keys
    for s in samples:
        assert {k: v for k, v in s.items() if not k.startswith("__")} == parquet.samples[s["__key__"]]
        check_position(parquet, s)


# --- shards that do not match their index ---------------------------------------------------------


def retitle_member(data: bytearray, offset: int, name: bytes) -> None:
    """Give the tar member whose header is at ``offset`` another name, with a valid header checksum."""
    header = data[offset : offset + 512]
    header[0:100] = name.ljust(100, b"\0")
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data[offset : offset + 512] = header


@pytest.fixture
def copied(small: Packed, tmp_path: Path) -> Packed:
    shutil.copytree(small.root, tmp_path / "ds")
    return Packed(tmp_path / "ds", small.samples, small.index)


def tamper(packed: Packed, shard: int, how: str) -> str:
    entry = packed.index["shards"][shard]
    path = packed.root / entry["name"]
    data = bytearray(path.read_bytes())
    offset = entry["offsets"][3]
    if how == "renamed":  # a well-formed tar whose sample 3 has another key than the index says
        assert data[offset : offset + 10] == b"s/%04d.bin" % (7 * shard + 3)
        retitle_member(data, offset, b"s/9999.bin")
    elif how == "garbage":  # bytes of a header overwritten
        data[offset : offset + 64] = bytes(range(64))
    else:  # cut short
        data = data[: offset + 100]
    path.write_bytes(bytes(data))
    return entry["name"]


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("renamed", "not the keys the index lists"),
        ("garbage", "corrupt tar header"),
        ("truncated", "shorter"),
    ],
)
def test_a_tampered_shard_raises_instead_of_returning_wrong_data(copied: Packed, how: str, says: str) -> None:
    name = tamper(copied, 2, how)
    _, dl = make_loader(copied, batch_size=2, decode=False, loader={"collate_fn": list})
    delivered: list[dict] = []
    with pytest.raises(VerifyError, match=says) as info:
        for batch in dl:
            delivered += batch
    assert info.value.shard == name
    assert name in str(info.value)
    # Whatever came before the error was right.
    assert len(delivered) <= 7 * 2 + 3
    for s in delivered:
        assert {k: v for k, v in s.items() if not k.startswith("__")} == copied.samples[s["__key__"]]


@pytest.mark.usefixtures("prompt_worker_shutdown")
def test_a_tampered_shard_raises_in_a_worker_too(copied: Packed) -> None:
    name = tamper(copied, 1, "renamed")
    with pytest.raises(VerifyError, match="not the keys the index lists") as info:
        all_samples(copied, num_workers=2, batch_size=2)
    # the worker's error arrives as itself (type, attributes), with the worker's traceback as a note
    assert info.value.shard == name
    assert name in str(info.value)
    notes = getattr(info.value, "__notes__", None)
    if notes is not None:
        assert any("DataLoader worker" in n and "Traceback" in n for n in notes)


def test_a_batch_whose_samples_are_all_skipped_still_counts_as_a_step(broken: Packed) -> None:
    """Equal step counts on every rank under DDP: a chunk whose samples all failed yields the batch before it
    again (the one after it, at the start), counted in loader.repeated_batches."""
    for first in (False, True):
        bad = set(broken.keys[0:4] if first else broken.keys[4:8])

        def fail(sample: dict[str, Any], bad: set[str] = bad) -> dict[str, Any]:
            if sample["__key__"] in bad:
                raise ValueError("undecodable")
            return sample

        for workers in (0, 2):
            ds = fastload.ShardDataset(broken.root, decode=False, map=fail, on_error="skip")
            dl = fastload.DataLoader(ds, batch_size=4, num_workers=workers)
            with pytest.warns(UserWarning, match="every sample of a batch was skipped"):
                batches = [list(b["__key__"]) for b in dl]
            assert len(batches) == -(-len(broken.keys) // 4), "one step per chunk, skipped or not"
            assert dl.repeated_batches == 1
            assert batches[0] == batches[1]
            assert [k for b in batches[1:] for k in b] == [k for k in broken.keys if k not in bad]
