"""``fastload.serve``: a rank's batches made by feeders in other processes or machines (Ray actors), still
exactly once, in ``fastload.DataLoader``'s order, resumable.

Batch ``i`` of a rank's epoch is a pure function of the dataset, its settings and ``(epoch, rank, world, i)``:
a feeder opens the dataset itself and makes the batch with fastload's own read, check, decode, ``map=`` and
collate (:mod:`fastload.train.feeder`), so any feeder makes the same one. The training process keeps a
:class:`~fastload.core.serveplan.ServeLedger` (what each feeder owes, back-pressure, order); a feeder that
dies has its batches made again by a new one; its position (batches delivered) is saved and restored with the
dataset's own ``state_dict()``. Ray is imported when a :class:`Served` starts its first epoch; one that
started Ray shuts it down when closed or collected (:func:`_release`).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch.utils.data

from fastload.core.serveplan import ServeLedger
from fastload.core.telemetry import merge, zeros
from fastload.errors import ConfigError, WorkerDiedError
from fastload.train.dataset import ShardDataset
from fastload.train.feeder import Feeder, Job, actor_options, check_source, from_wire
from fastload.train.telemetry import Tally, clock_ns
from fastload.train.telemetry import report as telemetry_report

INSTALL_HINT = "pip install 'fastload[ray]'"


class _Ray:
    """This process's Ray connection as serve sees it: whether serve made it (its ``ray.init``: a new local
    cluster, or a connection to a running one) and how many :class:`Served` use it; the last of them to
    close shuts it down (stops the local cluster, or disconnects)."""

    started = False
    users = 0


def _ray(address: str | None) -> Any:
    """The ``ray`` module, connected (a new local cluster when none is running and no address is given)."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"fastload.serve needs Ray, which is not installed: {INSTALL_HINT}") from None
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
        _Ray.started, _Ray.users = True, 0  # (a new local cluster, or a connection to a running one)
    return ray


