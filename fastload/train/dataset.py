"""``fastload.ShardDataset`` and ``fastload.DataLoader``: exactly-once, deterministic, resumable reading of
packed datasets in ``torch.utils.data.DataLoader`` (the only torch import besides ``decode``).

The order of samples is decided by ``core.sharding`` from (seed, epoch, rank, world size): workers take
turns over chunks of ``batch_size`` samples of the rank's order, the same way DataLoader takes turns over
its workers, so the order reaching the training loop does not depend on ``num_workers``. Resuming skips
the samples already delivered, which :class:`DataLoader` counts.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import torch
import torch.utils.data

from fastload.config import S3Config
from fastload.core.index import INDEX_NAME, DatasetIndex
from fastload.core.readplan import plan_reads
from fastload.core.sharding import (
    EVEN_POLICIES,
    RankPlan,
    rank_order,
    resumed_rank_order,
    worker_positions,
)
from fastload.errors import ConfigError, FastloadError, NotFoundError
from fastload.gcpause import gc_paused
from fastload.storage import access as storage
from fastload.storage.cache import ShardCache
from fastload.train.decode import decode_sample
from fastload.train.prefetch import Prefetcher
from fastload.train.shardread import RawSample, ShardReaders
from fastload.train.shmbatch import MainSlots, stackable, worker_slots

_SKIPPED = object()
DEFAULT_PREFETCH_BYTES = 64 << 20


class _Chunk:
    """One chunk of a worker's share: the samples that decoded, how many were skipped, or the error that
    ended the worker's share (carried as a value so it reaches the training process with its type)."""

    __slots__ = ("error", "samples", "skipped")

    def __init__(self, samples: list[Any], skipped: int, error: FastloadError | None = None) -> None:
        self.samples, self.skipped, self.error = samples, skipped, error


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if (rank is None) != (world_size is None):
        raise ConfigError(f"give both rank= and world_size= (got rank={rank}, world_size={world_size})")
    if rank is not None and world_size is not None:
        return rank, world_size
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _is_shard_file(url: str) -> bool:
    from fastload.formats.tfrecord.codec import is_tfrecord_name

    return url.endswith(".tar") or is_tfrecord_name(url)


def open_index(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, s3_config: S3Config | None = None
) -> tuple[str, DatasetIndex]:
    """``(root, index)`` of a dataset: its ``index.json``; or, for tar or TFRecord shards without one (a
    folder or prefix of them, one file, or a list of URLs), an index built by reading the shards once, with
    a warning that says how to avoid that cost."""
    from fastload.storage.manifest import load_index

    if isinstance(source, (str, os.PathLike)):
        root = storage.normalise(source)
        if not _is_shard_file(root):
            try:
                return root, load_index(root, s3_config=s3_config)
            except NotFoundError as missing:
                found = storage.list_files(root, "", config=s3_config) if storage.is_folder(root) else []
                urls = [u for u in found if _is_shard_file(u) and "/." not in u[len(root) :]]
                if not urls:
                    raise missing from None
                if len({u.endswith(".tar") for u in urls}) > 1:
                    raise ConfigError(
                        f"{root} has no index.json and holds both tar and TFRecord files; give a list of "
                        "the shards to read, or run `fastload index` on a folder of one kind"
                    ) from None
        else:
            urls = [root]
    else:
        urls = [storage.normalise(u) for u in source]
        if not urls:
            raise ConfigError("the list of shards is empty")
    started = time.monotonic()
    if all(u.endswith(".tar") for u in urls):
        from fastload.formats.tar.index import index_tar_shards

        root, index = index_tar_shards(urls, config=s3_config)
    else:
        from fastload.formats.tfrecord.index import index_tfrecord_files

        root, index = index_tfrecord_files(urls, config=s3_config)
    seconds = time.monotonic() - started
    warnings.warn(
        f"{root}: no index.json, so {len(index.shards)} {index.shard_format} shard(s) ({index.bytes:,} "
        f"bytes) were read once to index {index.samples:,} samples in memory ({seconds:.1f}s, in every "
        "process that opens the dataset). Write the index once with `fastload index` (or pack with "
        "`fastload pack`) to skip this.",
        UserWarning,
        stacklevel=3,
    )
    return root, index


