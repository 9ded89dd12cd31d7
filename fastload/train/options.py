"""``ShardDataset``'s options, grouped: which samples in which order, how they are decoded, how far reads run
ahead, and where remote shards are kept. Each group is a frozen keyword-only dataclass that checks itself;
``ShardDataset`` takes either a group (``prefetch=PrefetchConfig(...)``) or its flat keywords
(``prefetch_bytes=...``), never both for one group.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

from fastload.core.filters import normalise
from fastload.core.sharding import EVEN_POLICIES
from fastload.errors import ConfigError

DEFAULT_PREFETCH_BYTES = 64 << 20
DEFAULT_HOLD_BYTES = 256 << 20  # samples of a shuffled order read ahead of their turn, per worker
DEFAULT_TABLES_BYTES = 32 << 20  # sample tables kept between epochs: ~100,000 samples' worth


@dataclass(frozen=True, kw_only=True)
class OrderConfig:
    """Which samples this rank reads and in which order (see :mod:`fastload.core.sharding`).

    ``seed`` shuffles shard order and, with ``shuffle_buffer`` > 1, samples within a bounded window; None
    keeps index order. ``even`` equalises per-rank counts (``split``, ``drop``, ``pad``, ``none``).
    ``rank``/``world_size``: from ``torch.distributed`` or ``RANK``/``WORLD_SIZE`` when None.
    ``batch_size``: the DataLoader's batch size, when the dataset is given to ``torch.utils.data.DataLoader``
    with several workers: then workers take turns over chunks of it, and the order reaching the training
    loop is the same for any ``num_workers``. None (the default) lets each worker read one contiguous
    stretch of the rank's order instead (long reads; the order then depends on ``num_workers``).
    ``filters``: only the rows that match, in pyarrow's DNF convention (``[("split", "=", "train")]``, or a
    list of such lists for OR; see ``docs/parquet.md``), decided before the epoch is planned, so every
    policy above applies to the filtered dataset.
    """

    seed: int | None = None
    shuffle_buffer: int = 0
    even: str = "split"
    rank: int | None = None
    world_size: int | None = None
    batch_size: int | None = None
    filters: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "filters", normalise(self.filters))
        if self.even not in EVEN_POLICIES:
            raise ConfigError(f"even={self.even!r}; choose one of {', '.join(EVEN_POLICIES)}")
        if self.shuffle_buffer < 0:
            raise ConfigError(f"shuffle_buffer={self.shuffle_buffer} must be >= 0")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size} must be >= 1 (or None)")
        if (self.rank is None) != (self.world_size is None):
            raise ConfigError(
                f"give both rank= and world_size= (got rank={self.rank}, world_size={self.world_size})"
            )


@dataclass(frozen=True, kw_only=True)
class DecodeConfig:
    """What a sample becomes: fields decoded by extension (``decode``; ``images`` with Pillow; pickles only
    with ``allow_pickle``), then ``map``. ``columns`` projects Parquet shards. ``on_error``: ``raise`` (with
    the shard and key) or ``skip`` (counted and named) for a sample that fails to decode or map, or whose
    bytes fail their CRC32C.
    ``partition_columns``: add each shard's hive partition values (``split=train`` -> ``"split": "train"``,
    typed as pyarrow types them) to its samples.

    ``verify_samples``: check each sample's bytes as read against the CRC32C its index records (tar shards
    of an index v2, headers and padding included; a mismatch raises ``SampleChecksumError`` naming the
    shard, key and byte offset, or with ``on_error="skip"`` leaves the sample out). False skips that
    check, which costs one pass of the C CRC32C over the bytes read (about 10% of a raw local read from the
    page cache, nothing next to decoding). Parquet page checksums (where written) and TFRecord record CRCs
    are always checked."""

    decode: bool = True
    images: bool = True
    allow_pickle: bool = False
    map: Callable[[dict[str, Any]], Any] | None = None
    columns: Sequence[str] | None = None
    on_error: str = "raise"
    verify_samples: bool = True
    partition_columns: bool = False

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error={self.on_error!r}; choose 'raise' or 'skip'")

    @property
    def plain(self) -> bool:
        """Nothing to decode or map: nothing can fail or be skipped."""
        return not self.decode and self.map is None


@dataclass(frozen=True, kw_only=True)
class PrefetchConfig:
    """Reads run ahead of the consumer in each worker: ``threads`` fetch planned reads in order, at most
    ``runs`` of them and ``max_bytes`` not yet consumed. Memory per worker: ``max_bytes`` + the read in use
    (at most 16 MiB). ``max_bytes`` None: 64 MiB for ``s3://`` datasets, 0 (reads in the consuming thread)
    for local ones, where the page cache and kernel readahead already hide the disk.

    ``hold_bytes``: in formats read by row groups (Parquet), a row group read for one sample of a shuffled
    order is read for the later samples of it too, and those wait for their turn, at most ``hold_bytes`` of
    them per worker (their row groups' stored bytes; about what a streaming shuffle buffer of the same
    samples holds): each row group is then read about once per pass instead of once per sample. 0 turns
    this off. Memory per worker: ``max_bytes`` + ``hold_bytes`` + the read in use."""

    max_bytes: int | None = None
    threads: int = 8
    runs: int = 64
    hold_bytes: int = DEFAULT_HOLD_BYTES

    def __post_init__(self) -> None:
        if self.threads < 1 or self.runs < 1:
            raise ConfigError(f"prefetch threads={self.threads} and runs={self.runs} must be >= 1")
        if self.hold_bytes < 0:
            raise ConfigError(f"hold_bytes={self.hold_bytes} must be >= 0 (0 turns holding off)")
        if self.max_bytes is not None and self.max_bytes < 0:
            raise ConfigError(f"prefetch_bytes={self.max_bytes} must be >= 0 (0 turns prefetch off)")

    def resolved(self, *, remote: bool) -> PrefetchConfig:
        """This config with ``max_bytes`` decided for a remote or local dataset."""
        if self.max_bytes is not None:
            return self
        return replace(self, max_bytes=DEFAULT_PREFETCH_BYTES if remote else 0)


@dataclass(frozen=True, kw_only=True)
class CacheConfig:
    """Whole remote shards kept on local disk in the folder ``path`` (None: no cache), at most ``limit_bytes``
    (least recently used evicted), checked against the index's CRC32C when ``verify``. ``tables_bytes``:
    index v2 sample tables kept in memory between epochs, in each process, up to about this many bytes
    (~320 a sample; least recently read dropped first): later epochs then neither fetch nor decode them
    again. 0 drops each table when its shard is done."""

    path: str | os.PathLike[str] | None = None
    limit_bytes: int | None = None
    verify: bool = True
    tables_bytes: int = DEFAULT_TABLES_BYTES

    def __post_init__(self) -> None:
        if self.tables_bytes < 0:
            raise ConfigError(f"cache_tables_bytes={self.tables_bytes} must be >= 0 (0 keeps none)")
        if self.limit_bytes is not None and self.path is None:
            raise ConfigError("cache_limit_bytes= needs cache_dir= (the folder to keep shards in)")
        if self.path is not None:
            object.__setattr__(self, "path", os.path.abspath(os.fspath(self.path)))


C = TypeVar("C", OrderConfig, DecodeConfig, PrefetchConfig, CacheConfig)


def merge(given: C | None, cls: type[C], flat: dict[str, Any], names: dict[str, str]) -> C:
    """``given``, or ``cls`` built from the flat keywords (``names``: keyword -> field). A flat keyword set
    to other than its default alongside ``given`` is refused: one would silently win."""
    defaults = {f.name: f.default for f in fields(cls)}
    changed = [k for k, field_name in names.items() if flat[k] != defaults[field_name]]
    if given is None:
        return cls(**{field_name: flat[k] for k, field_name in names.items()})
    if changed:
        raise ConfigError(
            f"{', '.join(changed)} and {cls.__name__} both given; put {', '.join(changed)} into the "
            f"{cls.__name__} or leave the {cls.__name__} out"
        )
    if not isinstance(given, cls):
        raise ConfigError(f"expected a {cls.__name__}, got {type(given).__name__}")
    return given
