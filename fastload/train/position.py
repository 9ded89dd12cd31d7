"""Where a ``ShardDataset`` stands in its epochs: the state every copy of it shares, and one iteration's.

:class:`SharedPosition` lives in shared memory, so DataLoader workers (persistent ones too, forked or
spawned) see ``set_epoch`` and a restore made in the training process. :class:`Iteration` is one pass of
one process (a worker, or the training process itself): which positions of the rank's order it reads and
how many of them it has consumed, which is what ``ShardDataset.state_dict()`` reports while it runs.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch.utils.data

from fastload.errors import ConfigError

REPEAT_WARNING = (
    "fastload: a new DataLoader iteration with fresh workers reads epoch {epoch} again, in the same order as "
    "the last one: workers that are started anew each epoch cannot tell a new epoch from a restart. Call "
    "dataset.set_epoch(epoch) before each epoch (as with DistributedSampler), or use "
    "persistent_workers=True (epochs then advance by themselves), or fastload.DataLoader"
)


class _Fields(ctypes.Structure):
    _fields_ = [
        ("epoch", ctypes.c_int64),
        ("start", ctypes.c_int64),  # samples of the epoch's order delivered before (resume position)
        ("old_world", ctypes.c_int64),  # an epoch resumed under another world size: the old one (0: none)
        ("old_delivered", ctypes.c_int64),  # ... each old rank's delivered count
        ("resumed_epoch", ctypes.c_int64),  # ... and which epoch that was
        ("restored_epoch", ctypes.c_int64),  # epoch + 1 of a restore not yet started (0: none)
        ("skipped", ctypes.c_int64),  # samples left out with on_error="skip" this epoch
        ("warned", ctypes.c_int64),  # the order warning was given
        ("cache_bypassed", ctypes.c_int64),  # shards read past cache_dir (it could not store them)
        ("cache_warned", ctypes.c_int64),  # ... and the warning of it was given
        ("log_used", ctypes.c_int64),  # bytes of the skipped-sample log in use (this epoch)
        ("log_full", ctypes.c_int64),  # samples skipped this epoch that the log had no room to name
        ("generation", ctypes.c_int64),  # set_epoch/restore calls so far (a worker's passes count within one)
        ("completed", ctypes.c_int64),  # epoch + 1 of a pass the training process read to its end (0: none)
        ("pass_generation", ctypes.c_int64),  # the generation and DataLoader iteration (its workers' base
        ("pass_seed", ctypes.c_int64),  # seed) of the last pass workers began: a new one, the same epoch...
        ("warned_repeat", ctypes.c_int64),  # ... was warned about
        ("version_shards", ctypes.c_int64),  # a restored epoch read over an older version: its shard count
        ("version_epoch", ctypes.c_int64),  # ... and which epoch that is (0 shards: none)
    ]


LOG_BYTES = 64 << 10  # names of samples skipped in an epoch, shared by every process reading it


class SkippedSample(NamedTuple):
    """A sample left out with ``on_error="skip"``: its shard, key, the byte offset of a sample whose bytes
    failed their CRC32C (None for one that failed to decode or map) and why."""

    shard: str
    key: str
    offset: int | None
    reason: str


def warn_damaged(record: SkippedSample, named: str) -> None:
    """The warning for the first damaged sample of a shard skipped (``named``: where the rest are)."""
    warnings.warn(
        f"{record.shard}: sample {record.key!r} at byte offset {record.offset} fails its CRC32C and was "
        "skipped (on_error='skip'); the shard is damaged: run `fastload verify` on the dataset and re-pack "
        f"or re-download it. Further damaged samples of this shard are skipped without a warning {named} "
        "names them all",
        UserWarning,
        stacklevel=4,
    )


class SharedPosition:
    """Epoch, resume position and counters shared by every copy of one dataset (``copy``, pickling to a
    spawned worker, fork)."""

    def __init__(self) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.fields = spawn.RawValue(_Fields)
        self.log = spawn.RawArray(ctypes.c_char, LOG_BYTES)  # SkippedSample records, one JSON line each
        self.lock = spawn.Lock()  # over the skip count and the log (workers of a torch DataLoader write)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning; after a restore of ``epoch``, keep the restored position."""
        f = self.fields
        f.generation += 1
        f.completed = 0
        if f.restored_epoch == epoch + 1:
            f.restored_epoch = 0
            f.epoch = epoch
            return
        f.restored_epoch = 0
        f.epoch, f.start, f.old_world, f.version_shards = epoch, 0, 0, 0
        with self.lock:
            f.skipped = f.log_used = f.log_full = 0

    def restore(
        self, epoch: int, start: int, resumed: tuple[int, int] | None, *, version_shards: int = 0
    ) -> None:
        """Continue ``epoch`` after ``start`` samples (of the order resumed from ``resumed``, if given), over
        the first ``version_shards`` shards (an older version of the dataset; 0: all of them)."""
        self.set_epoch(epoch)
        f = self.fields
        f.old_world, f.old_delivered, f.resumed_epoch = (resumed or (0, 0)) + (epoch,)
        f.start = start
        f.restored_epoch = epoch + 1
        self.read_version(epoch, version_shards)

    def read_version(self, epoch: int, shards: int) -> None:
        """``epoch`` reads the first ``shards`` shards (a checkpoint's version; 0: all)."""
        self.fields.version_shards, self.fields.version_epoch = shards, epoch

    def version_shards(self, epoch: int) -> int:
        """How many shards ``epoch`` reads when restored over an older version (0: all of them)."""
        f = self.fields
        return int(f.version_shards) if f.version_shards > 0 and f.version_epoch == epoch else 0

    def rewind(self) -> None:
        """The next pass starts the current epoch from its beginning (a pass ran to its end)."""
        self.fields.start = 0
        self.fields.restored_epoch = 0

    def cache_bypassed(self, message: str) -> None:
        """Count a shard read past the cache folder (it could not store it); warn of the first one, once
        for every process of the dataset. (Workers add without a lock: two at the same instant may count
        as one.)"""
        f = self.fields
        f.cache_bypassed += 1
        if not f.cache_warned:
            f.cache_warned = 1
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    def complete(self) -> None:
        """The training process read the current epoch to its end: its next pass reads the next epoch,
        unless an epoch is set or a position restored before (:meth:`PositionMethods._next_pass`)."""
        self.rewind()
        self.fields.completed = self.fields.epoch + 1

    def advance_to(self, epoch: int, generation: int) -> None:
        """A worker's next pass reads ``epoch`` (from its beginning): recorded for every copy, once, unless
        an epoch was set or a position restored since ``generation`` (no new generation: the other
        workers of the pass count their passes on)."""
        f = self.fields
        with self.lock:
            if f.generation == generation and f.epoch < epoch:
                f.epoch, f.start, f.old_world, f.restored_epoch, f.completed = epoch, 0, 0, 0, 0
                f.skipped = f.log_used = f.log_full = 0

    def count_skipped(self, n: int) -> None:
        with self.lock:
            self.fields.skipped += n

    def note_skipped(self, record: SkippedSample) -> bool:
        """Name ``record`` in this epoch's log (each sample once); True if it is its shard's first."""
        line = json.dumps(list(record)).encode() + b"\n"
        # lines start '["shard", "key", ...': found by a byte search, not by parsing the log at each skip
        sample = b"\n" + json.dumps(list(record[:2])).encode()[:-1] + b","
        shard = b"\n" + json.dumps([record.shard]).encode()[:-1] + b","
        with self.lock:
            f = self.fields
            logged = b"\n" + self.log.raw[: f.log_used]
            if sample in logged:
                return False
            if f.log_used + len(line) <= LOG_BYTES:
                ctypes.memmove(ctypes.addressof(self.log) + f.log_used, line, len(line))
                f.log_used += len(line)
            else:
                f.log_full += 1
            return shard not in logged

    def skipped_samples(self) -> tuple[list[SkippedSample], int]:
        """The samples named in this epoch's log, and how many more the log had no room for."""
        with self.lock:
            return self._records(self.fields.log_used), int(self.fields.log_full)

    def _records(self, used: int) -> list[SkippedSample]:
        return [SkippedSample(*json.loads(line)) for line in self.log.raw[:used].splitlines()]

    def resumed_from(self) -> tuple[int, int] | None:
        f = self.fields
        if f.old_world > 0 and f.resumed_epoch == f.epoch:
            return int(f.old_world), int(f.old_delivered)
        return None


