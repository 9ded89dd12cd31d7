"""ShardDataset's options as grouped config objects: the same dataset as with the flat keywords, which all
keep working; a group and its own keywords together are refused; each group checks its values."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import fastload
from fastload.errors import ConfigError
from fastload.train.options import CacheConfig, DecodeConfig, OrderConfig, PrefetchConfig

from .helpers import Packed

FLAT_KEYWORDS = {
    "seed", "shuffle_buffer", "even", "rank", "world_size", "batch_size",
    "decode", "images", "allow_pickle", "map", "columns", "on_error",
    "prefetch_bytes", "prefetch_threads", "prefetch_runs",
    "cache_dir", "cache_limit_bytes", "cache_verify", "s3_config",
}  # fmt: skip


def keys(ds: fastload.ShardDataset) -> list[str]:
    return [s["__key__"] for s in ds]


def test_every_flat_keyword_is_still_a_keyword() -> None:
    params = inspect.signature(fastload.ShardDataset).parameters
    assert set(params) >= FLAT_KEYWORDS
    assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in FLAT_KEYWORDS)


def test_groups_give_the_same_dataset_as_flat_keywords(uneven: Packed) -> None:
    flat = fastload.ShardDataset(
        uneven.root, seed=3, shuffle_buffer=4, rank=1, world_size=2, decode=False, prefetch_threads=2
    )
    grouped = fastload.ShardDataset(
        uneven.root,
        order=OrderConfig(seed=3, shuffle_buffer=4, rank=1, world_size=2),
        decoding=DecodeConfig(decode=False),
        prefetch=PrefetchConfig(threads=2),
    )
    got = keys(grouped)  # (a second pass would read the next epoch)
    assert got == keys(flat)
    assert got == uneven.rank_keys(rank=1, world_size=2, seed=3, epoch=0, shuffle_buffer=4)
    assert (grouped.order, grouped.decoding, grouped.prefetch) == (flat.order, flat.decoding, flat.prefetch)
    assert (grouped.seed, grouped.shuffle_buffer, grouped.batch_size) == (3, 4, None)
    # a flat keyword left at its default does not conflict with its group
    assert fastload.ShardDataset(uneven.root, seed=None, order=OrderConfig(seed=3)).seed == 3


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"seed": 1, "order": OrderConfig(seed=2)}, "seed"),
        ({"decode": False, "decoding": DecodeConfig()}, "decode"),
        ({"prefetch_bytes": 0, "prefetch": PrefetchConfig()}, "prefetch_bytes"),
        ({"cache_verify": False, "caching": CacheConfig()}, "cache_verify"),
    ],
)
def test_a_group_and_its_own_keyword_are_refused(uneven: Packed, kwargs: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        fastload.ShardDataset(uneven.root, **kwargs)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: OrderConfig(even="evenly"), "even="),
        (lambda: OrderConfig(batch_size=0), "batch_size=0"),
        (lambda: OrderConfig(rank=1), "world_size"),
        (lambda: DecodeConfig(on_error="ignore"), "on_error="),
        (lambda: PrefetchConfig(threads=0), "threads=0"),
        (lambda: PrefetchConfig(max_bytes=-1), "prefetch_bytes=-1"),
        (lambda: CacheConfig(limit_bytes=10), "cache_dir"),
    ],
)
def test_each_group_checks_its_values(make: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make()  # type: ignore[operator]


def test_groups_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        OrderConfig().seed = 1  # type: ignore[misc]
