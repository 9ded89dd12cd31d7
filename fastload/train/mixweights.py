"""A ``fastload.Mix``'s weights as given (by name or in order) made into one number per source, and, with
``weigh_by="tokens"``, shares of tokens made into shares of samples by each source's mean tokens per
document (from its ``index.json``, written by ``fastload pack-tokens``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastload.errors import ConfigError

Weights = Mapping[str, float] | Sequence[float]


def sample_weights(
    weights: Weights | None, names: Sequence[str], per_sample: Sequence[float] | None = None
) -> tuple[float, ...]:
    """One weight per source of ``names`` (default equal); ``per_sample``: each source's mean tokens per
    sample, when ``weights`` are shares of tokens."""
    values = _given(weights, names)
    if per_sample is None:
        return values
    values = tuple(w / m for w, m in zip(values, per_sample, strict=True))  # tokens -> samples
    return tuple(w / sum(values) for w in values)


def _given(weights: Weights | None, names: Sequence[str]) -> tuple[float, ...]:
    if weights is None:
        return (1.0,) * len(names)
    if isinstance(weights, Mapping):
        unknown = set(weights) - set(names)
        if unknown or len(weights) != len(names):
            raise ConfigError(f"weights name {sorted(weights)}; the sources are {list(names)}")
        values = tuple(float(weights[n]) for n in names)
    else:
        values = tuple(float(w) for w in weights)
    if len(values) != len(names) or any(not w >= 0 for w in values) or not any(values):
        raise ConfigError(f"weights {values} need one number >= 0 per source, not all 0")
    return values


def tokens_per_sample(sources: Mapping[str, Any]) -> tuple[float, ...]:
    """Each source's (a ``ShardDataset``'s) mean tokens per document, from its index."""
    means = []
    for name, d in sources.items():
        opts = d.index.options
        tokens, documents = opts.get("tokens"), opts.get("documents")
        if opts.get("kind") != "tokens" or not tokens or not documents:
            raise ConfigError(
                f"weigh_by='tokens': source {name!r} ({d.root}) is not a token dataset with tokens in it "
                "(write it with fastload pack-tokens), or weigh by samples"
            )
        means.append(int(tokens) / int(documents))
    return tuple(means)


__all__ = ["Weights", "sample_weights", "tokens_per_sample"]
