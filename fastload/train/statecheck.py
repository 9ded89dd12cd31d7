"""What a checkpoint of a ``ShardDataset`` or ``Mix`` must look like, and in words what differs when it
does not match the run restoring it (which of shards, seed, order settings, sources), instead of two
digests."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from fastload.core.index import ShardEntry
from fastload.errors import ConfigError


def check_shape(state: Any, *, owner: str, keys: Sequence[str]) -> None:
    """:class:`ConfigError` unless ``state`` is a dict holding ``keys`` (what ``owner.state_dict()``
    returns), saying what a state looks like."""
    if isinstance(state, Mapping):
        missing = [k for k in keys if k not in state]
        if not missing:
            return
        keys_found = ", ".join(map(repr, state)) or "none"
        got = f"a dict without {', '.join(map(repr, missing))} (its keys: {keys_found})"
    else:
        text = repr(state)
        got = f"{type(state).__name__} {text[:60] + '...' if len(text) > 60 else text}"
    hint = "" if "DataLoader" in owner else " (with fastload.DataLoader: loader.state_dict())"
    raise ConfigError(
        f"{owner}.load_state_dict() takes what {owner}.state_dict() returned{hint}: a dict with "
        f"{', '.join(map(repr, keys))} and more (JSON-safe: torch.save or json.dump keep it); got {got}"
    )


def differences(saved: Mapping[str, Any], mine: Mapping[str, Any], labels: Mapping[str, str]) -> list[str]:
    """``labels[k]: checkpoint value -> this run's`` for each key of ``labels`` whose values differ (keys
    the checkpoint lacks are left out: older checkpoints recorded less)."""
    out = []
    for key, label in labels.items():
        if key in saved and saved[key] != mine.get(key):
            out.append(f"{label}: {saved[key]!r} in the checkpoint, {mine.get(key)!r} here")
    return out


def refusal(what: str, found: Sequence[str], *, unknown: str, fix: str) -> ConfigError:
    """The error refusing a checkpoint whose ``what`` differs: ``found`` (say what differs), else
    ``unknown`` (the candidates, for a checkpoint that recorded too little to tell)."""
    detail = (
        "; ".join(found) if found else f"one of {unknown} (this checkpoint records too little to say which)"
    )
    return ConfigError(f"cannot resume: {what} differs from this run's: {detail}. {fix}")


def order_parts(
    shards: Sequence[ShardEntry], counts: Sequence[int], *, shuffle_buffer: int, even: str
) -> dict[str, Any]:
    """What decides a ``ShardDataset``'s order besides seed and world size, as its checkpoint records it
    (so that a refused one can say what differs): the shards (how many; a digest of their names, sample
    counts read and checksums) and the order settings."""
    digest = hashlib.sha256()
    for shard, count in zip(shards, counts, strict=True):
        digest.update(f"{shard.name}\0{count}\0{shard.checksum}\n".encode())
    layout = digest.hexdigest()[:16]
    return {"shards": len(shards), "layout": layout, "shuffle_buffer": shuffle_buffer, "even": even}


def order_refusal(state: Mapping[str, Any], mine: Mapping[str, Any]) -> ConfigError:
    """The error for a ``ShardDataset`` checkpoint ``state`` whose sample order is not this run's
    (``mine``: :func:`order_parts` and ``samples``), saying what differs."""
    found = differences(state, mine, {"samples": "samples", "shards": "shards"})
    if state.get("layout", mine["layout"]) != mine["layout"] and not found:
        found.append("the shards' names, sample counts or checksums")
    if found:
        found[-1] += " (the dataset was re-packed or changed since the checkpoint, or is another one)"
    found += differences(state, mine, {"shuffle_buffer": "shuffle_buffer", "even": "even"})
    return refusal(
        "the sample order",
        found,
        unknown="the shards (re-packed or changed?), shuffle_buffer or even",
        fix="Resume with the dataset and order settings the checkpoint was taken with, or start the epoch "
        "afresh (set_epoch without load_state_dict)",
    )


def version_refusal(
    state: Mapping[str, Any], versions: Sequence[Any], *, pinned: int | None, root: str
) -> ConfigError:
    """The error for a checkpoint ``state`` taken over a number of shards that no version of the dataset
    (``versions``: :class:`~fastload.core.versions.Version` s) has: a newer version than the one read (a
    pin, or the dataset went back), or a dataset replaced rather than appended to since."""
    shards, total = state.get("shards"), versions[-1].shards
    saved = state.get("version")
    label = f"version {saved} ({shards} shards)" if saved is not None else f"{shards} shards"
    pin = f", pinned by version={pinned}" if pinned else ""
    here = f"version {versions[-1].version} ({total} shards{pin})"
    if isinstance(shards, int) and shards > total:
        return ConfigError(
            f"cannot resume: the checkpoint read {label} of {root}, which this dataset, at {here}, does not "
            "have yet; open the checkpoint's version or a newer one (leave version= out for the newest), or "
            "start the epoch afresh (set_epoch without load_state_dict)"
        )
    listed = ", ".join(f"{v.version}: {v.shards}" for v in versions)
    return ConfigError(
        f"cannot resume: the checkpoint read {label} of {root}, and no version of this dataset is that one "
        f"(its versions, by shard count: {listed}): the dataset was replaced or re-packed since, not "
        "appended to. Resume with the dataset the checkpoint was taken over, or start the epoch afresh "
        "(set_epoch without load_state_dict)"
    )


def source_change(name: str, then: Any, now: int, grown: list[str]) -> str:
    """What differs in a ``Mix`` source ``name`` whose order is not the checkpoint's: it grew by an append
    since (the checkpoint read its version ``then``, this run opened ``now``: noted in ``grown``), or its
    shards or order settings changed."""
    if isinstance(then, int) and then < now:
        grown.append(f"{name}: version={then}")
        return (
            f"source {name!r}: the checkpoint read its version {then}, this run opened version {now} (it "
            "grew by an append since)"
        )
    return (
        f"source {name!r}: its sample order (its shards, re-packed or changed?, or its seed, shuffle_buffer "
        "or even)"
    )


def grown_fix(grown: list[str]) -> str:
    """The fix for ``Mix`` sources that grew since the checkpoint (:func:`source_change`), or ""."""
    if not grown:
        return ""
    return (
        f" (a Mix resumes over the versions its checkpoint read: open {', '.join(grown)} to finish this "
        "epoch, then without version= for the newest)"
    )
