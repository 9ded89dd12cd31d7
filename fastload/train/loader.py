"""``fastload.DataLoader``: ``torch.utils.data.DataLoader`` for a :class:`~fastload.ShardDataset` (or a
:class:`~fastload.Mix` of them) that can save and restore its position by batches delivered to the loop.

It reads through :meth:`ShardDataset.in_chunks` (a handle on the same dataset that yields one chunk per
batch; the dataset given is left as it was), collates in the workers, moves batches through shared memory
(:mod:`fastload.train.chunks`), counts the samples it delivers, and saves and restores the position with
the dataset's own ``state_dict()``/``load_state_dict()``.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Generator, Iterator
from typing import Any

import torch
import torch.utils.data

from fastload.core.telemetry import merge
from fastload.errors import ConfigError, WorkerDiedError
from fastload.s3 import runtime
from fastload.train.autotune import MAX_PARTS, AutotuneConfig, Tuner, config_of, round_bytes, starting
from fastload.train.chunks import ChunkCollate
from fastload.train.dataset import ShardDataset
from fastload.train.mix import Mix
from fastload.train.shmbatch import MainSlots
from fastload.train.statecheck import check_shape
from fastload.train.telemetry import Tally, clock_ns
from fastload.train.telemetry import report as telemetry_report
from fastload.train.torchprivate import is_worker_death, shut_down_workers

WORKER_DIED = (
    "fastload.DataLoader: a worker process died ({cause}); the usual cause is the out-of-memory killer "
    "(check `dmesg` or the container's memory limit: fewer num_workers, smaller prefetch_bytes or batches "
    "help). "
    "Batches delivered so far are in loader.state_dict(): resume from your last checkpoint"
)


def _worker_died(exc: RuntimeError, slots: MainSlots) -> WorkerDiedError | None:
    """:class:`WorkerDiedError` for torch's "worker ... killed by signal / exited unexpectedly" (its slot
    files removed), or None for another error."""
    if not is_worker_death(exc):
        return None
    slots.remove_dead_children()
    return WorkerDiedError(WORKER_DIED.format(cause=str(exc).split(". ")[0]))


def _workers_watched(batches: Iterator[Any], slots: MainSlots) -> Generator[Any, None, None]:
    """``batches`` from DataLoader's iterator; a worker that died becomes :class:`WorkerDiedError` (torch's
    own message kept as the cause) and its slot files are removed. torch reports a dead worker from its
    SIGCHLD handler too, wherever the training process is (in a step, between batches): that handler is
    wrapped for as long as the iteration lasts, so the error is the same there."""
    slots.watch_children()
    previous = signal.getsignal(signal.SIGCHLD) if hasattr(signal, "SIGCHLD") else None
    wrapped = callable(previous) and threading.current_thread() is threading.main_thread()

    def on_child(signum: int, frame: Any) -> None:
        try:
            previous(signum, frame)  # type: ignore[misc,operator]
        except RuntimeError as exc:
            died = _worker_died(exc, slots)
            if died is None:
                raise
            raise died from exc

    if wrapped:
        signal.signal(signal.SIGCHLD, on_child)
    try:
        yield from batches
    except RuntimeError as exc:
        died = _worker_died(exc, slots)
        if died is None:
            raise
        raise died from exc
    finally:
        if wrapped and signal.getsignal(signal.SIGCHLD) is on_child:
            signal.signal(signal.SIGCHLD, previous)


def _shut_down(workers: Iterator[Any]) -> None:
    """Stop the DataLoader iterator's worker processes now (torch does it when the iterator is collected),
    so that the slot files of batches they made but never sent can be removed."""
    shut_down_workers(workers)


class DataLoader(torch.utils.data.DataLoader):  # type: ignore[type-arg]
    """``torch.utils.data.DataLoader`` for a :class:`ShardDataset` that can save and restore its position.

    The one line a training script adds: save ``loader.state_dict()`` with the checkpoint, and call
    ``loader.load_state_dict(state)`` after building the loader on restart. Batches already delivered are
    never delivered again; none are lost. The order is the rank's order for any ``num_workers``.
    ``loader.dataset`` is a handle on the dataset given (the same epoch and position).

    With ``on_error="skip"`` a batch may come out smaller; one whose samples were *all* skipped still
    counts as a step: the batch before it is delivered again (the first one after it, at the start of an
    epoch), so every rank takes the same number of steps and DDP does not hang. ``loader.repeated_batches``
    counts them (a warning says so once).

    Epochs: each new pass after a complete one reads the next epoch (its own order), unless
    :meth:`set_epoch` chose one (as with ``DistributedSampler``); a pass cut short and started again, or a
    restored position, continues the same epoch.

    ``autotune=True`` (or a :class:`~fastload.AutotuneConfig`): prefetch depth, fetches at once and read
    task size are adjusted while the loop runs, and ``num_workers`` between epochs, from the measured
    stage times (:mod:`fastload.train.autotune`; each change logged, in ``report()["autotune"]`` and in
    ``state_dict()["tuned"]``). The samples and their order are the same as without it.
    """

    def __init__(
        self,
        dataset: ShardDataset | Mix,
        batch_size: int = 1,
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        drop_last: bool = False,
        autotune: bool | AutotuneConfig = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(dataset, (ShardDataset, Mix)):
            raise ConfigError("fastload.DataLoader needs a fastload.ShardDataset or fastload.Mix")
        if kwargs.get("in_order") is False:
            raise ConfigError("fastload.DataLoader needs in_order=True (the default) for exact resume")
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size} must be >= 1")
        collate = collate_fn or torch.utils.data.default_collate
        self.fastload_batch_size = batch_size
        self.fastload_drop_last = drop_last
        # the handle yields whole chunks; they are collated in the worker, with the skip count alongside
        chunks = dataset.in_chunks(batch_size)
        collate_chunk = ChunkCollate(collate, into=chunks._telemetry)
        super().__init__(chunks, batch_size=None, collate_fn=collate_chunk, **kwargs)  # type: ignore[arg-type]
        self._tally = Tally()  # the loop process's own: hand-over out of shared memory, workers' S3
        self._delivered = 0
        self.skipped = 0
        self.repeated_batches = 0
        self._completed: int | None = None  # the epoch the last complete pass read
        self._epoch_chosen = False  # set_epoch/load_state_dict since then: no automatic advance
        self._slots = MainSlots(pin_memory=bool(self.pin_memory) and torch.cuda.is_available())
        self.tuner: Tuner | None = None
        tuning = config_of(autotune)
        if tuning is not None:  # (a Mix: every source's pipeline follows the one set of settings)
            sources = dataset.sources if isinstance(dataset, Mix) else (dataset,)
            self.tuner = Tuner(
                tuning,
                starting([d.prefetch for d in sources], self.num_workers),
                dataset._telemetry,  # (the handle shares its block)
                self.telemetry_vector,
                batch_size=batch_size,
                round_bytes=round_bytes(sources),
                leap_round_bytes=round_bytes(sources, parts=MAX_PARTS),
                streams=len(sources),
            )

    def __del__(self) -> None:
        # persistent workers outlive each epoch: when the loader goes, they stop first, then the files of
        # batches they made and never sent go with them (the slots' own close removes only those it saw)
        with contextlib.suppress(Exception):  # (also at interpreter exit, modules half torn down)
            workers = self.__dict__.get("_iterator")
            if workers is not None:
                _shut_down(workers)
            slots = self.__dict__.get("_slots")
            if slots is not None:
                slots.remove_dead_children()
                slots.close()
            tuner = self.__dict__.get("tuner")
            if tuner is not None:  # the dataset outlives its loader: another reads it untuned
                tuner.release()

    def __len__(self) -> int:
        """Batches in this epoch, as torch's and torchdata's loaders count them: after
        :meth:`load_state_dict` mid-epoch, the batches delivered before the checkpoint are included (what
        is left is ``len(loader)`` minus them: PyTorch Lightning subtracts the batches it restored)."""
        left = len(self.dataset)  # type: ignore[arg-type]
        done = int(getattr(self.dataset, "start", 0))  # samples delivered before a restore
        size = self.fastload_batch_size
        return done // size + (left // size if self.fastload_drop_last else -(-left // size))

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (its order from the dataset's seed and ``epoch``). Optional: without it,
        each new pass after a complete one reads the next epoch. After :meth:`load_state_dict`, setting the
        restored epoch keeps the restored position. Setting the epoch just read again warns: the same
        order as before."""
        if self._completed is not None and epoch == self._completed:
            warnings.warn(
                f"fastload.DataLoader.set_epoch({epoch}): epoch {epoch} was just read; this pass repeats its "
                "order exactly (set a new epoch number each epoch, or let the loader advance it)",
                UserWarning,
                stacklevel=2,
            )
        self.dataset.set_epoch(epoch)  # type: ignore[attr-defined]
        self._epoch_chosen = True

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        dataset: ShardDataset | Mix = self.dataset  # type: ignore[assignment]
        if self._completed is not None and not self._epoch_chosen and dataset.epoch == self._completed:
            dataset.set_epoch(self._completed + 1)  # a new pass after a complete one: the next epoch
            # (unless the epoch was chosen since: here, or on the dataset as with DistributedSampler)
        self._epoch_chosen = False
        tuner = self.tuner
        if tuner is not None:
            self._set_workers(tuner.settings.workers)
            tuner.begin()
        total = dataset.epoch_samples() if isinstance(dataset, Mix) else len(dataset.plan().samples)
        start = dataset.start
        if total is None:  # an endless Mix
            total = sys.maxsize
        self._delivered = 0
        slots = self._slots
        last: Any = None
        owed = 0  # steps whose samples were all skipped, before any batch to repeat
        workers: Iterator[Any] | None = None
        watched: Generator[Any, None, None] | None = None
        try:
            workers = super().__iter__()
            watched = _workers_watched(workers, slots)
            tally = self._tally
            for batch, size, skipped, error, slot, s3 in watched if tuner is None else tuner.timed(watched):
                if s3 is not None:  # the worker's S3 counters since its last batch: s3_stats() here sums all
                    runtime.current().stats.merge(s3)
                    tally.s3_delta(s3)
                elif self.num_workers == 0:  # this process reads the store itself
                    tally.s3_delta(runtime.current().stats.delta())
                if error is not None:
                    raise error
                if slot is not None:
                    started = clock_ns()
                    batch = slots.unpack(batch, slot)
                    tally.stage("handover", clock_ns() - started)
                tally.count("batches")
                if size < self.fastload_batch_size and self.fastload_drop_last:
                    break
                self.skipped += skipped
                if skipped:
                    dataset.count_skipped(skipped)
                self._delivered = min(total - start, self._delivered + self.fastload_batch_size)
                if batch is not None:
                    yield batch
                    last = batch
                    for _ in range(owed):
                        yield self._repeat(last)
                    owed = 0
                elif size:  # every sample skipped: a step all the same (equal steps on every rank)
                    if last is None:
                        owed += 1
                    else:
                        yield self._repeat(last)
            if owed:
                warnings.warn(
                    f"fastload.DataLoader: every sample of this epoch's {owed} batch(es) was skipped "
                    "(on_error='skip'), so there was no batch to repeat: this rank took fewer steps",
                    UserWarning,
                    stacklevel=2,
                )
        finally:
            if not self.persistent_workers:  # the next epoch's workers make new slots
                if watched is not None:
                    watched.close()
                if workers is not None:
                    _shut_down(workers)  # (an epoch left early: its workers may hold slots never sent)
                slots.remove_dead_children()
                slots.close()
        dataset.rewind()
        self._delivered = 0
        self._completed = dataset.epoch
        if tuner is not None:
            tuner.end_epoch()

    def _set_workers(self, workers: int) -> None:
        """Start the next pass with ``workers`` DataLoader workers (the tuner's; from 1 up, never to or
        from 0): persistent workers of another count are stopped first."""
        if workers == self.num_workers or workers < 1 or self.num_workers < 1:
            return
        running = self.__dict__.get("_iterator")
        if running is not None:
            _shut_down(running)
            self._iterator = None
            self._slots.remove_dead_children()
        self.num_workers = workers

    def _repeat(self, batch: Any) -> Any:
        self.repeated_batches += 1
        if self.repeated_batches == 1:
            warnings.warn(
                "fastload.DataLoader: every sample of a batch was skipped (on_error='skip'); a neighbouring "
                "batch is delivered again in its place so that every rank takes the same number of steps "
                "(DDP); loader.repeated_batches counts them and dataset.skipped the samples",
                UserWarning,
                stacklevel=3,
            )
        return batch

    def telemetry_vector(self) -> list[int]:
        """The workers' counters (the dataset's block) plus this process's own, as one
        :mod:`fastload.core.telemetry` vector."""
        return merge(self._tally.peek(), self.dataset.telemetry_vector())  # type: ignore[attr-defined]

    def report(self) -> dict[str, Any]:
        """Per-stage telemetry summed over the workers and this process (planning, fetch, parse, decode,
        ``map=``, collate, shared-memory hand-over; cache hits and misses; the workers' S3 requests,
        bytes, retries, throttles, hedges and first-byte latency) with ``s3``: this process's
        ``fastload.s3_stats()`` (the workers' included). See :func:`fastload.core.telemetry.summary`."""
        extra: dict[str, Any] = {"s3": runtime.current().stats.snapshot()}
        if self.tuner is not None:
            extra["autotune"] = self.tuner.report()
        return telemetry_report(self.telemetry_vector(), **extra)

    def state_dict(self) -> dict[str, Any]:
        """The dataset's state (epoch, what must match on restore), with ``delivered`` the samples of the
        epoch delivered to the training loop so far."""
        dataset: ShardDataset | Mix = self.dataset  # type: ignore[assignment]
        if isinstance(dataset, Mix):
            state = dataset.state_dict(delivered=dataset.start + self._delivered)
        else:
            state = dataset.state_dict()
            state["delivered"] = dataset.start + self._delivered
        state["batch_size"] = self.fastload_batch_size
        if self.tuner is not None:  # the tuned settings, restored with the position
            state["tuned"] = self.tuner.settings.as_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields exactly the samples not yet delivered (see
        :meth:`ShardDataset.load_state_dict`; the batch size and ``num_workers`` may differ)."""
        check_shape(state, owner="fastload.DataLoader", keys=("epoch", "delivered"))
        if "worker" in state:
            raise ConfigError(
                "this is one DataLoader worker's state, not fastload.DataLoader's; pass loader.state_dict()"
            )
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]
        self._delivered = 0
        self._epoch_chosen = True
        if self.tuner is not None and isinstance(state.get("tuned"), dict):
            self.tuner.restore(state["tuned"])
