"""What a :class:`~fastload.Mix` checkpoint records of the mixture it was taken from, and the error for a
checkpoint of another mixture, saying what differs (kept apart from the face, :mod:`.mix`, which imports
this module: ``mix`` below is a ``Mix``, not imported here)."""

from __future__ import annotations

from typing import Any

from fastload.errors import ConfigError
from fastload.train.statecheck import differences, grown_fix, refusal, source_change


def mixture_parts(mix: Any, world_size: int | None = None) -> dict[str, Any]:
    """What :meth:`Mix.fingerprint` digests, as a checkpoint records it (so a refused one can say what
    differs): the mixture's settings, and each source's order digest."""
    world = mix.rank_world()[1] if world_size is None else world_size
    return {
        "mixture": {
            "names": list(mix.names),
            "weights": [[step, list(w)] for step, w in mix.steps],
            "stop": mix.stop,
            "seed": mix.seed,
            "batch_size": mix.batch_size if len(mix.steps) > 1 else None,
        },
        "source_orders": {n: d.order_fingerprint(world) for n, d in zip(mix.names, mix.sources, strict=True)},
    }


def mixture_refusal(mix: Any, state: dict[str, Any], old_world: int) -> ConfigError:
    """The error for a checkpoint of another mixture than ``mix``, saying what differs."""
    mine = mixture_parts(mix, old_world)
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
