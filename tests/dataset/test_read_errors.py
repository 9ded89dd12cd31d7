"""Mistakes on the read side get a message that says what is wrong: a ``columns=`` that is not a column of
the Parquet dataset (the columns listed, as ``filters=`` does), a ``map=`` function that raises (named, with
the sample, its exception chained: not "decoding failed"), a state that is not a fastload state (what one
looks like), and a checkpoint refused because the dataset or settings changed (what differs, not two
digests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import fastload
from fastload.errors import ConfigError, FastloadError

from .helpers import Packed, make_loader, pack_files, small_files

# --- columns= -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parquet(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    return pack_files(tmp_path_factory.mktemp("pq"), small_files(), max_samples=7, shard_format="parquet")


@pytest.mark.parametrize("kind", [fastload.ShardDataset, fastload.MapDataset])
def test_an_unknown_column_is_refused_listing_the_columns(parquet: Packed, kind: Any) -> None:
    with pytest.raises(
        ConfigError, match=r"columns= names 'wavv', not a column of .*its columns: bin, cls, txt"
    ):
        kind(parquet.root, columns=["wavv"])
    assert [sorted(s) for s in kind(parquet.root, columns=["cls"], decode=False)][:1] == [
        ["__index__", "__key__", "__shard__", "cls"]
    ]


def test_an_unknown_column_of_a_foreign_parquet_folder(tmp_path: Path) -> None:
    folder = tmp_path / "table"
    folder.mkdir()
    pq.write_table(pa.table({"wav": [b"a", b"b"], "label": [1, 2]}), folder / "part-0.parquet")
    unknown = pytest.raises(ConfigError, match=r"'wavv', not a column .*its columns: label, wav")
    with pytest.warns(UserWarning, match="no index.json"), unknown:
        fastload.ShardDataset(folder, columns=["wavv", "label"])


# --- map= -------------------------------------------------------------------------------------------------


def needs_wav(sample: dict[str, Any]) -> Any:
    return sample["wav"]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_map_function_is_named_with_the_sample(parquet: Packed, workers: int) -> None:
    _, dl = make_loader(parquet, batch_size=4, num_workers=workers, map=needs_wav)
    with pytest.raises(FastloadError) as info:
        next(iter(dl))
    message = str(info.value)
    assert f"map= function {needs_wav.__module__}.needs_wav failed on it" in message, message
    assert "shard-000000.parquet" in message and "'s/0000'" in message and "KeyError('wav')" in message
    assert "decoding failed" not in message and "decode=False" not in message
    if workers == 0:
        assert isinstance(info.value.__cause__, KeyError)
    else:  # (the worker's traceback, with the chained KeyError, travels as a note)
        assert "KeyError" in "".join(info.value.__notes__)


def test_a_failing_map_function_in_map_dataset(parquet: Packed) -> None:
    with pytest.raises(FastloadError, match=r"map= function .*needs_wav failed on it") as info:
        fastload.MapDataset(parquet.root, map=needs_wav)[3]
    assert isinstance(info.value.__cause__, KeyError)
    ds = fastload.MapDataset(parquet.root, map=needs_wav, on_error="skip")
    assert ds[[0, 1]] == [] and ds.skipped == 2
    assert [s.reason.startswith("the map= function") for s in ds.skipped_samples] == [True, True]


# --- states and checkpoints --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    return pack_files(tmp_path_factory.mktemp("small7"), small_files(), max_samples=7)


@pytest.fixture(scope="module")
def repacked(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    """The same samples as ``small``, re-packed into shards of 5."""
    return pack_files(tmp_path_factory.mktemp("small5"), small_files(), max_samples=5)


@pytest.mark.parametrize("state", [{}, "x", None, {"epoch": 0}])
def test_a_state_that_is_not_a_fastload_state_says_what_one_is(small: Packed, state: Any) -> None:
    for target, owner in [
        (fastload.ShardDataset(small.root), "ShardDataset"),
        (make_loader(small, batch_size=2)[1], "fastload.DataLoader"),
        (fastload.Mix({"a": fastload.ShardDataset(small.root)}), "Mix"),
    ]:
        with pytest.raises(ConfigError, match=rf"{owner}\.load_state_dict\(\) takes what .*state_dict\(\)"):
            target.load_state_dict(state)


def checkpoint(source: Path, **kw: Any) -> dict[str, Any]:
    ds = fastload.ShardDataset(source, decode=False, **kw)
    it = iter(ds)
    next(it)
    return ds.state_dict()


def test_a_checkpoint_of_a_repacked_dataset_says_the_shards_differ(small: Packed, repacked: Packed) -> None:
    state = checkpoint(small.root, seed=1)
    with pytest.raises(ConfigError) as info:
        fastload.ShardDataset(repacked.root, seed=1).load_state_dict(state)
    message = str(info.value)
    assert "shards: 5 in the checkpoint, 5 here" not in message
    assert "shards: 5 in the checkpoint, 6 here" in message and "re-packed" in message
    assert state["order"] not in message  # no digests


def test_a_checkpoint_with_other_shard_contents_says_so(small: Packed, tmp_path: Path) -> None:
    files = small_files()
    files["s/0004.txt"] = b"other text"  # the same names and counts, other bytes
    other = pack_files(tmp_path, files, max_samples=7)
    state = checkpoint(small.root, seed=1)
    with pytest.raises(
        ConfigError, match=r"the shards' names, sample counts or checksums \(the dataset was re-packed"
    ):
        fastload.ShardDataset(other.root, seed=1).load_state_dict(state)


def test_a_checkpoint_with_other_order_settings_names_them(small: Packed) -> None:
    state = checkpoint(small.root, seed=1, shuffle_buffer=4)
    with pytest.raises(ConfigError, match=r"shuffle_buffer: 4 in the checkpoint, 0 here") as info:
        fastload.ShardDataset(small.root, seed=1).load_state_dict(state)
    assert "shards" not in str(info.value).split("differs from this run's:")[1].split(".")[0]
    old = {k: v for k, v in state.items() if k not in ("shards", "layout", "shuffle_buffer", "even")}
    with pytest.raises(ConfigError, match=r"one of the shards .*shuffle_buffer or even \(this checkpoint"):
        fastload.ShardDataset(small.root, seed=1).load_state_dict(old)  # (as older versions saved it)


def test_a_mix_checkpoint_says_what_differs(small: Packed, repacked: Packed) -> None:
    def mix(b: Path, weights: list[float]) -> fastload.Mix:
        return fastload.Mix(
            {"a": fastload.ShardDataset(small.root, seed=1), "b": fastload.ShardDataset(b, seed=1)}, weights
        )

    state = mix(small.root, [1, 1]).state_dict()
    with pytest.raises(ConfigError, match=r"weights \(per schedule step\): \[\[0, \[1.0, 1.0\]\]\] in the"):
        mix(small.root, [1, 3]).load_state_dict(state)
    with pytest.raises(ConfigError, match=r"source 'b': its sample order \(its shards, re-packed") as info:
        mix(repacked.root, [1, 1]).load_state_dict(state)
    assert "source 'a'" not in str(info.value)
    with pytest.raises(ConfigError, match=r"this is a fastload\.Mix's state"):
        fastload.ShardDataset(small.root, seed=1).load_state_dict(state)
