"""What a :class:`~fastload.Mix` checkpoint records of the mixture it was taken from, and the error for a
checkpoint of another mixture, saying what differs (kept apart from the face, :mod:`.mix`, which imports
this module: ``mix`` below is a ``Mix``, not imported here)."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from fastload.core.versions import versions_of
from fastload.errors import ConfigError
from fastload.train.mixplan import Source
from fastload.train.statecheck import differences, grown_fix, refusal, source_change


def mixture_parts(
    mix: Any, world_size: int | None = None, spans: Mapping[int, int] | None = None
) -> dict[str, Any]:
    """What :meth:`Mix.fingerprint` digests, as a checkpoint records it (so a refused one can say what
    differs): the mixture's settings, and each source's order digest (over the first ``spans[s]`` shards
    of source ``s`` where given: an older version's)."""
    world = mix.rank_world()[1] if world_size is None else world_size
    spans = spans or {}
    return {
        "mixture": {
            "names": list(mix.names),
            "weights": [[step, list(w)] for step, w in mix.steps],
            "stop": mix.stop,
            "seed": mix.seed,
            "batch_size": mix.batch_size if len(mix.steps) > 1 else None,
        },
        "source_orders": {
            n: d.order_fingerprint(world, span=spans.get(s))
            for s, (n, d) in enumerate(zip(mix.names, mix.sources, strict=True))
        },
    }


class VersionSpans:
    """Which sources a restored mixture epoch reads over an older version (a checkpoint taken before they
    grew by an append) and their shard counts then; shared by every copy of the Mix (workers included)."""

    def __init__(self, sources: int) -> None:
        # [epoch + 1, shards of source 0, ...] (0: all of them)
        self._a = multiprocessing.get_context("spawn").RawArray(ctypes.c_int64, sources + 1)

    def of(self, epoch: int) -> dict[int, int]:
        """Source index -> shards, for ``epoch`` (none for any other epoch)."""
        a = self._a
        return {} if a[0] != epoch + 1 else {s: int(a[s + 1]) for s in range(len(a) - 1) if a[s + 1] > 0}

    def sources(self, plans: list[Source], epoch: int) -> list[Source]:
        """``plans`` as ``epoch`` reads them (a grown source over its older version's first shards)."""
        spans = self.of(epoch)
        return [replace(p, counts=p.counts[: spans[s]]) if s in spans else p for s, p in enumerate(plans)]

    @contextlib.contextmanager
    def kept_unless_done(self, epoch: int, spans: Mapping[int, int]) -> Iterator[None]:
        """Set ``spans`` for ``epoch``; put the previous ones back if the block raises."""
        before = list(self._a)
        for s in range(len(self._a) - 1):
            self._a[s + 1] = spans.get(s, 0)
        self._a[0] = epoch + 1 if spans else 0
        try:
            yield
        except BaseException:
            self._a[:] = before
            raise


def checkpoint_spans(mix: Any, state: Mapping[str, Any]) -> dict[int, int]:
    """For each source that grew by an append since the checkpoint ``state`` was taken, the number of
    shards of the version it read then (by source index): its epoch is finished over those shards. A
    version this dataset does not list is left out (the order check refuses it, saying what differs)."""
    saved = state.get("source_versions")
    versions: Mapping[str, Any] = saved if isinstance(saved, Mapping) else {}
    spans: dict[int, int] = {}
    for s, (name, d) in enumerate(zip(mix.names, mix.sources, strict=True)):
        then = versions.get(name, 1)
        if type(then) is not int or then >= d.view.version:
            continue
        found = next((v for v in versions_of(d.index) if v.version == then), None)
        if found is not None and found.shards < len(d.view.counts):
            spans[s] = found.shards
    return spans


def versions_read(mix: Any, spans: Mapping[int, int]) -> dict[str, int]:
    """The version each source reads (only those past 1: what a checkpoint without them read), over
    ``spans`` where given."""
    out: dict[str, int] = {}
    for s, (name, d) in enumerate(zip(mix.names, mix.sources, strict=True)):
        version = d.view.version
        if s in spans:
            version = next((v.version for v in versions_of(d.index) if v.shards == spans[s]), version)
        if version > 1:
            out[name] = version
    return out


def mixture_refusal(mix: Any, state: dict[str, Any], old_world: int) -> ConfigError:
    """The error for a checkpoint of another mixture than ``mix``, saying what differs."""
    mine = mixture_parts(mix, old_world, checkpoint_spans(mix, state))
    saved = state.get("mixture")
    found = []
    if isinstance(saved, dict):
        labels = {k: k if k != "weights" else "weights (per schedule step)" for k in mine["mixture"]}
        found = differences(saved, mine["mixture"], labels)
    orders = state.get("source_orders")
    saved_versions = state.get("source_versions")
    versions: dict[str, Any] = saved_versions if isinstance(saved_versions, dict) else {}
    grown: list[str] = []
    if isinstance(orders, dict):
        for name, digest in orders.items():
            if name in mine["source_orders"] and digest != mine["source_orders"][name]:
                now = mix.sources[mix.names.index(name)].view.version
                found.append(source_change(name, versions.get(name, 1), now, grown))
    fix = "Resume with the sources and settings the checkpoint was taken with" + grown_fix(grown)
    return refusal(
        "the mixture",
        found,
        unknown="the sources, their order settings, weights, schedule, stop, seed or batch size",
        fix=fix,
    )
