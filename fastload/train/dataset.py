"""``fastload.ShardDataset``: exactly-once, deterministic, resumable reading of a packed dataset, in the
training process or in ``torch.utils.data.DataLoader`` workers (``fastload.DataLoader``: :mod:`.loader`).

The order of samples is decided by ``core.sharding`` from (seed, epoch, rank, world size). How a rank's
order is dealt to DataLoader workers:

- ``batch_size`` given (``fastload.DataLoader`` always gives its own): workers take turns over chunks of
  ``batch_size`` samples, the same way DataLoader takes turns over its workers, so the order reaching the
  training loop is the rank's order for any ``num_workers``;
- ``batch_size`` None under ``torch.utils.data.DataLoader`` with several workers: each worker reads one
  contiguous stretch of the rank's order (runs of consecutive samples, one ranged read each), exactly once,
  deterministically; the order reaching the loop depends on ``num_workers``, which a warning says once.

Position (epoch, resume point) is shared with every worker through shared memory and saved and restored
with ``state_dict()``/``load_state_dict()`` (the ``Stateful`` protocol of torchdata's
``StatefulDataLoader``, which calls them in each worker).

(Over 400 lines by a few: the class is the public face of reading, mostly properties and docstrings; its
options, position, source and shard runs are modules of their own.)
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data

from fastload.config import S3Config
from fastload.core.index import INDEX_NAME
from fastload.core.sharding import (
    RankPlan,
    rank_order,
    resumed_rank_order,
    split_rotation,
    worker_position_array,
    worker_span,
)
from fastload.core.versions import versions_of
from fastload.errors import ConfigError
from fastload.formats.native import accelerate_shuffle
from fastload.gcpause import gc_paused
from fastload.storage import access as storage
from fastload.storage.cache import ShardCache
from fastload.train import telemetry
from fastload.train.chunks import chunks_of
from fastload.train.filtering import (
    check_selection,
    selection_state,
)
from fastload.train.options import (
    DEFAULT_TABLES_BYTES,
    CacheConfig,
    DecodeConfig,
    OrderConfig,
    PrefetchConfig,
    merge,
)
from fastload.train.position import Iteration, PositionMethods, SharedPosition
from fastload.train.reading import read_samples
from fastload.train.statecheck import check_shape, order_parts, order_refusal, version_refusal
from fastload.train.tablememo import TableMemo
from fastload.train.telemetry import SharedCounters, TelemetryMethods
from fastload.train.view import DatasetView, open_dataset

ORDER_WARNING = (
    "fastload.ShardDataset is read by {workers} DataLoader workers without batch_size=, so each worker "
    "reads its own contiguous stretch of the epoch: every sample still comes exactly once and the order is "
    "deterministic, but it depends on num_workers. For the same order with any num_workers, give the "
    "dataset the DataLoader's batch size too (ShardDataset(..., batch_size=B)), or use fastload.DataLoader."
)


# ShardDataset's flat keywords, by option group: keyword -> the group's field
ORDER_KEYWORDS = {
    k: k for k in ("seed", "shuffle_buffer", "even", "rank", "world_size", "batch_size", "filters")
}
DECODE_KEYWORDS = {
    k: k
    for k in (
        "decode",
        "images",
        "allow_pickle",
        "map",
        "columns",
        "on_error",
        "verify_samples",
        "partition_columns",
    )
}
PREFETCH_KEYWORDS = {"prefetch_bytes": "max_bytes", "prefetch_threads": "threads", "prefetch_runs": "runs"}
CACHE_KEYWORDS = {
    "cache_dir": "path",
    "cache_limit_bytes": "limit_bytes",
    "cache_verify": "verify",
    "cache_tables_bytes": "tables_bytes",
}


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class ShardDataset(PositionMethods, TelemetryMethods, torch.utils.data.IterableDataset[dict[str, Any]]):
    """Samples of a packed dataset (a folder or ``s3://`` prefix with ``index.json``; tar or TFRecord
    shards without one), as WebDataset-style dicts with ``__key__``, ``__shard__``, ``__index__`` and one
    entry per field.

    Options, by group (each also takes a config object, e.g. ``order=OrderConfig(...)``, see
    :mod:`fastload.train.options`): order ``seed``, ``shuffle_buffer``, ``even``, ``rank``, ``world_size``,
    ``batch_size``, ``filters`` (rows kept, pyarrow's DNF: ``docs/parquet.md``); decoding ``decode``,
    ``images``, ``allow_pickle``, ``map``, ``columns``, ``on_error``, ``verify_samples`` (each sample's
    CRC32C checked on read; default on), ``partition_columns`` (partition values added to samples);
    prefetch ``prefetch_bytes``, ``prefetch_threads``, ``prefetch_runs``; cache ``cache_dir``,
    ``cache_limit_bytes``, ``cache_verify``, ``cache_tables_bytes`` (index v2 sample tables kept in memory
    between epochs). ``key_column``: for Parquet files without an index, the column
    whose values are ``__key__`` (default ``<file>/<row>``; ``docs/parquet-foreign.md``). ``version``: read
    the dataset as it was at that version (an appended dataset's first shards; default: the newest when
    opened); a checkpoint records the version it read, and an epoch restored after an append finishes over
    it (``docs/training.md``, "A dataset that grows").
    :meth:`epoch_report` says which samples ``even`` dropped or
    repeated.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        seed: int | None = None,
        shuffle_buffer: int = 0,
        even: str = "split",
        rank: int | None = None,
        world_size: int | None = None,
        batch_size: int | None = None,
        filters: Any = None,
        decode: bool = True,
        images: bool = True,
        allow_pickle: bool = False,
        map: Callable[[dict[str, Any]], Any] | None = None,
        columns: Sequence[str] | None = None,
        on_error: str = "raise",
        verify_samples: bool = True,
        partition_columns: bool = False,
        prefetch_bytes: int | None = None,
        prefetch_threads: int = 8,
        prefetch_runs: int = 64,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        cache_verify: bool = True,
        cache_tables_bytes: int = DEFAULT_TABLES_BYTES,
        s3_config: S3Config | None = None,
        key_column: str | None = None,
        version: int | None = None,
        order: OrderConfig | None = None,
        decoding: DecodeConfig | None = None,
        prefetch: PrefetchConfig | None = None,
        caching: CacheConfig | None = None,
    ) -> None:
        super().__init__()
        accelerate_shuffle()  # the C loop of the sample shuffle, where built
        self.order = merge(
            order,
            OrderConfig,
            {
                "seed": seed,
                "shuffle_buffer": shuffle_buffer,
                "even": even,
                "rank": rank,
                "world_size": world_size,
                "batch_size": batch_size,
                "filters": filters,
            },
            ORDER_KEYWORDS,
        )
        self.decoding = merge(
            decoding,
            DecodeConfig,
            {
                "decode": decode,
                "images": images,
                "allow_pickle": allow_pickle,
                "map": map,
                "columns": columns,
                "on_error": on_error,
                "verify_samples": verify_samples,
                "partition_columns": partition_columns,
            },
            DECODE_KEYWORDS,
        )
        wanted = merge(
            prefetch,
            PrefetchConfig,
            {
                "prefetch_bytes": prefetch_bytes,
                "prefetch_threads": prefetch_threads,
                "prefetch_runs": prefetch_runs,
            },
            PREFETCH_KEYWORDS,
        )
        caching = merge(
            caching,
            CacheConfig,
            {
                "cache_dir": cache_dir,
                "cache_limit_bytes": cache_limit_bytes,
                "cache_verify": cache_verify,
                "cache_tables_bytes": cache_tables_bytes,
            },
            CACHE_KEYWORDS,
        )
        self._shared = SharedPosition()  # shared with DataLoader workers, persistent ones included
        self._telemetry = SharedCounters()  # per-stage counters, summed over workers (report())
        self.view: DatasetView = open_dataset(
            source,
            s3_config=s3_config,
            key_column=key_column,
            filters=self.order.filters,
            columns=self.decoding.columns,
            partition_columns=self.decoding.partition_columns,
            caching=caching,
            on_bypass=self._shared.cache_bypassed,  # all processes; warned once
            version=version,
        )
        self.pinned = version  # the version asked for (None: the newest when opened)
        self.prefetch = wanted.resolved(remote=storage.is_remote(self.root))
        self._pending: Iteration | None = None  # a worker-level restore, for this process's next pass
        self._live: Iteration | None = None  # this process's pass under way (or last, in a worker)
        self._chunked = False  # a handle from in_chunks(): yields one Chunk per batch_size samples

    # the options most often read back, by their keyword names
    seed = property(lambda self: self.order.seed)
    shuffle_buffer = property(lambda self: self.order.shuffle_buffer)
    even = property(lambda self: self.order.even)
    batch_size = property(lambda self: self.order.batch_size)
    map = property(lambda self: self.decoding.map)

    # the dataset opened (fastload.train.view), by the names it always had here
    root = property(lambda self: self.view.root)
    index = property(lambda self: self.view.index)
    s3_config = property(lambda self: self.view.s3_config)
    caching = property(lambda self: self.view.caching)
    filters = property(lambda self: self.view.filters, doc="the rows kept (with a partition folder's)")
    filtered = property(lambda self: self.view.filtered)
    partitions = property(lambda self: self.view.partitions)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_plan_cache", None)  # cheaper to recompute in the worker than to pickle
        return state

    def cache(self) -> ShardCache | None:
        """This process's view of the shard cache (None without ``cache_dir``)."""
        return self.view.cache()

    def table_memo(self) -> TableMemo | None:
        """This process's sample tables kept between passes (None with ``cache_tables_bytes=0``)."""
        return self.view.table_memo()

    def __repr__(self) -> str:
        return f"ShardDataset({self.root!r}, {len(self.index.shards)} shards, {self.index.samples} samples)"

    def in_chunks(self, batch_size: int) -> ShardDataset:
        """Another handle on this dataset (the same epoch, position and skip count) whose iteration yields
        one :class:`~fastload.train.chunks.Chunk` per ``batch_size`` samples of the rank's order, dealt to
        workers in turns: what ``fastload.DataLoader`` reads. This dataset itself is left as it was."""
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size} must be >= 1")
        handle = copy.copy(self)
        handle.order = dataclasses.replace(self.order, batch_size=batch_size)
        handle._chunked = True
        handle._pending = handle._live = None
        return handle

    # -- epoch and position -------------------------------------------------------------------------------

    def resumed_from(self) -> tuple[int, int] | None:
        """``(old world size, samples each old rank had delivered)`` when the current epoch was resumed
        from a checkpoint taken under another world size, else None."""
        return self._shared.resumed_from()

    def order_fingerprint(self, world_size: int | None = None, *, span: int | None = None) -> str:
        """A digest of everything that decides the sample order (shards, counts, seed, policies, world size
        (default: this run's), and the order's algorithm where it changed: ``even="split"`` without a seed
        rotates its cut with the epoch from this version on: :func:`~fastload.core.sharding.split_rotation`);
        ``span``: over the first shards only (an older version's; default: those the current epoch reads).
        """
        world = self.rank_world()[1] if world_size is None else world_size
        return self._fingerprint(world, legacy=False, span=span)

    def _span(self, epoch: int) -> int:
        """How many shards ``epoch`` reads: all, or the first ones of the older version a checkpoint of
        that epoch was taken over (``load_state_dict`` after an append)."""
        return self._shared.version_shards(epoch) or len(self.view.counts)

    def _counts(self, span: int | None = None) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Each shard's sample count, or its count of rows kept by ``filters``, of the first ``span``
        shards (default: those the current epoch reads)."""
        counts = self.view.counts
        n = self._span(self.epoch) if span is None else span
        return counts if n >= len(counts) else counts[:n]

    def _version_of(self, span: int) -> int:
        """The number of the version whose shards are the first ``span`` (the newest read if none is)."""
        return next((v.version for v in versions_of(self.index) if v.shards == span), self.view.version)

    def shard_entries(self) -> Sequence[Any]:
        """The shards' entries to read with: the manifest's, with the sample tables that ``filters``
        fetched to decide in place (:meth:`FilteredView.shards`: they are not fetched again)."""
        return self.view.shards()

    def shard_counts(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Each shard's count of samples this dataset reads (what ``filters`` keep): what orders are
        planned over (``fastload.Mix`` plans its sources with it)."""
        return self._counts()

    def pairs_of(self, refs: tuple[Any, Any]) -> list[tuple[int, int]]:
        """``(shards, positions)`` arrays of an order planned over :meth:`shard_counts` as ``(shard, row)``
        pairs to read (positions among the rows ``filters`` keep mapped to the shards' rows)."""
        shards, positions = refs
        if self.filtered is not None:
            positions = self.filtered.rows(shards, positions)
        return list(zip(shards.tolist(), positions.tolist(), strict=True))

    def _samples(self, span: int | None = None) -> int:
        return int(self._counts(span).sum())

    def _rotates(self, world: int, span: int | None = None) -> bool:
        return self.seed is None and self.even == "split" and self._samples(span) % world != 0

    def _fingerprint(self, world: int, *, legacy: bool, span: int | None = None) -> str:
        """:meth:`order_fingerprint`; ``legacy``: as fastload before the split rotation computed it;
        ``span``: over the first shards only (default: those the current epoch reads)."""
        counts = self._counts(span)
        algorithm = ("split-rotates",) if self._rotates(world, len(counts)) and not legacy else ()
        settings = repr((self.seed, self.shuffle_buffer, self.even, world, *algorithm))
        key = (settings, len(counts))
        cached: dict[tuple[str, int], str] = self.__dict__.setdefault("_fingerprints", {})
        if key not in cached:
            digest = hashlib.sha256(settings.encode())
            for shard, count in zip(self.index.shards[: len(counts)], counts.tolist(), strict=True):
                digest.update(f"{shard.name}\0{count}\0{shard.checksum}\n".encode())
            cached[key] = digest.hexdigest()[:16]
        return cached[key]

    def rank_world(self) -> tuple[int, int]:
        return _rank_and_world(self.order.rank, self.order.world_size)

    def plan(self, epoch: int | None = None) -> RankPlan:
        """This rank's samples for ``epoch`` (default: the current one) in canonical order, resumed as the
        shared position says (the last plan is kept: treat it as read-only)."""
        epoch = self.epoch if epoch is None else epoch
        return self._plan(epoch, self.resumed_from() if epoch == self.epoch else None)

    def _plan(self, epoch: int, resumed: tuple[int, int] | None, span: int | None = None) -> RankPlan:
        rank, world = self.rank_world()
        span = self._span(epoch) if span is None else span
        key = (rank, world, epoch, resumed, span)
        cached = self.__dict__.get("_plan_cache")
        if cached is not None and cached[0] == key:
            return cached[1]  # type: ignore[no-any-return]
        counts = self._counts(span)
        o = self.order
        common: dict[str, Any] = {"rank": rank, "world_size": world, "seed": o.seed, "epoch": epoch}
        common.update(even=o.even, shuffle_buffer=o.shuffle_buffer)
        if resumed is not None:
            plan = resumed_rank_order(counts, old_world_size=resumed[0], delivered=resumed[1], **common)
        else:
            plan = rank_order(counts, **common)
        self._plan_cache = (key, plan)
        return plan

    def span_of(self, epoch: int) -> int:
        """How many shards ``epoch`` reads: all, or after a restore over an older version its first ones."""
        return self._span(epoch)

    def refs_of(
        self, first: int, stop: int, *, epoch: int, resumed: tuple[int, int] | None, span: int
    ) -> list[tuple[int, int]]:
        """The ``(shard, row)`` references of positions ``[first, stop)`` of this rank's order for ``epoch``
        (resumed from a world-size change as ``resumed`` says, over the first ``span`` shards), from those
        arguments alone, not the shared position: what a feeder of ``fastload.serve`` reads for a batch."""
        return self.pairs_of(self._plan(epoch, resumed, span).samples[first:stop].arrays())

    def epoch_report(self, epoch: int | None = None) -> dict[str, Any]:
        """Which samples the even policy dropped or repeated this epoch, as (shard name, key) pairs,
        ``skipped_on_error`` (how many samples ``on_error="skip"`` left out this epoch) and
        ``skipped_samples`` (them by name: :attr:`skipped_samples`), and ``cut_from``: with
        ``even="split"`` and no seed, where the epoch's sample sequence started (the cut moves on by
        ``N mod world_size`` samples every epoch, :func:`~fastload.core.sharding.split_rotation`).
        ``cache_bypassed``: shards (and sample tables) read past ``cache_dir`` because it could not store
        them (a full disk), by every process of this dataset since it was made.
        With an index v2 only the sample tables of the shards named are read."""
        epoch = self.epoch if epoch is None else epoch
        plan = self.plan(epoch)
        full: dict[int, Any] = {}

        def named(refs: Sequence[tuple[int, int]]) -> list[tuple[str, str]]:
            out = []
            for s, i in self.pairs_of(
                (np.array([s for s, _ in refs], np.int64), np.array([i for _, i in refs], np.int64))
            ):
                if s not in full:
                    full[s] = self.view.entry(s)
                out.append((full[s].name, full[s].keys[i]))
            return out

        world = self.rank_world()[1]
        return {
            "samples": len(plan.samples),
            "dropped": named(plan.dropped),
            "repeated": named(plan.repeated),
            "skipped_on_error": self.skipped,
            "cache_bypassed": self.cache_bypassed,
            "skipped_samples": self.skipped_samples,
            "cut_from": split_rotation(
                self._samples(self._span(epoch)), world_size=world, seed=self.seed, epoch=epoch
            )
            if self.even == "split"
            else 0,
        }

    def __len__(self) -> int:
        return len(self.plan().samples) - self.start

    # -- the Stateful protocol ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where reading stands: epoch, ``delivered`` (samples of this rank's order delivered before), what
        must match on restore; in a DataLoader worker also ``worker``: its slot and how many of its own
        samples it has passed (torchdata's ``StatefulDataLoader`` keeps one such state per worker)."""
        live = next((x for x in (self._pending, self._live) if x is not None and x.mine()), None)
        info = torch.utils.data.get_worker_info()
        if live is None:
            (epoch, start), consumed = self._saved_epoch(), 0
            resumed = self.resumed_from() if epoch == self.epoch else None
        else:
            resumed, epoch, start, consumed = live.resumed, live.epoch, live.start, live.consumed
        rank, world = self.rank_world()
        span = self._span(epoch)
        state: dict[str, Any] = {
            "epoch": epoch,
            "delivered": start if info is not None else start + consumed,
            "seed": self.seed,
            "world_size": world,
            "rank": rank,
            "samples": self._samples(span),
            "order": self._fingerprint(world, legacy=False, span=span),
            "version": self._version_of(span),
            **self._order_parts(span),
            **selection_state(self.filters, self.decoding.columns),
        }
        if resumed is not None:
            state["resumed_from"] = {"world_size": resumed[0], "delivered": resumed[1]}
        if info is not None:
            slot = {"id": info.id, "count": info.num_workers, "chunk": self.batch_size}
            state["worker"] = {**slot, "consumed": consumed}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields exactly the samples not yet delivered.

        A checkpoint taken under another world size resumes too (synchronous data parallelism keeps every
        rank's delivered count equal, so any rank's state describes all of them): the old ranks' remaining
        samples are dealt to the new ranks (see :func:`fastload.core.sharding.resumed_rank_order`)."""
        check_shape(state, owner="ShardDataset", keys=("epoch", "delivered"))
        if state.get("kind") == "fastload.Mix":
            raise ConfigError("this is a fastload.Mix's state; restore it into the Mix that saved it")
        _, world = self.rank_world()
        old_world = state.get("world_size", world)
        span = self._checkpoint_span(state)
        state = self._legacy_split(state, old_world if isinstance(old_world, int) else world, span)
        check_selection(state, self.filters, self.decoding.columns)
        if "seed" in state and state["seed"] != self.seed:
            raise ConfigError(
                f"cannot resume: the checkpoint has seed={state['seed']!r}, this run has seed={self.seed!r}; "
                "resume with the checkpoint's seed"
            )
        order = self._fingerprint(old_world if isinstance(old_world, int) else world, legacy=False, span=span)
        samples = self._samples(span)
        if state.get("samples", samples) != samples or state.get("order", order) != order:
            raise order_refusal(state, {"samples": samples, **self._order_parts(span)})
        epoch, delivered = int(state["epoch"]), int(state["delivered"])
        resumed = self._resumed_by(state, int(old_world), world)
        if old_world == world:
            start = delivered
            total = len(self._plan(epoch, resumed, span).samples)
            if not 0 <= start <= total:
                raise ConfigError(
                    f"cannot resume: the checkpoint has delivered={start} samples of epoch {epoch}, but this "
                    f"rank's epoch has {total}; resume with the same dataset and settings"
                )
        else:
            start = 0
            try:
                self._plan(epoch, resumed, span)
            except ValueError as exc:
                raise ConfigError(f"cannot resume from this checkpoint: {exc}") from None
        older = span if span < len(self.view.counts) else 0
        self._restore(state, epoch, start, resumed, version_shards=older)

    def _checkpoint_span(self, state: dict[str, Any]) -> int:
        """How many shards the checkpoint ``state``'s epoch read: this dataset's, or (taken before an
        append) the first ones, as many as an older version of it lists; refused, saying why, otherwise."""
        total = len(self.view.counts)
        shards = state.get("shards", total)
        if shards == total or type(shards) is not int:
            return total
        versions = versions_of(self.index)
        if shards < total and any(v.shards == shards for v in versions):
            return int(shards)
        if state.get("version", versions[-1].version) == versions[-1].version:
            return total  # another dataset, or one re-packed: the order refusal says what differs
        raise version_refusal(state, versions, pinned=self.pinned, root=self.root)

    def _order_parts(self, span: int | None = None) -> dict[str, Any]:
        """What decides the order besides seed and world size, as a checkpoint records it
        (:func:`~fastload.train.statecheck.order_parts`), over the first ``span`` shards (default: those
        the current epoch reads)."""
        counts = self._counts(span)
        cached: dict[int, dict[str, Any]] = self.__dict__.setdefault("_parts", {})
        if len(counts) not in cached:
            o = self.order
            shards = self.index.shards[: len(counts)]
            parts = order_parts(shards, counts.tolist(), shuffle_buffer=o.shuffle_buffer, even=o.even)
            cached[len(counts)] = parts
        return dict(cached[len(counts)])

    def _legacy_split(self, state: dict[str, Any], world: int, span: int | None = None) -> dict[str, Any]:
        """``state`` as this version's if it can be: a checkpoint of an ``even="split"`` epoch without a
        seed taken by a fastload that cut the same samples every epoch means the same samples in epoch 0
        (no rotation yet) and is refused, saying why, in any other."""
        if not self._rotates(world, span) or state.get("order") != self._fingerprint(
            world, legacy=True, span=span
        ):
            return state
        epoch = int(state.get("epoch", 0))
        if epoch == 0:
            return {**state, "order": self._fingerprint(world, legacy=False, span=span)}
        raise ConfigError(
            f"cannot resume: this checkpoint of epoch {epoch} was taken by a fastload whose even='split' "
            "order without a seed cut the same samples from every epoch; this version rotates that cut with "
            "the epoch (so every sample is trained on), so the checkpoint's position means other samples "
            f"here. Start epoch {epoch} from its beginning (set_epoch({epoch}) without load_state_dict), or "
            "finish it with the fastload that wrote the checkpoint"
        )

    # -- iteration ----------------------------------------------------------------------------------------

    def _begin(self) -> tuple[Iteration, list[tuple[int, int]]]:
        """This process's pass: its position and the references it reads, in order."""
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        pending, self._pending = self._pending, None
        if pending is not None and pending.mine() and (pending.worker, pending.workers) == (worker, workers):
            live = pending
        else:
            if not self._chunked:  # (fastload.DataLoader sets its epochs)
                self._next_pass()
            live = Iteration(self.epoch, self.start, self.resumed_from(), worker, workers, self.batch_size)
        self._passed(live.epoch)
        self._live = live
        if live.chunk is None and workers > 1 and worker == 0 and not self._shared.fields.warned:
            self._shared.fields.warned = 1
            warnings.warn(ORDER_WARNING.format(workers=workers), UserWarning, stacklevel=3)
        with gc_paused():  # the worker's share as tuples, no cycles (see fastload.gcpause)
            samples = self._plan(live.epoch, live.resumed).samples
            if live.chunk is None or workers == 1:  # one contiguous stretch, sliced
                first, stop = worker_span(len(samples), worker=worker, workers=workers, start=live.start)
                refs = self.pairs_of(samples[first + live.consumed : stop].arrays())
            else:
                positions = worker_position_array(
                    len(samples), worker=worker, workers=workers, chunk=live.chunk, start=live.start
                )
                refs = self.pairs_of(samples.take(positions[live.consumed :]))
        return live, refs

    def __iter__(self) -> Iterator[Any]:
        in_worker = torch.utils.data.get_worker_info() is not None
        tally = None
        if self._telemetry.on:
            tally = telemetry.Tally(self._telemetry, s3=in_worker and not self._chunked, cache=self.cache())
        started = telemetry.clock_ns()
        live, refs = self._begin()
        if tally is not None:
            tally.stage("plan", telemetry.clock_ns() - started, len(refs))
        samples = read_samples(
            refs,
            self.view,
            decoding=self.decoding,
            prefetch=self.prefetch,
            progress=live,
            mark_skipped=self._chunked,
            on_skip=lambda: self.count_skipped(1),  # (a worker of a torch DataLoader too, under a lock)
            report=self.note_skipped,
            tally=tally,
            tuning=self._telemetry.tuning,  # (None until fastload.DataLoader(autotune=True) tunes it)
        )
        if self._chunked:  # fastload.DataLoader counts what it delivers and rewinds at the end
            size = live.chunk or len(refs) or 1
            yield from chunks_of(samples, len(refs), size, worker=live.worker if in_worker else None)
            return
        yield from samples
        if not in_worker:  # a complete pass in this process: the next one reads the next epoch
            self._shared.complete()
            self._live = None


__all__ = ["INDEX_NAME", "ShardDataset"]
