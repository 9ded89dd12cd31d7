"""The dataset view (``fastload.train.view``): opened once, held by ShardDataset and MapDataset, the one
place a shard's full entry is made (table memo, cache, format check), and pickled without its per-process
cache and memo; built on ``fastload.formats.DatasetEntries``, which the flows without torch (verify, index
--upgrade, inspect, Ray, bench) hold, and through which every full entry is made."""

from __future__ import annotations

import ast
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload import formats
from fastload.storage import tables
from fastload.train.options import CacheConfig
from fastload.train.tablememo import TableMemo
from fastload.train.view import DatasetView, open_dataset

from .helpers import Packed
from .test_v2 import to_v2


@pytest.fixture(scope="module")
def v2(uneven: Packed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return to_v2(uneven, tmp_path_factory.mktemp("view") / "ds")


def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the shards whose sample tables are fetched from now on."""
    fetched: list[str] = []
    real = tables.fetch_table

    def fetch(root: str, entry: Any, **kw: Any) -> Any:
        fetched.append(entry.name)
        return real(root, entry, **kw)

    monkeypatch.setattr(tables, "fetch_table", fetch)
    return fetched


def test_entry_attaches_the_table_once_through_the_memo(
    v2: Path, uneven: Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    view = open_dataset(v2)
    assert all(s.detached for s in view.shards())
    assert view.counts.tolist() == [s.samples for s in view.index.shards]
    fetched = counted(monkeypatch)
    keys = [k for i in range(len(view.index.shards)) for k in view.entry(i).keys]
    assert keys == uneven.keys and not any(view.entry(i).detached for i in range(len(view.index.shards)))
    memo = view.table_memo()
    assert memo is not None and memo.hits == len(view.index.shards)
    assert fetched == [s.name for s in view.index.shards]  # once each, the second time from the memo

    bare = open_dataset(v2, caching=CacheConfig(tables_bytes=0))
    assert bare.table_memo() is None
    assert [k for i in range(len(bare.index.shards)) for k in bare.entry(i).keys] == uneven.keys
    assert len(fetched) == 2 * len(view.index.shards)


def test_shard_and_map_datasets_hold_one_view(v2: Path, uneven: Packed) -> None:
    ds = fastload.ShardDataset(v2, decode=False)
    mds = fastload.MapDataset(v2, decode=False)
    for d in (ds, mds):
        assert isinstance(d.view, DatasetView)
        assert (d.root, d.index, d.filters, d.filtered, d.partitions) == (
            d.view.root,
            d.view.index,
            None,
            None,
            None,
        )
    assert ds.shard_counts().tolist() == mds.view.counts.tolist() == uneven.counts
    assert mds.view.table_memo() is None  # (its open shards keep their tables)
    assert ds.table_memo() is ds.view.table_memo() is not None
    assert sorted(s["__key__"] for s in ds) == sorted(uneven.keys) == sorted(s["__key__"] for s in mds)


def test_a_pickled_view_makes_its_cache_and_memo_again(v2: Path, tmp_path: Path, uneven: Packed) -> None:
    view = open_dataset(v2, caching=CacheConfig(path=tmp_path / "cache"))
    cache, memo = view.cache(), view.table_memo()
    assert cache is not None and memo is not None
    view.entry(0)
    assert len(memo) == 1
    state = view.__getstate__()
    assert state["_cache_obj"] is None and state["_memo_obj"] is None
    again = pickle.loads(pickle.dumps(view))
    assert again.cache() is not cache and again.cache() is not None
    fresh = again.table_memo()
    assert fresh is not None and fresh is not memo and len(fresh) == 0
    assert again.entry(0).keys == view.entry(0).keys == uneven.keys[: uneven.counts[0]]


def test_columns_and_a_bad_cache_folder_fail_when_opened(v2: Path, tmp_path: Path) -> None:
    with pytest.raises(fastload.errors.ConfigError, match="columns= projects Parquet shards"):
        open_dataset(v2, columns=["a"])
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    with pytest.raises(fastload.errors.ConfigError, match="cannot be created"):
        open_dataset(v2, caching=CacheConfig(path=blocker))


def test_entries_with_a_memo_read_each_table_once(v2: Path, tmp_path: Path, uneven: Packed) -> None:
    """Held with a memo, the second pass over a dataset's entries reads no table: it still gives every
    shard's keys after the sample tables are gone, where one without a memo names the missing table."""
    root = tmp_path / "ds"
    shutil.copytree(v2, root)
    dataset = formats.DatasetEntries.open(root / "index.json")
    assert dataset.root == str(root) and dataset.shard_format == "tar"
    memo = TableMemo(1 << 20)
    n = len(dataset.index.shards)
    assert [k for i in range(n) for k in dataset.entry(i, memo=memo).keys] == uneven.keys
    for shard in dataset.index.shards:
        assert shard.table is not None
        (root / shard.table.name).unlink()
    assert [k for i in range(n) for k in dataset.entry(i, memo=memo).keys] == uneven.keys
    assert memo.hits == n
    with pytest.raises((OSError, fastload.errors.FastloadError), match=dataset.index.shards[0].table.name):
        dataset.entry(0)


def test_the_view_is_built_on_dataset_entries(v2: Path) -> None:
    view = open_dataset(v2)
    assert isinstance(view.entries, formats.DatasetEntries)
    assert (view.root, view.index, view.s3_config) == (view.entries.root, view.entries.index, None)
    again = pickle.loads(pickle.dumps(view))
    assert again.entries.index.shards == view.index.shards and again.index is again.entries.index


def _calls_full_entry(path: Path) -> list[int]:
    """The lines of ``path`` that call ``full_entry`` (by name or as an attribute)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == "full_entry")
            or (isinstance(node.func, ast.Attribute) and node.func.attr == "full_entry")
        )
    ]


def test_only_dataset_entries_calls_full_entry() -> None:
    """Every flow (the view, filters, verify, upgrade, inspect, Ray, bench) gets a shard's full entry from a
    held :class:`~fastload.formats.DatasetEntries`: ``formats.entries`` is the one module calling
    ``full_entry``, once (in ``DatasetEntries.entry``)."""
    package = Path(fastload.__file__).parent
    calls = {
        str(p.relative_to(package)): lines
        for p in sorted(package.rglob("*.py"))
        if (lines := _calls_full_entry(p))
    }
    assert list(calls) == ["formats/entries.py"] and len(calls["formats/entries.py"]) == 1, calls
