"""What a feeder of ``fastload.serve`` runs (the class of its Ray actors): batch ``i`` of a rank's epoch made
with fastload's own read, check, decode, ``map=`` and collate (:func:`make_batch`), and the form a batch
travels in (:func:`to_wire`, :func:`from_wire`).

Ray's object store hands numpy arrays to the trainer without a copy (the trainer's array is a view of the
store's shared memory) but pickles torch tensors (measured: ~180 ms for a 39 MB float batch against
~3 ms as numpy, ``docs/serve.md``); so a batch's CPU tensors travel as numpy arrays and come back as
tensors over the same memory (``torch.from_numpy``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from fastload.errors import ConfigError, FastloadError
from fastload.train import telemetry
from fastload.train.chunks import ChunkCollate, chunks_of
from fastload.train.dataset import ShardDataset
from fastload.train.position import Iteration
from fastload.train.reading import read_samples

Job = tuple[int, tuple[int, int] | None, int, int, int, int]  # epoch, resumed, span, start, total, size
# (batch in its wire form, samples, skipped, error, (telemetry stamp, the feeder's nonzero cells))
Made = tuple[Any, int, int, FastloadError | None, tuple[int, dict[int, int]]]


def make_batch(
    dataset: ShardDataset,
    job: Job,
    index: int,
    collate: Callable[[list[Any]], Any],
    tally: telemetry.Tally | None = None,
) -> tuple[Any, int, int, FastloadError | None]:
    """Batch ``index`` of ``job`` read from ``dataset`` (positions ``[start + index*size, ...)`` of the
    rank's order): ``(batch or None if every sample was skipped, samples, skipped, error)``. ``tally``:
    where the plan, fetch, parse, decode and ``map=`` stages are counted (collate: the dataset's block)."""
    epoch, resumed, span, start, total, size = job
    first = start + index * size
    stop = min(total, first + size)
    started = telemetry.clock_ns()
    refs = dataset.refs_of(first, stop, epoch=epoch, resumed=resumed, span=span)
    if tally is not None:
        tally.stage("plan", telemetry.clock_ns() - started, len(refs))
    progress = Iteration(epoch, first, resumed, 0, 1, None)
    samples = read_samples(
        refs,
        dataset.view,
        decoding=dataset.decoding,
        prefetch=dataset.prefetch,
        progress=progress,
        mark_skipped=True,
        tally=tally,
    )
    try:
        chunk = next(chunks_of(samples, len(refs), max(1, len(refs)), worker=None))
        batch, count, skipped, _, _, _ = ChunkCollate(collate, into=dataset._telemetry)(chunk)
        return batch, count, skipped, None
    except FastloadError as exc:  # a value: it reaches the trainer with its type and data
        return None, stop - first, 0, exc
    finally:
        samples.close()


class WireTensor:
    """A CPU tensor of a batch on its way to the trainer, as the numpy array over its memory."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, ...]:
        return (WireTensor, (self.array,))


def _as_numpy(tensor: torch.Tensor) -> np.ndarray[Any, Any] | None:
    """The numpy array over ``tensor``'s memory, or None where none is (another device, bfloat16, ...)."""
    if tensor.device.type != "cpu" or tensor.requires_grad or tensor.is_sparse:
        return None
    try:
        return tensor.resolve_conj().resolve_neg().numpy()
    except (TypeError, RuntimeError):  # a dtype numpy lacks: pickled as a tensor
        return None


def to_wire(value: Any) -> Any:
    """``value`` (a collated batch: dicts, lists and tuples of tensors and the rest) with each CPU tensor
    as a :class:`WireTensor`."""
    if isinstance(value, torch.Tensor):
        array = _as_numpy(value)
        return value if array is None else WireTensor(array)
    if isinstance(value, dict):
        return {k: to_wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_wire(v) for v in value]
    if type(value) is tuple:
        return tuple(to_wire(v) for v in value)
    return value


def from_wire(value: Any) -> Any:
    """:func:`to_wire` undone without copying: each :class:`WireTensor` a tensor over the received array
    (Ray hands it over read-only, as a view of its object store; the tensor keeps that memory pinned while
    it lives, and writing into it changes only this batch)."""
    if isinstance(value, WireTensor):
        with warnings.catch_warnings():  # torch warns that the array is read-only (see above)
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(value.array)
    if isinstance(value, dict):
        return {k: from_wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_wire(v) for v in value]
    if type(value) is tuple:
        return tuple(from_wire(v) for v in value)
    return value


class Feeder:
    """What a Ray actor runs: the dataset opened in its own process, batches made on request, each with
    this feeder's telemetry so far (its own counters: :meth:`fastload.ShardDataset.report`'s vector)."""

    def __init__(
        self, source: Any, options: dict[str, Any], collate: Callable[[list[Any]], Any], order: str
    ) -> None:
        self.dataset = ShardDataset(source, **options)
        self.collate = collate
        self.stamp = 0
        if self.dataset.order_fingerprint() != order:  # another dataset under the same name, here
            raise ConfigError(
                f"fastload.serve: the feeder on {os.uname().nodename} sees another dataset at {source!r} "
                f"(order fingerprint {self.dataset.order_fingerprint()}, the trainer's {order}); give "
                "every machine the same dataset"
            )

    def make(self, job: Job, index: int) -> Made:
        ds = self.dataset
        tally = telemetry.Tally(ds._telemetry, s3=True, cache=ds.cache()) if ds._telemetry.on else None
        batch, count, skipped, error = make_batch(ds, job, index, self.collate, tally)
        if tally is not None:
            tally.flush()
        self.stamp += 1
        cells = {i: v for i, v in enumerate(ds.telemetry_vector()) if v}
        return to_wire(batch), count, skipped, error, (self.stamp, cells)

    def pid(self) -> int:
        return os.getpid()


def check_source(source: Any) -> None:
    """Refuse a ``source`` a feeder cannot open itself (a dataset object, a Mix, PackedSequences), saying
    what to pass."""
    if isinstance(source, (str, os.PathLike)) or (
        isinstance(source, Sequence) and all(isinstance(s, (str, os.PathLike)) for s in source)
    ):
        return
    kind = type(source).__name__
    if kind in ("Mix", "PackedSequences"):
        raise ConfigError(
            f"fastload.serve does not serve a fastload.{kind} yet (docs/serve.md, Limits): read it with "
            "fastload.DataLoader, or serve each of its sources"
        )
    raise ConfigError(
        f"fastload.serve takes a dataset's location (a path, URL or list of them) and ShardDataset's "
        f"keywords, not a {kind}: each feeder opens the dataset itself (pass the location and keywords "
        "you would give fastload.ShardDataset)"
    )


def actor_options(ray: Any, cpus: float, resources: dict[str, float]) -> dict[str, Any]:
    """``ray.remote`` options of a feeder: ``cpus`` CPUs and the custom ``resources`` that place it (near
    the data: nodes started with ``--resources '{"data_eu": 8}'``); a resource the cluster has nowhere is
    refused, naming it (Ray would wait for it for ever)."""
    have = ray.cluster_resources()
    missing = sorted(k for k in resources if k not in have)
    if missing:
        known = sorted(k for k in have if k not in ("CPU", "GPU", "memory", "object_store_memory"))
        known = [k for k in known if not k.startswith("node:")]
        raise ConfigError(
            f"feeder_resources names {missing}, which no node of this Ray cluster has (custom resources "
            f"here: {known or 'none'}); start the nodes near the data with ray start --resources "
            f"'{{\"{missing[0]}\": N}}', or drop it"
        )
    return {"num_cpus": cpus, **({"resources": dict(resources)} if resources else {})}


__all__ = ["Feeder", "Job", "Made", "WireTensor", "from_wire", "make_batch", "to_wire"]
