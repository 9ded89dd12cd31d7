"""Listing on Ceph RGW: 2,500 keys under a prefix span three ListObjectsV2 pages of 1,000. ``fastload ls -r``
prints every one, ``fastload ls`` one level with ``PRE`` lines, ``list_objects`` yields all in key order."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest
from s3util import run_cli, s3_config, s3_env

from fastload.s3.listing import ObjectInfo, list_objects

COUNT = 2500
TOP_LEVEL = ["tree/top-a.txt", "tree/top-b.txt", "tree/ü top.txt"]
SUB_PREFIXES = ["tree/d0/", "tree/d1/", "tree/d2/", "tree/é/"]


def tree_keys() -> list[str]:
    """2,500 keys under ``tree/``: three at the top, the rest in four sub-prefixes (one nested deeper)."""
    keys = list(TOP_LEVEL)
    i = 0
    while len(keys) < COUNT:
        folder = SUB_PREFIXES[i % len(SUB_PREFIXES)]
        keys.append(f"{folder}{'deeper/' if i % 7 == 0 else ''}{i:05d}.bin")
        i += 1
    return keys


@pytest.fixture(scope="module")
def listed(rgw: Any, rgw_client: Any, module_bucket: Callable[..., str]) -> SimpleNamespace:
    name = module_bucket(rgw)
    keys = tree_keys()
    decoys = ["tree-sibling/x.bin", "treehouse.bin", "a-before.bin", "zz/after.bin"]  # outside the prefix
    with ThreadPoolExecutor(max_workers=24) as pool:
        list(pool.map(lambda k: rgw_client.put_object(Bucket=name, Key=k, Body=k.encode()), keys + decoys))
    return SimpleNamespace(bucket=name, keys=keys, sizes={k: len(k.encode()) for k in keys})


def parse_ls(stdout: str) -> list[tuple[str, str]]:
    """``(size or 'PRE', name)`` per line of ``fastload ls``."""
    rows = []
    for line in stdout.splitlines():
        size, name = line.split(None, 1)
        rows.append((size, name))
    return rows


def test_ls_recursive_prints_all_2500_keys(rgw: Any, listed: SimpleNamespace) -> None:
    proc = run_cli("ls", "-r", f"s3://{listed.bucket}/tree/", env=s3_env(rgw))
    rows = parse_ls(proc.stdout)
    assert len(rows) == COUNT
    assert [name for _, name in rows] == sorted(listed.keys)
    assert all(int(size) == listed.sizes[name] for size, name in rows)


def test_ls_one_level_shows_sub_prefixes_as_pre(rgw: Any, listed: SimpleNamespace) -> None:
    proc = run_cli("ls", f"s3://{listed.bucket}/tree/", env=s3_env(rgw))
    rows = parse_ls(proc.stdout)
    assert sorted(name for size, name in rows if size == "PRE") == sorted(SUB_PREFIXES)
    assert sorted(name for size, name in rows if size != "PRE") == sorted(TOP_LEVEL)
    assert len(rows) == len(SUB_PREFIXES) + len(TOP_LEVEL)


def test_list_objects_pages_through_all_keys_in_order(
    rgw: Any, rgw_env: dict[str, str], listed: SimpleNamespace
) -> None:
    from fastload.s3.client import get_client

    config = s3_config(rgw)
    inner = get_client(config)
    pages: list[int] = []

    class CountingClient:
        def list_objects_v2(self, **params: Any) -> Any:
            page = inner.list_objects_v2(**params)
            pages.append(len(page.get("Contents", [])))
            return page

    found = list(list_objects(listed.bucket, "tree/", config=config, client=CountingClient()))
    assert all(isinstance(o, ObjectInfo) for o in found)
    assert [o.key for o in found] == sorted(listed.keys)  # type: ignore[union-attr]
    assert pages == [1000, 1000, 500]