def _release(actors: dict[int, Any], lease: list[bool]) -> None:
    """Stop ``actors`` and give back a :class:`Served`'s use of Ray (``lease[0]``): what its ``close()``
    and its garbage collection do."""
    if not actors and not lease[0]:
        return  # (never connected)
    import ray

    if ray.is_initialized():
        for actor in actors.values():
            with contextlib.suppress(Exception):  # already gone, or Ray going down: nothing to stop
                ray.kill(actor)
    actors.clear()
    if lease[0]:
        lease[0] = False
        _Ray.users -= 1
        if _Ray.users <= 0 and _Ray.started and ray.is_initialized():
            ray.shutdown()
            _Ray.started = False


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
        feeder_resources: Mapping[str, float] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size} must be >= 1")
        if feeders < 1:
            raise ConfigError(f"feeders={feeders} must be >= 1")
        if not feeder_timeout_s > 0:
            raise ConfigError(f"feeder_timeout_s={feeder_timeout_s} must be > 0")
        check_source(source)
        self.dataset = ShardDataset(source, **options)
        self.batch_size, self.drop_last = batch_size, drop_last
        rank, world = self.dataset.rank_world()  # this process's (torch.distributed's): feeders have none
        self._source = source
        self._options = {**options, "version": self.dataset.view.version, "rank": rank, "world_size": world}
        self._collate = collate_fn or torch.utils.data.default_collate
        self._order = self.dataset.order_fingerprint()  # what every feeder must see
        self._feeders, self._cpus, self._address = feeders, feeder_cpus, ray_address
        self._max_in_flight, self._window, self._max_deaths = max_in_flight, window, max_feeder_deaths
        self._timeout_s, self._resources = feeder_timeout_s, dict(feeder_resources or {})
        self.actors: dict[int, Any] = {}
        self._starting: dict[Any, int] = {}  # a started feeder's "ready" object ref -> its name
        self._ready: set[int] = set()  # feeders that finished starting: the ledger's
        self._names = iter(range(1 << 62))
        self._delivered = 0
        self._completed: int | None = None
        self._epoch_chosen = False
        self.skipped = self.repeated_batches = self.feeder_deaths = 0
        self._tally = Tally()  # this process's: batches received, their hand-over (Ray's get)
        self._telemetry: dict[int, tuple[int, dict[int, int]]] = {}  # feeder -> its latest (stamp, cells)
        self._lease = [False]  # whether this Served counts among Ray's users (_Ray)
        self._finalizer = weakref.finalize(self, _release, self.actors, self._lease)

    def _connect(self) -> Any:
        """The ``ray`` module, connected; this Served counted among its users until :meth:`close`."""
        ray = _ray(self._address)
        if not self._lease[0]:
            self._lease[0] = True
            _Ray.users += 1
            if not self._finalizer.alive:  # closed before: released again when collected
                self._finalizer = weakref.finalize(self, _release, self.actors, self._lease)
        return ray

    # -- feeders ------------------------------------------------------------------------------------------

    def _start(self, ray: Any) -> None:
        """A new feeder; it joins the ledger once it has started (opened the dataset), so that its start
        (a process, imports, the index) is not taken for a stuck feeder."""
        actor_class = ray.remote(**actor_options(ray, self._cpus, self._resources))(Feeder)
        name = next(self._names)
        actor = actor_class.remote(self._source, self._options, self._collate, self._order)
        self.actors[name] = actor
        self._starting[actor.pid.remote()] = name

    def add_feeder(self) -> None:
        """One more feeder, now: it gets the next batches assigned (the stream is unchanged)."""
        self._start(self._connect())

    def close(self) -> None:
        """Stop every feeder (they are kept between epochs otherwise) and, if ``serve`` connected this
        process to Ray (``ray.init`` was not called before) and no other open :class:`Served` uses it,
        ``ray.shutdown()``. Done as well when this object is garbage-collected; iterating again
        afterwards starts anew."""
        self._finalizer()
        self._starting.clear()
        self._ready.clear()

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        ray = self._connect()
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
                got = clock_ns()
                try:
                    batch, count, skipped, error, (stamp, cells) = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    if name in self.actors:
                        self._lost(ray, ledger, name, exc)
                    continue
                if stamp > self._telemetry.get(name, (0, {}))[0]:
                    self._telemetry[name] = (stamp, cells)
                if error is not None:
                    raise error
                if ledger.arrived(name, index):
                    made[index] = (from_wire(batch), count, skipped)
                    self._tally.stage("handover", clock_ns() - got)
                    self._tally.count("batches")

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

    # -- telemetry ----------------------------------------------------------------------------------------

    def feeder_vectors(self) -> dict[str, list[int]]:
        """Each feeder's own telemetry (:mod:`fastload.core.telemetry` vectors) as of its last batch to
        arrive, by name (``feeder0``, ``feeder1``, ...; a replaced feeder keeps its entry)."""
        out: dict[str, list[int]] = {}
        for name, (_, cells) in sorted(self._telemetry.items()):
            vector = out[f"feeder{name}"] = zeros()
            for i, v in cells.items():
                vector[i] = v
        return out

    def telemetry_vector(self) -> list[int]:
        """Every feeder's telemetry and this process's (batches received, their hand-over) summed."""
        total = self._tally.peek()
        for vector in self.feeder_vectors().values():
            merge(total, vector)
        return total

    def report(self) -> dict[str, Any]:
        """Per-stage telemetry as :meth:`fastload.DataLoader.report`'s, summed over the feeders, with
        ``feeders``: each feeder's own summary by name (:meth:`feeder_vectors`)."""
        feeders = {name: telemetry_report(v) for name, v in self.feeder_vectors().items()}
        return telemetry_report(self.telemetry_vector(), feeders=feeders)

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
    feeder_resources: Mapping[str, float] | None = None,
    **options: Any,
) -> Served:
    """Batches of ``source`` (what :class:`~fastload.ShardDataset` takes, with its keywords in ``options``:
    ``map=``, ``seed=``, ``rank=``, ...) made by ``feeders`` Ray actors of ``feeder_cpus`` CPUs each,
    delivered in ``fastload.DataLoader``'s order with its ``state_dict``/``load_state_dict``/ ``set_epoch``.
    ``max_in_flight`` batches per feeder, at most ``window`` batches held by this process (arrived or in
    flight). A feeder that makes nothing for ``feeder_timeout_s`` while the next batch is its own is stopped
    and replaced, as a dead one (``max_feeder_deaths`` in all, then an error). Ray: the cluster at
    ``ray_address`` (None: the one this process is connected to, else ``RAY_ADDRESS``, else a new local one);
    ``feeder_resources``: Ray custom resources each feeder asks for (placing it on the nodes near the data).
    ``map=`` and ``collate_fn`` must pickle (cloudpickle)."""
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
        feeder_resources=feeder_resources,
    )


__all__ = ["Served", "serve"]
