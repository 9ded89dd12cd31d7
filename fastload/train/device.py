"""The device prefetcher of :class:`~fastload.train.feed.Loader`: each batch copied to the GPU on a side
CUDA stream (``non_blocking=True`` from pinned memory) while the current step runs; the step's stream waits
for that copy before it uses the batch. On CPU it is a pass-through."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from fastload.train.telemetry import Tally, clock_ns

_END = object()


def to_device(batch: Any, device: torch.device, *, non_blocking: bool = True) -> Any:
    """``batch`` with every tensor in it (nested in dicts, lists, tuples) moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return type(batch)({k: to_device(v, device, non_blocking=non_blocking) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device, non_blocking=non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, non_blocking=non_blocking) for v in batch)
    return batch


def _record_stream(batch: Any, stream: Any) -> None:
    """Tell the CUDA caching allocator that ``stream`` uses the batch's tensors (made on another stream)."""
    if isinstance(batch, torch.Tensor):
        if batch.is_cuda:
            batch.record_stream(stream)
    elif isinstance(batch, Mapping):
        for v in batch.values():
            _record_stream(v, stream)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            _record_stream(v, stream)


class DevicePrefetcher:
    """The items of ``iterable`` with their tensors on ``device``, one item ahead: the next item is fetched
    (and on CUDA copied on a side stream) before the current one is handed out, so the copy overlaps the
    step. Non-tensor parts pass through unchanged. ``after`` runs on each copied item on the same side
    stream (``decode="cuda"`` decodes there). The host item stays referenced until its device item has
    been handed out and the loop asks for the next, so a batch buffer (a shared-memory slot) is never
    reused while an asynchronous copy may still read it. ``copy`` replaces :func:`to_device` (tests)."""

    def __init__(
        self,
        iterable: Iterable[Any],
        device: str | torch.device,
        *,
        non_blocking: bool = True,
        after: Callable[[Any], Any] | None = None,
        copy: Callable[[Any, torch.device, bool], Any] | None = None,
    ):
        self.iterable = iterable
        self.device = torch.device(device)
        self.non_blocking = non_blocking
        self.after = after
        self.copy = copy

    def __iter__(self) -> Iterator[Any]:
        cuda = self.device.type == "cuda"
        stream = torch.cuda.Stream(device=self.device) if cuda else None  # type: ignore[no-untyped-call]
        source = iter(self.iterable)
        copy = self.copy or (lambda item, device, nb: to_device(item, device, non_blocking=nb))
        after = self.after

        def load() -> tuple[Any, Any]:
            try:
                item = next(source)
            except StopIteration:
                return _END, None
            if stream is None:
                moved = copy(item, self.device, False)
                return (moved if after is None else after(moved)), item
            with torch.cuda.stream(stream):
                moved = copy(item, self.device, self.non_blocking)
                return (moved if after is None else after(moved)), item

        upcoming, host = load()
        while upcoming is not _END:
            item, held = upcoming, host  # ``held``: the host batch, alive until this item was used
            if stream is not None:
                current_stream = torch.cuda.current_stream(self.device)
                current_stream.wait_stream(stream)  # the step waits for the copy, not the host
                _record_stream(item, current_stream)
            upcoming, host = load()  # the next copy starts before this item is used
            yield item
            del item, held


def timed_copy(tally: Tally) -> Callable[[Any, torch.device, bool], Any]:
    """:func:`to_device` that adds its (host) time to ``tally``'s ``h2d`` stage."""

    def copy(item: Any, device: torch.device, non_blocking: bool) -> Any:
        started = clock_ns()
        out = to_device(item, device, non_blocking=non_blocking)
        tally.stage("h2d", clock_ns() - started)
        return out

    return copy


__all__ = ["DevicePrefetcher", "timed_copy", "to_device"]