class PositionMethods:
    """The position methods a dataset over a :class:`SharedPosition` (its ``_shared``) offers its users:
    ``ShardDataset`` and ``Mix`` (positions of their epoch's order: samples, or mixture positions), and
    the parts of their ``load_state_dict`` that do not depend on what a position is."""

    _shared: SharedPosition
    _pending: Iteration | None
    batch_size: int | None

    @property
    def epoch(self) -> int:
        return int(self._shared.fields.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning (call before iterating, as with DistributedSampler).
        After ``load_state_dict``, setting the restored epoch keeps the restored position."""
        self._shared.set_epoch(epoch)

    def _next_pass(self) -> None:
        """Before a pass outside ``fastload.DataLoader`` (which sets epochs itself) that continues no
        restored worker position: the next epoch where a new pass can be seen, as
        ``DistributedSampler`` users get from ``set_epoch``. In the training process, after a pass read to
        its end; in a persistent DataLoader worker, at each pass after its first (every worker of the
        loader starts one per ``iter(loader)``); never after ``set_epoch`` or a restore since. A fresh
        worker cannot see that its loader read this epoch before (only that another iteration began it):
        it warns once, naming ``set_epoch``."""
        shared = self._shared
        f = shared.fields
        info = torch.utils.data.get_worker_info()
        if info is None:
            if f.completed == f.epoch + 1:
                shared.set_epoch(int(f.epoch) + 1)
            return
        generation = int(f.generation)
        last = self.__dict__.get("_passes")
        if last is not None and last[0] == os.getpid() and last[1] == generation:
            shared.advance_to(last[2] + 1, generation)
            return
        base = (int(info.seed) - int(info.id) + (1 << 63)) % (1 << 64) - (1 << 63)  # (as int64)
        with shared.lock:
            repeat = f.pass_generation == generation + 1 and f.pass_seed != base and not f.warned_repeat
            f.pass_generation, f.pass_seed = generation + 1, base
            f.warned_repeat |= repeat
        if repeat:
            warnings.warn(REPEAT_WARNING.format(epoch=int(f.epoch)), UserWarning, stacklevel=4)

    def _passed(self, epoch: int) -> None:
        """This process began a pass of ``epoch`` (in a worker: what its next pass advances from)."""
        if torch.utils.data.get_worker_info() is not None:
            self._passes = (os.getpid(), int(self._shared.fields.generation), epoch)

    def _saved_epoch(self) -> tuple[int, int]:
        """``(epoch, start)`` a state saved now holds when no pass is under way: after a pass the
        training process read to its end, the next epoch from its beginning (what the next pass reads)."""
        f = self._shared.fields
        if torch.utils.data.get_worker_info() is None and f.completed == f.epoch + 1:
            return int(f.epoch) + 1, 0
        return self.epoch, self.start

    @property
    def start(self) -> int:
        """Positions of this epoch delivered before the current iteration (the resume position)."""
        return int(self._shared.fields.start)

    def rewind(self) -> None:
        """Start the current epoch from its beginning at the next iteration (after a complete pass)."""
        self._shared.rewind()

    @property
    def skipped(self) -> int:
        """Samples left out with ``on_error="skip"`` this epoch (by this process or the workers of a torch
        DataLoader; those ``fastload.DataLoader`` delivered for its workers); :attr:`skipped_samples` names
        them."""
        return int(self._shared.fields.skipped)

    @property
    def cache_bypassed(self) -> int:
        """Shards (and sample tables) read past ``cache_dir`` because it could not store them (a full
        disk), by every process of this dataset since it was made."""
        return int(self._shared.fields.cache_bypassed)

    @property
    def skipped_samples(self) -> list[SkippedSample]:
        """The samples left out with ``on_error="skip"`` this epoch, each named once (shard, key, byte
        offset of a damaged one, reason), by whichever process read them (a DataLoader worker's as soon as
        it read it, before its batch is delivered); the first ~64 KiB of names are kept."""
        return self._shared.skipped_samples()[0]

    def count_skipped(self, n: int) -> None:
        """Add ``n`` samples skipped on error (what ``fastload.DataLoader`` reports from its workers)."""
        self._shared.count_skipped(n)

    def note_skipped(self, record: SkippedSample) -> None:
        """Name a sample left out with ``on_error="skip"`` (see :attr:`skipped_samples`); the first damaged
        sample of a shard in an epoch is also warned about."""
        if self._shared.note_skipped(record) and record.offset is not None:
            warn_damaged(record, "this epoch; epoch_report()['skipped_samples']")

    @staticmethod
    def _resumed_by(state: dict[str, Any], old_world: int, world: int) -> tuple[int, int] | None:
        """``(old world size, positions each old rank had delivered)`` that the epoch ``state`` (taken under
        ``old_world``) continues from when restored under ``world``; None when it is that world's own order.
        A checkpoint of an epoch already resumed under another world size resumes only under that one."""
        delivered = int(state["delivered"])
        earlier = state.get("resumed_from")
        if old_world == world:
            return None if earlier is None else (int(earlier["world_size"]), int(earlier["delivered"]))
        if earlier is not None:
            raise ConfigError(
                f"cannot resume: this checkpoint already continues an epoch with world_size={old_world} "
                f"(resumed from world_size={earlier['world_size']}); finish epoch {state['epoch']} with "
                f"world_size={old_world}, or resume from the checkpoint taken before"
            )
        return old_world, delivered

    def _restore(
        self,
        state: dict[str, Any],
        epoch: int,
        start: int,
        resumed: tuple[int, int] | None,
        *,
        version_shards: int = 0,
    ) -> None:
        """Continue ``epoch`` after ``start`` positions (of the order resumed from ``resumed``): in the
        training process for every copy (the shared position); in a DataLoader worker (a StatefulDataLoader
        restore) for this copy's next pass only, from where the checkpoint's same worker had got."""
        info = torch.utils.data.get_worker_info()
        worker = state.get("worker")
        if info is None:
            if worker is not None:
                raise ConfigError(
                    f"this state describes DataLoader worker {worker.get('id')} of {worker.get('count')}; "
                    "restore it through the same DataLoader (StatefulDataLoader) with as many workers"
                )
            self._shared.restore(epoch, start, resumed, version_shards=version_shards)
            return
        slot = (info.id, info.num_workers, self.batch_size)
        if worker is not None and (worker.get("id"), worker.get("count"), worker.get("chunk")) != slot:
            raise ConfigError(
                f"cannot resume: the checkpoint's worker {worker.get('id')} of {worker.get('count')} read "
                f"chunks of {worker.get('chunk')}; this is worker {slot[0]} of {slot[1]} with "
                f"batch_size={slot[2]}; resume with the same num_workers and batch_size"
            )
        consumed = int(worker.get("consumed", 0)) if worker is not None else 0
        self._shared.read_version(epoch, version_shards)  # (every worker restores the same epoch)
        self._pending = Iteration(epoch, start, resumed, *slot, consumed)


@dataclass
class Iteration:
    """One pass of one process: epoch, the rank-level position it started from, its worker slot, how its
    positions were dealt (``chunk``: None for one contiguous stretch per worker), and ``consumed``: how many
    of its own positions it has passed (delivered or skipped). ``pid``: the process it belongs to (a forked
    worker inherits the training process's objects; their passes are not its own)."""

    epoch: int
    start: int
    resumed: tuple[int, int] | None
    worker: int
    workers: int
    chunk: int | None
    consumed: int = 0
    pid: int = field(default_factory=os.getpid)

    def mine(self) -> bool:
        return self.pid == os.getpid()