class ShardDataset(torch.utils.data.IterableDataset[dict[str, Any]]):
    """Samples of a packed dataset (a folder or ``s3://`` prefix with ``index.json``), as WebDataset-style
    dicts with ``__key__``, ``__shard__``, ``__index__`` and one entry per field.

    ``seed`` shuffles shard order and, with ``shuffle_buffer`` > 1, samples within a bounded window; None
    keeps index order. ``even`` equalises per-rank counts so DDP never hangs (see
    :func:`fastload.core.sharding.rank_plan`); :meth:`epoch_report` says which samples it dropped or
    repeated. ``batch_size`` must equal the DataLoader's (:class:`DataLoader` sets it) for the order to be
    independent of ``num_workers`` and for exact resume.

    Prefetch: ``prefetch_threads`` fetch the worker's planned reads ahead, in order, holding at most
    ``prefetch_bytes`` not yet consumed (default: 64 MiB for ``s3://`` datasets; 0, i.e. reads in the
    consuming thread, for local ones, where the page cache and kernel readahead already hide the disk and
    extra threads only compete for the GIL). ``cache_dir``/``cache_limit_bytes`` keep remote shards on
    local disk (see :class:`fastload.storage.cache.ShardCache`).
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
        batch_size: int = 1,
        decode: bool = True,
        images: bool = True,
        allow_pickle: bool = False,
        map: Callable[[dict[str, Any]], Any] | None = None,
        columns: Sequence[str] | None = None,
        on_error: str = "raise",
        prefetch_bytes: int | None = None,
        prefetch_threads: int = 8,
        prefetch_runs: int = 64,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        cache_verify: bool = True,
        s3_config: S3Config | None = None,
    ) -> None:
        super().__init__()
        if even not in EVEN_POLICIES:
            raise ConfigError(f"even={even!r}; choose one of {', '.join(EVEN_POLICIES)}")
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error={on_error!r}; choose 'raise' or 'skip'")
        if batch_size < 1 or prefetch_runs < 1 or prefetch_threads < 1 or shuffle_buffer < 0:
            raise ConfigError(
                f"{batch_size=}, {prefetch_runs=} and {prefetch_threads=} must be >= 1 and "
                f"{shuffle_buffer=} >= 0"
            )
        if prefetch_bytes is not None and prefetch_bytes < 0:
            raise ConfigError(f"{prefetch_bytes=} must be >= 0 (0 turns prefetch off)")
        if cache_limit_bytes is not None and cache_dir is None:
            raise ConfigError("cache_limit_bytes= needs cache_dir= (the folder to keep shards in)")
        self.s3_config = s3_config
        with gc_paused():  # a big index is many small objects
            self.root, self.index = open_index(source, s3_config=s3_config)
        if columns is not None and self.index.shard_format != "parquet":
            raise ConfigError(f"columns= projects Parquet shards; this dataset is {self.index.shard_format}")
        self.seed, self.shuffle_buffer, self.even = seed, shuffle_buffer, even
        self._rank, self._world = rank, world_size
        self.batch_size = batch_size
        self.decode, self.images, self.allow_pickle = decode, images, allow_pickle
        self.map, self.columns, self.on_error = map, columns, on_error
        if prefetch_bytes is None:  # local reads are served by the page cache and kernel readahead
            prefetch_bytes = DEFAULT_PREFETCH_BYTES if storage.is_remote(self.root) else 0
        self.prefetch_bytes, self.prefetch_threads, self.prefetch_runs = (
            prefetch_bytes,
            prefetch_threads,
            prefetch_runs,
        )
        self.cache_dir = None if cache_dir is None else os.path.abspath(os.fspath(cache_dir))
        self.cache_limit_bytes, self.cache_verify = cache_limit_bytes, cache_verify
        self._cache_obj: tuple[int, ShardCache] | None = None
        if self.cache_dir is not None:
            self.cache()  # a bad folder fails here, not in a worker
        # shared with DataLoader workers (persistent ones included): epoch, resume position, and for an
        # epoch resumed under another world size: the old world size (0: none), its delivered count, epoch
        self._state = multiprocessing.get_context("spawn").RawArray("q", 5)
        self._resume_epoch: int | None = None
        self.skipped = 0
        self._emit_chunks = False  # set by fastload.DataLoader: yield one list of samples per chunk

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache_obj"] = None  # locks and per-process checks stay in their process
        state.pop("_plan_cache", None)  # cheaper to recompute in the worker than to pickle
        return state

    def cache(self) -> ShardCache | None:
        """This process's view of the shard cache (None without ``cache_dir``)."""
        if self.cache_dir is None:
            return None
        if self._cache_obj is None or self._cache_obj[0] != os.getpid():
            cache = ShardCache(
                self.cache_dir,
                limit_bytes=self.cache_limit_bytes,
                verify=self.cache_verify,
                config=self.s3_config,
            )
            self._cache_obj = (os.getpid(), cache)
        return self._cache_obj[1]

    def __repr__(self) -> str:
        return f"ShardDataset({self.root!r}, {len(self.index.shards)} shards, {self.index.samples} samples)"

    # -- epoch and resume ---------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return int(self._state[0])

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning (call before iterating, as with DistributedSampler).
        After :meth:`DataLoader.load_state_dict`, setting the restored epoch keeps the restored position."""
        if self._resume_epoch == epoch:
            self._resume_epoch = None
            self._state[0] = epoch
            return
        self._resume_epoch = None
        self._state[0] = epoch
        self._state[1] = 0
        self._state[2] = 0
        self.skipped = 0

    def _set_start(self, start: int) -> None:
        self._state[1] = start

    @property
    def start(self) -> int:
        """Samples of this epoch already delivered before the current iteration (resume position)."""
        return int(self._state[1])

    def resumed_from(self) -> tuple[int, int] | None:
        """``(old world size, samples each old rank had delivered)`` when the current epoch was resumed
        from a checkpoint taken under another world size, else None."""
        if self._state[2] > 0 and self._state[4] == self._state[0]:
            return int(self._state[2]), int(self._state[3])
        return None

    def _resume_from_world(self, epoch: int, old_world: int, delivered: int) -> None:
        self._state[2], self._state[3], self._state[4] = old_world, delivered, epoch

    def order_fingerprint(self, world_size: int | None = None) -> str:
        """A digest of everything that decides the sample order (shards, counts, seed, policies, world size
        (default: this run's))."""
        import hashlib

        world = self.rank_world()[1] if world_size is None else world_size
        settings = repr((self.seed, self.shuffle_buffer, self.even, world))
        cached = self.__dict__.get("_fingerprint")
        if cached is not None and cached[0] == settings:
            return str(cached[1])
        digest = hashlib.sha256(settings.encode())
        for shard in self.index.shards:
            digest.update(f"{shard.name}\0{shard.samples}\0{shard.checksum}\n".encode())
        self._fingerprint = (settings, digest.hexdigest()[:16])
        return self._fingerprint[1]

    def rank_world(self) -> tuple[int, int]:
        return _rank_and_world(self._rank, self._world)

    def plan(self, epoch: int | None = None) -> RankPlan:
        """This rank's samples for ``epoch`` (default: the current one) in canonical order (the last one
        is kept: treat it as read-only)."""
        rank, world = self.rank_world()
        epoch = self.epoch if epoch is None else epoch
        resumed = self.resumed_from() if epoch == self.epoch else None
        key = (rank, world, epoch, resumed)
        cached = self.__dict__.get("_plan_cache")
        if cached is not None and cached[0] == key:
            return cached[1]  # type: ignore[no-any-return]
        plan = self._make_plan(rank, world, epoch, resumed)
        self._plan_cache = (key, plan)
        return plan

    def _make_plan(self, rank: int, world: int, epoch: int, resumed: tuple[int, int] | None) -> RankPlan:
        if resumed is not None:
            return resumed_rank_order(
                [s.samples for s in self.index.shards],
                rank=rank,
                world_size=world,
                old_world_size=resumed[0],
                delivered=resumed[1],
                seed=self.seed,
                epoch=epoch,
                even=self.even,
                shuffle_buffer=self.shuffle_buffer,
            )
        return rank_order(
            [s.samples for s in self.index.shards],
            rank=rank,
            world_size=world,
            seed=self.seed,
            epoch=epoch,
            even=self.even,
            shuffle_buffer=self.shuffle_buffer,
        )

    def epoch_report(self, epoch: int | None = None) -> dict[str, Any]:
        """Which samples the even policy dropped or repeated this epoch, as (shard name, key) pairs."""
        plan = self.plan(epoch)
        names = [s.name for s in self.index.shards]

        def named(refs: list[tuple[int, int]]) -> list[tuple[str, str]]:
            return [(names[s], self.index.shards[s].keys[i]) for s, i in refs]

        return {
            "samples": len(plan.samples),
            "dropped": named(plan.dropped),
            "repeated": named(plan.repeated),
            "skipped_on_error": self.skipped,
        }

    def __len__(self) -> int:
        return len(self.plan().samples) - self.start

    # -- iteration ------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        with gc_paused():  # tens of thousands of small tuples, no cycles (see fastload.gcpause)
            plan = self.plan()
            positions = worker_positions(
                len(plan.samples), worker=worker, workers=workers, chunk=self.batch_size, start=self.start
            )
            refs = [plan.samples[p] for p in positions]
        if not self._emit_chunks:
            yield from self._samples(refs)
            return
        # one item per chunk of the rank's order, however many of its samples survive decoding, so the
        # DataLoader's turn-taking over workers stays aligned with the canonical order
        samples = self._samples(refs, track=True)
        for first in range(0, len(refs), self.batch_size):
            size = min(self.batch_size, len(refs) - first)
            chunk: list[Any] = []
            skipped = 0
            try:
                for _ in range(size):
                    out = next(samples)
                    if out is _SKIPPED:
                        skipped += 1
                    else:
                        chunk.append(out)
            except FastloadError as exc:
                if info is None:
                    raise
                add_note = getattr(exc, "add_note", None)  # Python >= 3.11
                if add_note is not None:
                    add_note(f"(raised in DataLoader worker {worker}:\n{traceback.format_exc()})")
                samples.close()
                yield _Chunk([], 0, exc)
                return
            yield _Chunk(chunk, skipped)

    def _samples(self, refs: list[tuple[int, int]], *, track: bool = False) -> Generator[Any, None, None]:
        # without prefetch nothing is held ahead, and local shards stream sample by sample: bigger tasks
        # only mean fewer of them
        task_bytes = (
            16 << 20 if self.prefetch_bytes == 0 else max(1 << 20, min(16 << 20, self.prefetch_bytes // 4))
        )
        with gc_paused():
            tasks = plan_reads(refs, self.index.shards, max_task_bytes=task_bytes)
        readers = ShardReaders(
            self.root,
            self.index.shards,
            tasks,
            columns=self.columns,
            config=self.s3_config,
            cache=self.cache(),
            defer=self.prefetch_bytes == 0,
        )
        prefetcher = Prefetcher(
            tasks,
            readers.fetch,
            max_bytes=self.prefetch_bytes,
            max_tasks=self.prefetch_runs,
            threads=self.prefetch_threads,
            release=readers.release,
        )
        try:
            plain = not self.decode and self.map is None
            for task, parse in prefetcher:
                name = self.index.shards[task.shard].name
                if plain:  # nothing to decode or map: nothing can fail or be skipped
                    for raw in parse():
                        raw["__shard__"] = name
                        yield raw
                    continue
                for raw in parse():
                    raw["__shard__"] = name
                    out = self._finish(raw)
                    if out is not _SKIPPED or track:
                        yield out
        finally:
            prefetcher.close()
            readers.close()

    def _finish(self, raw: RawSample) -> Any:
        try:
            sample = (
                decode_sample(raw, images=self.images, allow_pickle=self.allow_pickle) if self.decode else raw
            )
            return self.map(sample) if self.map is not None else sample
        except Exception as exc:
            if self.on_error == "skip":
                if not self._emit_chunks:  # with fastload.DataLoader the loader counts (across workers)
                    self.skipped += 1
                return _SKIPPED
            raise FastloadError(
                f"shard {raw.get('__shard__')}, sample {raw.get('__key__')!r}: decoding failed ({exc!r}); "
                "fix the data, pass decode=False, or on_error='skip'"
            ) from exc


class DataLoader(torch.utils.data.DataLoader):  # type: ignore[type-arg]
    """``torch.utils.data.DataLoader`` for a :class:`ShardDataset` that can save and restore its position.

    The one line a training script adds: save ``loader.state_dict()`` with the checkpoint, and call
    ``loader.load_state_dict(state)`` after building the loader on restart. Batches already delivered are
    never delivered again; none are lost.
    """

    def __init__(
        self,
        dataset: ShardDataset,
        batch_size: int = 1,
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        drop_last: bool = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(dataset, ShardDataset):
            raise ConfigError("fastload.DataLoader needs a fastload.ShardDataset")
        if kwargs.get("in_order") is False:
            raise ConfigError("fastload.DataLoader needs in_order=True (the default) for exact resume")
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size} must be >= 1")
        dataset.batch_size = batch_size
        dataset._emit_chunks = True
        collate = collate_fn or torch.utils.data.default_collate
        self.fastload_batch_size = batch_size
        self.fastload_drop_last = drop_last
        # the dataset yields whole chunks; they are collated in the worker, with the skip count alongside
        super().__init__(dataset, batch_size=None, collate_fn=_ChunkCollate(collate), **kwargs)  # type: ignore[arg-type]
        self._delivered = 0
        self.skipped = 0
        self._slots = MainSlots(pin_memory=bool(self.pin_memory) and torch.cuda.is_available())

    def __len__(self) -> int:
        dataset: ShardDataset = self.dataset  # type: ignore[assignment]
        left = len(dataset)
        return (
            left // self.fastload_batch_size
            if self.fastload_drop_last
            else -(-left // self.fastload_batch_size)
        )

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        dataset: ShardDataset = self.dataset  # type: ignore[assignment]
        total = len(dataset.plan().samples)
        start = dataset.start
        self._delivered = 0
        slots = self._slots
        try:
            for batch, size, skipped, error, slot in super().__iter__():
                if error is not None:
                    raise error
                if slot is not None:
                    batch = slots.unpack(batch, slot)
                if size < self.fastload_batch_size and self.fastload_drop_last:
                    break
                self.skipped += skipped
                dataset.skipped += skipped
                self._delivered = min(total - start, self._delivered + self.fastload_batch_size)
                if batch is not None:
                    yield batch
        finally:
            if not self.persistent_workers:  # the next epoch's workers make new slots
                slots.close()
        dataset._set_start(0)
        self._delivered = 0

    def state_dict(self) -> dict[str, Any]:
        """Epoch, samples of it delivered so far, and what must match on restore."""
        dataset: ShardDataset = self.dataset  # type: ignore[assignment]
        rank, world = dataset.rank_world()
        state: dict[str, Any] = {
            "epoch": dataset.epoch,
            "delivered": dataset.start + self._delivered,
            "seed": dataset.seed,
            "world_size": world,
            "rank": rank,
            "batch_size": dataset.batch_size,
            "samples": dataset.index.samples,
            "order": dataset.order_fingerprint(),
        }
        resumed = dataset.resumed_from()
        if resumed is not None:
            state["resumed_from"] = {"world_size": resumed[0], "delivered": resumed[1]}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields exactly the samples not yet delivered.

        A checkpoint taken under another world size resumes too (synchronous data parallelism keeps every
        rank's delivered count equal, so any rank's state describes all of them): the old ranks' remaining
        samples are dealt to the new ranks (see :func:`fastload.core.sharding.resumed_rank_order`)."""
        dataset: ShardDataset = self.dataset  # type: ignore[assignment]
        _, world = dataset.rank_world()
        old_world = state.get("world_size")
        for name, mine in (
            ("seed", dataset.seed),
            ("samples", dataset.index.samples),
            ("order", dataset.order_fingerprint(old_world if isinstance(old_world, int) else None)),
        ):
            if state.get(name) != mine:
                raise ConfigError(
                    f"cannot resume: the checkpoint has {name}={state.get(name)!r}, this run has "
                    f"{mine!r}; resume with the same dataset, seed, shuffle and even settings"
                )
        epoch, delivered = int(state["epoch"]), int(state["delivered"])
        resumed = state.get("resumed_from")
        if old_world == world:
            dataset.set_epoch(epoch)
            if resumed is not None:
                dataset._resume_from_world(epoch, int(resumed["world_size"]), int(resumed["delivered"]))
            dataset._set_start(delivered)
        elif resumed is not None:
            raise ConfigError(
                f"cannot resume: this checkpoint already continues an epoch with world_size={old_world} "
                f"(resumed from world_size={resumed['world_size']}); finish epoch {epoch} with "
                f"world_size={old_world}, or resume from the checkpoint taken before"
            )
        else:
            dataset.set_epoch(epoch)
            dataset._resume_from_world(epoch, int(old_world), delivered)  # type: ignore[arg-type]
            dataset._set_start(0)
            try:
                dataset.plan()
            except ValueError as exc:
                dataset.set_epoch(epoch)  # undo: nothing half-restored
                raise ConfigError(f"cannot resume from this checkpoint: {exc}") from None
        dataset._resume_epoch = epoch


class _ChunkCollate:
    """Collates one chunk in the worker: ``(batch, chunk size, skips, error, slot)``; batch is None if all
    were skipped (or an error ended the worker's share). In a DataLoader worker the batch's bytes lists and
    small tensors travel through reusable shared memory (:mod:`fastload.train.shmbatch`); ``slot`` describes
    where."""

    def __init__(self, collate: Callable[[list[Any]], Any]) -> None:
        self.collate = collate

    def __call__(self, chunk: _Chunk) -> tuple[Any, int, int, FastloadError | None, dict[str, Any] | None]:
        size = len(chunk.samples) + chunk.skipped
        samples = chunk.samples
        in_worker = torch.utils.data.get_worker_info() is not None
        stacks: dict[str, list[Any]] = {}
        if in_worker and samples and self.collate is torch.utils.data.default_collate:
            # big same-shape tensors (decoded images) are stacked straight into a shared-memory slot
            stacks = {k: [s[k] for s in samples] for k in stackable(samples)}
            if stacks:
                samples = [{k: v for k, v in s.items() if k not in stacks} for s in samples]
        batch = self.collate(samples) if samples else None
        if stacks:  # the fields in their order; the stacked ones filled in by pack
            collated: Any = batch
            batch = {k: None if k in stacks else collated[k] for k in chunk.samples[0]}
        slot = None
        if batch is not None and in_worker:
            batch, slot = worker_slots().pack(batch, stacks)
        return batch, size, chunk.skipped, chunk.error, slot


__all__ = ["INDEX_NAME", "DataLoader", "ShardDataset"]
