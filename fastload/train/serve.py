"""``fastload.serve``: a rank's batches made by feeders in other processes or machines (Ray actors), still
exactly once, in ``fastload.DataLoader``'s order, resumable.

Batch ``i`` of a rank's epoch is a pure function of the dataset, its settings and ``(epoch, rank, world,
i)``: a feeder opens the dataset itself and makes the batch with fastload's own read, check, decode,
``map=`` and collate (:func:`make_batch`), so any feeder makes the same one. The training process keeps a
:class:`~fastload.core.serveplan.ServeLedger` (what each feeder owes, back-pressure, order); a feeder that
dies has its batches made again by a new one; its position (batches delivered) is saved and restored with
the dataset's own ``state_dict()``. Ray is imported when a :class:`Served` starts its first epoch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch.utils.data

from fastload.core.serveplan import ServeLedger
from fastload.errors import ConfigError, FastloadError, WorkerDiedError
from fastload.train.chunks import ChunkCollate, chunks_of
from fastload.train.dataset import ShardDataset
from fastload.train.position import Iteration
from fastload.train.reading import read_samples

INSTALL_HINT = "pip install 'fastload[ray]'"
Job = tuple[int, tuple[int, int] | None, int, int, int, int]  # epoch, resumed, span, start, total, size


def make_batch(
    dataset: ShardDataset, job: Job, index: int, collate: Callable[[list[Any]], Any]
) -> tuple[Any, int, int, FastloadError | None]:
    """Batch ``index`` of ``job`` read from ``dataset`` (positions ``[start + index*size, ...)`` of the
    rank's order): ``(batch or None if every sample was skipped, samples, skipped, error)``."""
    epoch, resumed, span, start, total, size = job
    first = start + index * size
    stop = min(total, first + size)
    refs = dataset.refs_of(first, stop, epoch=epoch, resumed=resumed, span=span)
    progress = Iteration(epoch, first, resumed, 0, 1, None)
    samples = read_samples(
        refs,
        dataset.view,
        decoding=dataset.decoding,
        prefetch=dataset.prefetch,
        progress=progress,
        mark_skipped=True,
    )
    try:
        chunk = next(chunks_of(samples, len(refs), max(1, len(refs)), worker=None))
        batch, count, skipped, _, _, _ = ChunkCollate(collate)(chunk)
        return batch, count, skipped, None
    except FastloadError as exc:  # a value: it reaches the trainer with its type and data
        return None, stop - first, 0, exc
    finally:
        samples.close()


class Feeder:
    """What a Ray actor runs: the dataset opened in its own process, batches made on request."""

    def __init__(
        self, source: Any, options: dict[str, Any], collate: Callable[[list[Any]], Any], order: str
    ) -> None:
        self.dataset = ShardDataset(source, **options)
        self.collate = collate
        if self.dataset.order_fingerprint() != order:  # another dataset under the same name, here
            raise ConfigError(
                f"fastload.serve: the feeder on {os.uname().nodename} sees another dataset at {source!r} "
                f"(order fingerprint {self.dataset.order_fingerprint()}, the trainer's {order}); give "
                "every machine the same dataset"
            )

    def make(self, job: Job, index: int) -> tuple[Any, int, int, FastloadError | None]:
        return make_batch(self.dataset, job, index, self.collate)

    def pid(self) -> int:
        return os.getpid()


def _ray(address: str | None) -> Any:
    """The ``ray`` module, connected (a new local cluster when none is running and no address is given)."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"fastload.serve needs Ray, which is not installed: {INSTALL_HINT}") from None
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
    return ray


class Served:
    """A rank's batches from remote feeders; iterate it as a ``fastload.DataLoader`` (made by
    :func:`serve`). ``actors``: the feeders' Ray actor handles now (one is replaced when it dies);
    :meth:`add_feeder` starts one more (from the next batch assigned on)."""

    def __init__(
        self,
        source: Any,
        batch_size: int,
        *,
        options: dict[str, Any],
        collate_fn: Callable[[list[Any]], Any] | None,
        drop_last: bool,
        feeders: int,
        feeder_cpus: float,
        max_in_flight: int,
        window: int,
        max_feeder_deaths: int,
        feeder_timeout_s: float,
        ray_address: str | None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size} must be >= 1")
        if feeders < 1:
            raise ConfigError(f"feeders={feeders} must be >= 1")
        if not feeder_timeout_s > 0:
            raise ConfigError(f"feeder_timeout_s={feeder_timeout_s} must be > 0")
        self.dataset = ShardDataset(source, **options)
        self.batch_size, self.drop_last = batch_size, drop_last
        rank, world = self.dataset.rank_world()  # this process's (torch.distributed's): feeders have none
        self._source = source
        self._options = {**options, "version": self.dataset.view.version, "rank": rank, "world_size": world}
        self._collate = collate_fn or torch.utils.data.default_collate
        self._order = self.dataset.order_fingerprint()  # what every feeder must see
        self._feeders, self._cpus, self._address = feeders, feeder_cpus, ray_address
        self._max_in_flight, self._window, self._max_deaths = max_in_flight, window, max_feeder_deaths
        self._timeout_s = feeder_timeout_s
        self.actors: dict[int, Any] = {}
        self._starting: dict[Any, int] = {}  # a started feeder's "ready" object ref -> its name
        self._ready: set[int] = set()  # feeders that finished starting: the ledger's
        self._names = iter(range(1 << 62))
        self._delivered = 0
        self._completed: int | None = None
        self._epoch_chosen = False
        self.skipped = self.repeated_batches = self.feeder_deaths = 0

    # -- feeders ------------------------------------------------------------------------------------------

    def _start(self, ray: Any) -> None:
        """A new feeder; it joins the ledger once it has started (opened the dataset), so that its start
        (a process, imports, the index) is not taken for a stuck feeder."""
        actor_class = ray.remote(num_cpus=self._cpus)(Feeder)
        name = next(self._names)
        actor = actor_class.remote(self._source, self._options, self._collate, self._order)
        self.actors[name] = actor
        self._starting[actor.pid.remote()] = name

    def add_feeder(self) -> None:
        """One more feeder, now: it gets the next batches assigned (the stream is unchanged)."""
        ray = _ray(self._address)
        self._start(ray)

    def close(self) -> None:
        """Stop every feeder (they are kept between epochs otherwise)."""
        if self.actors:
            ray = _ray(self._address)
            for actor in self.actors.values():
                ray.kill(actor)
            self.actors.clear()
            self._starting.clear()
            self._ready.clear()

    # -- the loop's side ----------------------------------------------------------------------------------

    def __len__(self) -> int:
        left = len(self.dataset)
        done, size = self.dataset.start, self.batch_size
        return done // size + (left // size if self.drop_last else -(-left // size))

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (as :meth:`fastload.DataLoader.set_epoch`)."""
        self.dataset.set_epoch(epoch)
        self._epoch_chosen = True

    def __iter__(self) -> Iterator[Any]:
        ds = self.dataset
        if self._completed is not None and not self._epoch_chosen and ds.epoch == self._completed:
            ds.set_epoch(self._completed + 1)
        self._epoch_chosen = False
        epoch, start, resumed = ds.epoch, ds.start, ds.resumed_from()
        total = len(ds.plan().samples)
        job: Job = (epoch, resumed, ds.span_of(epoch), start, total, self.batch_size)
        self._delivered = 0
        last: Any = None
        owed = 0
        for batch, size, skipped in self._batches(job):
            if size < self.batch_size and self.drop_last:
                break
            self.skipped += skipped
            if skipped:
                ds.count_skipped(skipped)
            self._delivered = min(total - start, self._delivered + self.batch_size)
            if batch is not None:
                yield batch
                last = batch
                for _ in range(owed):
                    self.repeated_batches += 1
                    yield last
                owed = 0
            elif size:  # every sample skipped: a step all the same, as fastload.DataLoader
                if last is None:
                    owed += 1
                else:
                    self.repeated_batches += 1
                    yield last
        ds.rewind()
        self._delivered = 0
        self._completed = epoch

    def _batches(self, job: Job) -> Iterator[tuple[Any, int, int]]:
        """``(batch, samples, skipped)`` of ``job``'s batches, in order, from the feeders."""
        ray = _ray(self._address)
        _, _, _, start, total, size = job
        ledger: ServeLedger[int] = ServeLedger(
            -(-(total - start) // size), max_in_flight=self._max_in_flight, window=self._window
        )
        while len(self.actors) < self._feeders:
            self._start(ray)
        for name in self._ready:
            ledger.add(name)
        sent: dict[Any, tuple[int, int]] = {}  # object ref -> (feeder, batch index)
        made: dict[int, tuple[Any, int, int]] = {}
        while not ledger.done:
            while (index := ledger.deliver()) is not None:
                yield made.pop(index)
            if ledger.done:
                break
            for name, index in ledger.assign():
                sent[self.actors[name].make.remote(job, index)] = (name, index)
            ready, _ = ray.wait([*sent, *self._starting], num_returns=1, timeout=self._timeout_s)
            owner = next((f for f in ledger.feeders if ledger.watermark in ledger.owed(f)), None)
            if not ready and owner is not None:  # nothing for feeder_timeout_s, the next batch its
                name = owner
                ray.kill(self.actors[name])
                stuck = TimeoutError(
                    f"feeder {name} made nothing for feeder_timeout_s={self._timeout_s} (batch "
                    f"{ledger.watermark} was due); it was stopped"
                )
                self._lost(ray, ledger, name, stuck)
            for ref in ready:
                if ref in self._starting:
                    self._started(ray, ledger, ref)
                    continue
                name, index = sent.pop(ref)
                try:
                    batch, count, skipped, error = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    if name in self.actors:
                        self._lost(ray, ledger, name, exc)
                    continue
                if error is not None:
                    raise error
                if ledger.arrived(name, index):
                    made[index] = (batch, count, skipped)

    def _started(self, ray: Any, ledger: ServeLedger[int], ref: Any) -> None:
        """A feeder's start ended: it joins the ledger, or (it died starting) is replaced."""
        name = self._starting.pop(ref)
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            if name in self.actors:
                self._lost(ray, ledger, name, exc)
            return
        self._ready.add(name)
        ledger.add(name)

    def _lost(self, ray: Any, ledger: ServeLedger[int], name: int, exc: Exception) -> None:
        """Feeder ``name`` died: its batches go back to the ledger and a new feeder takes its place (one
        that could not start is an error: another would fail alike)."""
        if getattr(exc, "actor_init_failed", False):
            raise ConfigError(
                f"fastload.serve: a feeder could not start ({exc}). It opens the dataset in its own process "
                "and unpickles map= and collate_fn there: check that the source is readable from the "
                "feeders' machines and that those functions' modules are importable there (or pickled by "
                "value: ray.cloudpickle.register_pickle_by_value(module))"
            ) from None
        self.feeder_deaths += 1
        if self.feeder_deaths > self._max_deaths:
            raise WorkerDiedError(
                f"fastload.serve: {self.feeder_deaths} feeders died (the last: {exc}); more than "
                f"max_feeder_deaths={self._max_deaths}. Check the feeders' memory and logs; batches "
                "delivered so far are in state_dict(): resume from your last checkpoint"
            ) from exc
        del self.actors[name]
        self._ready.discard(name)
        ledger.lose(name)
        self._start(ray)

    # -- position -----------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The dataset's state with ``delivered`` the samples of the epoch delivered to the loop so far
        (the same as ``fastload.DataLoader``'s: either restores the other's)."""
        state = self.dataset.state_dict()
        state["delivered"] = self.dataset.start + self._delivered
        state["batch_size"] = self.batch_size
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields exactly the batches not yet delivered."""
        self.dataset.load_state_dict(state)
        self._delivered = 0
        self._epoch_chosen = True


def serve(
    source: Any,
    batch_size: int = 1,
    *,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    drop_last: bool = False,
    feeders: int = 2,
    feeder_cpus: float = 1.0,
    max_in_flight: int = 2,
    window: int = 8,
    max_feeder_deaths: int = 8,
    feeder_timeout_s: float = 600.0,
    ray_address: str | None = None,
    **options: Any,
) -> Served:
    """Batches of ``source`` (what :class:`~fastload.ShardDataset` takes, with its keywords in
    ``options``: ``map=``, ``seed=``, ``rank=``, ...) made by ``feeders`` Ray actors of ``feeder_cpus``
    CPUs each, delivered in ``fastload.DataLoader``'s order with its ``state_dict``/``load_state_dict``/
    ``set_epoch``. ``max_in_flight`` batches per feeder, at most ``window`` batches held by this process
    (arrived or in flight). A feeder that makes nothing for ``feeder_timeout_s`` while the next batch is
    its own is stopped and replaced, as a dead one (``max_feeder_deaths`` in all, then an error). Ray:
    the cluster at ``ray_address`` (None: the one this process is connected to, else ``RAY_ADDRESS``, else
    a new local one). ``map=`` and ``collate_fn`` must pickle (cloudpickle)."""
    return Served(
        source,
        batch_size,
        options=options,
        collate_fn=collate_fn,
        drop_last=drop_last,
        feeders=feeders,
        feeder_cpus=feeder_cpus,
        max_in_flight=max_in_flight,
        window=window,
        max_feeder_deaths=max_feeder_deaths,
        feeder_timeout_s=feeder_timeout_s,
        ray_address=ray_address,
    )


__all__ = ["Feeder", "Served", "make_batch", "serve"]
