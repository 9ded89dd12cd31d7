"""``fastload.Mix``: several :class:`~fastload.ShardDataset` sources read as one stream, by weight.

Position ``t`` of a rank's mixture epoch reads the source :class:`fastload.core.mix.Schedule` chooses (the
same on every rank, so per-source counts are equal across ranks); that source's next sample comes from its
own rank order (:mod:`fastload.core.sharding`), pass after pass: pass ``p`` of mixture epoch ``E`` is the
source's epoch ``E * 2**32 + p`` (:mod:`.mixplan`). Positions are dealt to DataLoader workers in chunks of
``batch_size`` as a ``ShardDataset`` deals its own, so the stream reaching the loop is the same for any
``num_workers``. Each worker reads each source through its own prefetching pipeline and interleaves them by
the schedule (:mod:`.mixread`). This module is the public face: options, position, state. See
docs/mixtures.md.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.utils.data

from fastload.core.mix import (
    STOP_RULES,
    Schedule,
    dealt,
    worker_blocks,
    worker_position,
)
from fastload.errors import ConfigError
from fastload.train.chunks import chunks_of
from fastload.train.dataset import ShardDataset
from fastload.train.mixplan import MixPlan, Source, plan_epoch
from fastload.train.mixread import interleave, source_samples
from fastload.train.mixstate import (
    VersionSpans,
    checkpoint_spans,
    mixture_parts,
    mixture_refusal,
    versions_read,
)
from fastload.train.mixweights import Weights, sample_weights, tokens_per_sample
from fastload.train.position import Iteration, PositionMethods, SharedPosition
from fastload.train.reading import SKIPPED
from fastload.train.statecheck import check_shape
from fastload.train.telemetry import SharedCounters, Tally, TelemetryMethods, clock_ns


class Mix(PositionMethods, TelemetryMethods, torch.utils.data.IterableDataset[dict[str, Any]]):
    """Samples of several ``ShardDataset`` sources, each position drawn from a source by weight.

    ``sources``: ``{name: dataset}`` (or a list: names ``"0"``, ``"1"``, ...); ``weights``: by name or in
    order (default equal; any non-negative numbers, normalised). ``schedule``: ``[(step, weights), ...]``,
    the weights from batch ``step`` on (steps of ``batch_size`` samples per rank, increasing, > 0).
    ``stop``: ``"first_exhausted"`` (the epoch ends when a source's pass runs out), ``"all_exhausted"``
    (sources that run out start their next pass until every one has finished a pass) or ``"never"`` (an
    endless stream; each source starts its next pass when one ends). ``seed`` sets where each segment's
    period starts; the sources' own seeds shuffle them. ``batch_size``: the DataLoader's batch size
    (``fastload.DataLoader`` gives its own); needed with a schedule or several torch DataLoader workers.
    ``weigh_by="tokens"``: the weights are shares of tokens, not of samples, for token datasets (``fastload
    pack-tokens``): each source's sample weight is its token weight over its mean tokens per document.
    Each sample carries ``__source__``, its source's name. Bound on the proportions: docs/mixtures.md.
    """

    def __init__(
        self,
        sources: Mapping[str, ShardDataset] | Sequence[ShardDataset],
        weights: Weights | None = None,
        *,
        schedule: Sequence[tuple[int, Weights]] | None = None,
        stop: str = "first_exhausted",
        seed: int | None = None,
        batch_size: int | None = None,
        weigh_by: str = "samples",
    ) -> None:
        super().__init__()
        named = dict(sources) if isinstance(sources, Mapping) else {str(i): d for i, d in enumerate(sources)}
        if not named or not all(isinstance(d, ShardDataset) for d in named.values()):
            raise ConfigError("Mix needs one or more fastload.ShardDataset sources")
        if stop not in STOP_RULES:
            raise ConfigError(f"stop={stop!r}; choose one of {', '.join(STOP_RULES)}")
        if batch_size is not None and batch_size < 1:
            raise ConfigError(f"batch_size={batch_size} must be >= 1 (or None)")
        self.names = tuple(named)
        self.sources = tuple(named.values())
        worlds = {d.rank_world() for d in self.sources}
        if len(worlds) != 1:
            raise ConfigError(f"the sources disagree on (rank, world_size): {sorted(worlds)}; align them")
        for name, d in named.items():
            if d.index.samples == 0:
                raise ConfigError(f"source {name!r} ({d.root}) has no samples")
        if weigh_by not in ("samples", "tokens"):
            raise ConfigError(f"weigh_by={weigh_by!r}; choose 'samples' or 'tokens'")
        self.weigh_by = weigh_by
        self._per_sample = tokens_per_sample(named) if weigh_by == "tokens" else None
        steps = [(0, self._weights(weights))]
        if callable(schedule) or isinstance(schedule, (str, bytes, Mapping)):
            raise ConfigError(
                f"schedule={schedule!r} must be a list of (step, weights) pairs; a function is not taken "
                "(a checkpoint must be able to tell the schedule is the same): build the list from it, e.g. "
                "[(s, f(s)) for s in range(0, steps, every)]"
            )
        for item in schedule or ():
            if not isinstance(item, (tuple, list)) or len(item) != 2 or not isinstance(item[0], int):
                raise ConfigError(f"schedule entry {item!r} must be a (step, weights) pair with an int step")
            step, w = item
            if step <= steps[-1][0]:
                raise ConfigError(f"schedule steps must be > 0 and increase; got {step} after {steps[-1][0]}")
            steps.append((int(step), self._weights(w)))
        self.steps = tuple(steps)
        self.stop, self.seed, self.batch_size = stop, seed, batch_size
        self._plans = [Source.of(name, d) for name, d in named.items()]
        self._spans = VersionSpans(len(self._plans))  # a restored epoch read over older versions
        self._shared = SharedPosition()
        self._telemetry = SharedCounters()  # per-stage counters, summed over workers (report())
        self._pending: Iteration | None = None  # a worker-level restore, for this process's next pass
        self._live: Iteration | None = None  # this process's pass under way (or last, in a worker)
        self._chunked = False
        self._loader_batch: int | None = None  # the batch size of the fastload.DataLoader reading it

    def _weights(self, weights: Weights | None) -> tuple[float, ...]:
        return sample_weights(weights, self.names, self._per_sample)

    def __repr__(self) -> str:
        return f"Mix({dict(zip(self.names, self.steps[0][1], strict=True))}, stop={self.stop!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_plan_cache", None)
        return state

    def in_chunks(self, batch_size: int) -> Mix:
        """Another handle on this mixture (same epoch and position) that yields one chunk per
        ``batch_size`` positions, dealt to workers in turns: what ``fastload.DataLoader`` reads."""
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size} must be >= 1")
        self._loader_batch = batch_size  # its schedule's steps, reports and state count these batches
        handle = object.__new__(Mix)
        handle.__dict__.update(self.__getstate__())
        handle.batch_size, handle._chunked = batch_size, True
        handle._pending = handle._live = None
        return handle

    # -- position (shared with DataLoader workers: epoch, start, skipped in PositionMethods) ---------------

    def rank_world(self) -> tuple[int, int]:
        return self.sources[0].rank_world()

    # -- planning -----------------------------------------------------------------------------------------

    def _step_size(self) -> int | None:
        """The batch size a schedule's steps count: that of the ``fastload.DataLoader`` reading this
        mixture, else ``batch_size=`` (None: neither)."""
        return self._loader_batch or self.batch_size

    def schedule(self, epoch: int | None = None) -> Schedule:
        """The choices of mixture epoch ``epoch`` (default: the current one)."""
        if len(self.steps) > 1 and self._step_size() is None:
            raise ConfigError(
                "a Mix with a schedule needs batch_size= (steps are batches of it), or fastload.DataLoader"
            )
        size = self._step_size() or 1
        starts = [step * size for step, _ in self.steps]
        epoch = self.epoch if epoch is None else epoch
        return Schedule(starts, [w for _, w in self.steps], seed=self.seed, epoch=epoch)

    def plan(self, epoch: int | None = None) -> MixPlan:
        """This rank's plan of mixture epoch ``epoch`` (default: the current one, resumed as restored)."""
        epoch = self.epoch if epoch is None else epoch
        return self._plan(epoch, self._shared.resumed_from() if epoch == self.epoch else None)

    def _plan(self, epoch: int, resumed: tuple[int, int] | None) -> MixPlan:
        rank, world = self.rank_world()
        key = (epoch, resumed, rank, world, self._step_size(), tuple(self._spans.of(epoch).items()))
        cached = self.__dict__.get("_plan_cache")
        if cached is not None and cached[0] == key:
            return cached[1]  # type: ignore[no-any-return]
        schedule = self.schedule(epoch)
        sources = self._spans.sources(self._plans, epoch)
        plan = plan_epoch(
            sources, schedule, epoch=epoch, rank=rank, world=world, stop=self.stop, resumed=resumed
        )
        self._plan_cache = (key, plan)
        return plan

    def epoch_samples(self) -> int | None:
        """Positions in the current mixture epoch on this rank (None: ``stop="never"``)."""
        return self.plan().end

    def __len__(self) -> int:
        end = self.epoch_samples()
        if end is None:
            raise TypeError("a Mix with stop='never' is endless: it has no len()")
        return end - self.start

    def source_counts(self, position: int | None = None) -> dict[str, int]:
        """Samples drawn from each source in positions ``[0, position)`` of this epoch (default: those
        delivered before the current iteration)."""
        at = self.start if position is None else position
        return dict(zip(self.names, (int(c) for c in self.plan().schedule.counts(at)), strict=True))

    def epoch_report(self, epoch: int | None = None) -> dict[str, Any]:
        """The epoch's length (None: endless), per source the samples it gives (to the end, or delivered so
        far when endless), its passes started and its weights per segment, samples skipped on error, and
        shards its sources read past their ``cache_dir`` (it could not store them)."""
        plan = self.plan(epoch)
        upto = self.start if plan.end is None else plan.end
        counts = self.source_counts(upto)
        report: dict[str, Any] = {"samples": plan.end, "stop": self.stop, "skipped_on_error": self.skipped}
        report["cache_bypassed"] = sum(d.cache_bypassed for d in self.sources)  # (their cache_dir)
        report["skipped_samples"] = self.skipped_samples
        rank, world = self.rank_world()
        e = self.epoch if epoch is None else epoch
        plans = self._spans.sources(self._plans, e)
        sources = {}
        for s, name in enumerate(self.names):
            got, passes, size = counts[name] - int(plan.drawn[s]), plan.passes[s], len(plan.firsts[s])
            while got > size:
                got -= size
                passes += 1
                size = plans[s].length(e, passes, rank, world)
            weights = [p.quota[s] / p.period for p in plan.schedule.patterns]
            sources[name] = {"samples": counts[name], "passes": passes + 1, "weights": weights}
        report["sources"] = sources
        return report

    # -- the Stateful protocol ----------------------------------------------------------------------------

    def fingerprint(self, world_size: int | None = None, *, epoch: int | None = None) -> str:
        """A digest of what decides the stream: names, weights and schedule, stop rule, seed, batch size
        when a schedule needs it, and each source's order at ``world_size`` (default: this run's) as epoch
        ``epoch`` (default: the current one) reads it."""
        world = self.rank_world()[1] if world_size is None else world_size
        return self._digest(world, self._spans.of(self.epoch if epoch is None else epoch))

    def _digest(self, world: int, spans: Mapping[int, int]) -> str:
        orders = [d.order_fingerprint(world, span=spans.get(s)) for s, d in enumerate(self.sources)]
        size = self._step_size() if len(self.steps) > 1 else None
        settings = repr((self.names, self.steps, self.stop, self.seed, size, orders))
        return hashlib.sha256(settings.encode()).hexdigest()[:16]

    def state_dict(self, *, delivered: int | None = None) -> dict[str, Any]:
        """Epoch, positions delivered (``delivered``: default those before the current iteration, or in
        this process's iteration), samples drawn from each source, and what must match on restore; in a
        DataLoader worker also ``worker``: its slot and how many of its own positions it has passed
        (torchdata's ``StatefulDataLoader`` keeps one such state per worker). Size O(sources)."""
        live = next((x for x in (self._pending, self._live) if x is not None and x.mine()), None)
        info = torch.utils.data.get_worker_info()
        if live is None:
            (epoch, at), consumed = self._saved_epoch(), 0
            resumed = self._shared.resumed_from() if epoch == self.epoch else None
        else:
            epoch, at, resumed, consumed = live.epoch, live.start, live.resumed, live.consumed
            at += consumed if info is None else 0
        at = at if delivered is None else delivered
        rank, world = self.rank_world()
        counts = self._plan(epoch, resumed).schedule.counts(at)
        state: dict[str, Any] = {
            "kind": "fastload.Mix",
            "epoch": epoch,
            "delivered": at,
            "world_size": world,
            "rank": rank,
            "order": self._digest(world, self._spans.of(epoch)),
            **mixture_parts(self, spans=self._spans.of(epoch)),
            "sources": dict(zip(self.names, (int(c) for c in counts), strict=True)),
        }
        grown = versions_read(self, self._spans.of(epoch))
        if grown:  # the versions read where not 1 (what a checkpoint without them read: kept small)
            state["source_versions"] = grown
        if resumed is not None:
            state["resumed_from"] = {"world_size": resumed[0], "delivered": resumed[1]}
        if info is not None:
            slot = {"id": info.id, "count": info.num_workers, "chunk": self.batch_size}
            state["worker"] = {**slot, "consumed": consumed}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (any rank's: ranks in step have delivered the same positions and drawn
        the same per source); under another world size each source's rest of its pass is dealt to the new
        ranks (sources with ``even="none"`` cannot, their ranks' passes differ in length)."""
        check_shape(state, owner="Mix", keys=("kind", "epoch", "delivered", "world_size"))
        if state.get("kind") != "fastload.Mix":
            raise ConfigError("this state is not a fastload.Mix's; restore it into what saved it")
        _, world = self.rank_world()
        old_world = int(state["world_size"])
        spans = checkpoint_spans(self, state)  # sources grown since: their epoch ends over the old version
        if state.get("order") != self._digest(old_world, spans):
            raise mixture_refusal(self, state, old_world)
        epoch, delivered = int(state["epoch"]), int(state["delivered"])
        with self._spans.kept_unless_done(epoch, spans):
            self._checked_restore(state, epoch, delivered, old_world, world)

    def _checked_restore(
        self, state: dict[str, Any], epoch: int, delivered: int, old_world: int, world: int
    ) -> None:
        """:meth:`load_state_dict` once the checkpoint's mixture is this one: check its position, restore."""
        resumed = self._resumed_by(state, old_world, world)
        if old_world != world:
            uneven = [n for n, d in zip(self.names, self.sources, strict=True) if d.even == "none"]
            if uneven:
                raise ConfigError(
                    f"cannot resume under world_size={world} (was {old_world}): sources {uneven} use "
                    "even='none', whose ranks' passes differ in length; use split, drop or pad"
                )
        end = self._plan(epoch, resumed).end
        if delivered < 0 or (end is not None and delivered > end):
            raise ConfigError(
                f"cannot resume: the checkpoint has delivered={delivered} positions of epoch {epoch}, this "
                f"rank's epoch has {end}; resume with the same sources and settings"
            )
        self._restore(state, epoch, delivered, resumed)

    # -- iteration ----------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if workers > 1 and self.batch_size is None:
            raise ConfigError(
                f"fastload.Mix read by {workers} DataLoader workers needs batch_size= (the DataLoader's), "
                "so workers take turns by batch; or use fastload.DataLoader"
            )
        pending, self._pending = self._pending, None
        if pending is not None and pending.mine() and (pending.worker, pending.workers) == (worker, workers):
            live = pending
        else:
            if not self._chunked:  # (fastload.DataLoader sets its epochs)
                self._next_pass()
            resumed = self._shared.resumed_from()
            live = Iteration(self.epoch, self.start, resumed, worker, workers, self.batch_size)
        self._passed(live.epoch)
        self._live = live
        on, s3 = self._telemetry.on, info is not None and not self._chunked
        tally = Tally(self._telemetry, s3=s3) if on else None
        started = clock_ns()
        plan, start = self._plan(live.epoch, live.resumed), live.start
        if tally is not None:
            tally.stage("plan", clock_ns() - started)
        chunk = self.batch_size if workers > 1 and self.batch_size else 1 << 16
        deal = {"start": start, "worker": worker, "workers": workers, "chunk": chunk}
        first = int(worker_position(live.consumed, **deal))
        if plan.end is not None:
            first = min(first, plan.end)
        rank, world = self.rank_world()
        sources = self._spans.sources(self._plans, plan.epoch)
        streams = []
        for s, (name, d) in enumerate(zip(self.names, self.sources, strict=True)):
            next_pass = functools.partial(sources[s].order, plan.epoch, rank=rank, world=world)
            streams.append(
                source_samples(
                    d,
                    name,
                    plan,
                    s,
                    first=first,
                    next_pass=next_pass,
                    report=self.note_skipped,
                    tally=tally,
                    tuning=self._telemetry.tuning,  # (None until fastload.DataLoader(autotune=True))
                    **deal,
                )
            )
        blocks = worker_blocks(stop=plan.end, skip=live.consumed, **deal)
        samples = interleave(plan.schedule, blocks, streams, live)
        try:
            if self._chunked:  # fastload.DataLoader counts what it delivers and rewinds at the end
                size = self.batch_size or 1
                count = sys.maxsize if plan.end is None else dealt(plan.end - start, worker, workers, size)
                yield from chunks_of(samples, count - live.consumed, size, worker=worker if info else None)
                return
            for out in samples:
                if out is not SKIPPED:
                    yield out
                else:  # (a worker of a torch DataLoader too, under a lock)
                    self.count_skipped(1)
            if info is None:  # a complete pass in this process: the next one reads the next epoch
                self._shared.complete()
                self._live = None
        finally:
            samples.close()
            for stream in streams:
                stream.close()


__all__ = ["Mix"]
