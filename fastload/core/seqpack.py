"""Sequence packing plans: documents of token ids into fixed-length blocks, and the arithmetic of a block.

A *round* packs the documents of one look-ahead window (plus pieces held over from the round before) into
blocks of ``seq_len`` tokens:

1. Cut: with ``split="split"`` a document longer than ``seq_len`` becomes full ``seq_len`` chunks from its
   start, each a block of its own, plus a tail; with ``"truncate"`` only its first ``seq_len`` tokens are
   kept (the rest are counted in :attr:`RoundPlan.truncated`). Empty documents give nothing.
2. Best-fit decreasing over the remaining pieces (all ``<= seq_len``): longest first (ties by arrival),
   each into the open block with the least room that still fits it (ties by the older block), else a new
   block.
3. Hold back: unless the round is final, the least-filled block, when it is not full and holds only
   pieces that were not held back before, is not emitted; its pieces join the next round. A piece is
   therefore delayed by at most one round, and the last partly filled block of a window usually finds
   company in the next.
4. Emit: the full chunks of split documents first (in arrival order), then the packed blocks ordered by
   their oldest document, pieces inside a block in arrival order. A split document's chunks therefore
   always precede its tail: its tokens reach the output in order.

Everything depends only on the lengths (and on which pieces are fresh), so the same stream always gives
the same blocks. The hot path works on lengths and offsets with numpy, never per token in Python.

Block layout (:func:`materialize`): a block's real tokens come first, padding last. ``position_ids`` restart
at 0 at every piece; ``cu_seqlens`` (FlashAttention's varlen convention) lists the cumulative segment ends
``[0, l1, l1 + l2, ..., seq_len]``, where the padding of a non-full block counts as one last segment so
that ``cu_seqlens[-1] == seq_len`` always (its positions restart at 0, its labels are ignored). Labels
equal the input ids except at padding and, with ``ignore_doc_starts``, at the first token of every piece,
so that no token is trained to predict the first token of an unrelated document.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

TOKEN_DTYPES: dict[str, np.dtype[Any]] = {"u16": np.dtype("<u2"), "i32": np.dtype("<i4")}
"""Token id columns by field suffix (``tokens.u16``, ``tokens.i32``): little-endian, as pack-tokens writes."""

SPLIT_POLICIES = ("split", "truncate")

IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class RoundPlan:
    """Blocks of one round as flat arrays, in emission order: block ``b`` holds pieces
    ``block_ptr[b]:block_ptr[b + 1]``; piece ``p`` is ``length[p]`` tokens of input ``item[p]`` from offset
    ``start[p]``. ``held_*`` describe the pieces held back for the next round, in arrival order."""

    item: IntArray
    start: IntArray
    length: IntArray
    block_ptr: IntArray
    held_item: IntArray
    held_start: IntArray
    held_length: IntArray
    truncated: int

    @property
    def blocks(self) -> int:
        return len(self.block_ptr) - 1

    @property
    def tokens(self) -> int:
        """Real tokens placed in this round's blocks."""
        return int(self.length.sum())


def _ints(values: Sequence[int] | IntArray) -> IntArray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def check_seq_len(seq_len: int) -> None:
    if not isinstance(seq_len, (int, np.integer)) or isinstance(seq_len, bool) or seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} must be a positive integer (e.g. 2048)")


def check_split(split: str) -> None:
    if split not in SPLIT_POLICIES:
        raise ValueError(f"split={split!r}; choose one of {', '.join(SPLIT_POLICIES)}")


def best_fit_decreasing(lengths: Sequence[int] | IntArray, *, capacity: int) -> tuple[IntArray, IntArray]:
    """Assign items (each ``1..capacity``) to bins: ``(bin of each item, fill of each bin)``.

    Longest item first (ties: the earlier item), each into the bin with the least room that still fits it
    (ties: the older bin), else into a new bin. Deterministic; ``O(n log n)`` plus list inserts.
    """
    lens = _ints(lengths)
    if lens.size and (int(lens.min()) < 1 or int(lens.max()) > capacity):
        raise ValueError(f"every length must be between 1 and capacity={capacity}")
    order = np.argsort(-lens, kind="stable").tolist()
    room: list[tuple[int, int]] = []  # (room left, bin), sorted
    fills: list[int] = []
    assign = np.empty(lens.size, dtype=np.int64)
    as_list = lens.tolist()
    for i in order:
        size = as_list[i]
        j = bisect.bisect_left(room, (size, -1))
        if j < len(room):
            left, b = room.pop(j)
            left -= size
        else:
            b = len(fills)
            fills.append(0)
            left = capacity - size
        fills[b] += size
        assign[i] = b
        if left > 0:
            bisect.insort(room, (left, b))
    return assign, np.asarray(fills, dtype=np.int64)


def plan_round(
    lengths: Sequence[int] | IntArray,
    *,
    seq_len: int,
    split: str = "split",
    fresh: Sequence[bool] | NDArray[np.bool_] | None = None,
    final: bool = False,
) -> RoundPlan:
    """Pack one round's inputs (their token counts, in arrival order) into blocks (see the module doc).

    ``fresh[i]`` False marks an input held back by the round before: it is never held back again.
    ``final`` emits everything (the end of the stream).
    """
    check_seq_len(seq_len)
    check_split(split)
    lens = _ints(lengths)
    if lens.size and int(lens.min()) < 0:
        raise ValueError("lengths must be >= 0")
    is_fresh = np.ones(lens.size, dtype=bool) if fresh is None else np.asarray(fresh, dtype=bool)
    if is_fresh.shape != lens.shape:
        raise ValueError(f"fresh has {is_fresh.size} entries for {lens.size} lengths")
    items = np.arange(lens.size, dtype=np.int64)
    full = lens // seq_len
    truncated = 0
    if split == "truncate":
        truncated = int(np.maximum(lens - seq_len, 0).sum())
        full = np.minimum(full, 1)
        tails = np.where(lens >= seq_len, 0, lens)
    else:
        tails = lens - full * seq_len
    # full chunks of long inputs: one block each, in arrival order
    chunk_item = np.repeat(items, full)
    chunk_start = _ranks(full) * seq_len
    # tails (and short inputs) are bin-packed
    has_tail = tails > 0
    t_item = items[has_tail]
    t_start = (full * seq_len)[has_tail]
    t_len = tails[has_tail]
    t_fresh = is_fresh[has_tail]
    assign, fills = best_fit_decreasing(t_len, capacity=seq_len)
    hold = np.zeros(fills.size, dtype=bool)
    if not final and fills.size:
        b = int(np.argmin(fills[::-1]))  # least filled; ties: the newest bin
        b = fills.size - 1 - b
        if fills[b] < seq_len and bool(t_fresh[assign == b].all()):
            hold[b] = True
    held = hold[assign]
    keep = ~held
    k_item, k_start, k_len, k_bin = t_item[keep], t_start[keep], t_len[keep], assign[keep]
    # bins (renumbered in order of their oldest item), pieces inside in arrival order
    oldest = np.full(fills.size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(oldest, k_bin, k_item)
    emitted = np.flatnonzero(~hold)
    rank = np.empty(fills.size, dtype=np.int64)
    rank[emitted[np.argsort(oldest[emitted], kind="stable")]] = np.arange(emitted.size)
    order = np.lexsort((k_start, k_item, rank[k_bin]))
    bin_sizes = np.bincount(rank[k_bin], minlength=emitted.size)
    block_ptr = np.concatenate(
        ([0], np.arange(1, chunk_item.size + 1), chunk_item.size + np.cumsum(bin_sizes))
    ).astype(np.int64)
    return RoundPlan(
        item=np.concatenate((chunk_item, k_item[order])),
        start=np.concatenate((chunk_start, k_start[order])),
        length=np.concatenate((np.full(chunk_item.size, seq_len, dtype=np.int64), k_len[order])),
        block_ptr=block_ptr,
        held_item=t_item[held],
        held_start=t_start[held],
        held_length=t_len[held],
        truncated=truncated,
    )


def _ranks(counts: IntArray) -> IntArray:
    """``[0, 1, ..., c0 - 1, 0, 1, ..., c1 - 1, ...]`` for ``counts = [c0, c1, ...]``."""
    total = int(counts.sum())
    firsts = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(firsts, counts)


def plan_from_blocks(
    piece_lengths: Sequence[int] | IntArray, pieces_per_block: Sequence[int] | IntArray
) -> RoundPlan:
    """The plan of blocks given directly (pieces laid out one after another), e.g. restored from a
    checkpoint: piece ``p`` is input ``p`` whole."""
    lens = _ints(piece_lengths)
    per_block = _ints(pieces_per_block)
    if int(per_block.sum()) != lens.size or (per_block.size and int(per_block.min()) < 1):
        raise ValueError("pieces_per_block must be >= 1 each and add up to the number of pieces")
    empty = np.zeros(0, dtype=np.int64)
    return RoundPlan(
        item=np.arange(lens.size, dtype=np.int64),
        start=np.zeros(lens.size, dtype=np.int64),
        length=lens,
        block_ptr=np.concatenate(([0], np.cumsum(per_block))).astype(np.int64),
        held_item=empty,
        held_start=empty,
        held_length=empty,
        truncated=0,
    )


@dataclass(frozen=True)
class Blocks:
    """A round's blocks as arrays: row ``b`` of the 2-D arrays is block ``b``. Block ``b``'s cu_seqlens are
    ``cu_seqlens[cu_ptr[b]:cu_ptr[b + 1]]``; ``fill[b]`` of its tokens are real, the rest padding."""

    input_ids: IntArray
    position_ids: IntArray
    labels: IntArray
    cu_seqlens: NDArray[np.int32]
    cu_ptr: IntArray
    max_seqlen: IntArray
    fill: IntArray

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def materialize(
    inputs: Sequence[NDArray[np.integer]],
    plan: RoundPlan,
    *,
    seq_len: int,
    pad_id: int = 0,
    ignore_index: int = -100,
    ignore_doc_starts: bool = True,
) -> Blocks:
    """Lay out a plan's blocks from the round's inputs (``inputs[i]`` holds input ``i``'s token ids).

    One slice copy per piece (not per token); fresh arrays per round, so blocks handed out earlier stay
    valid while later rounds are built.
    """
    check_seq_len(seq_len)
    n = plan.blocks
    per_block = np.diff(plan.block_ptr)
    first, last = plan.block_ptr[:-1], plan.block_ptr[1:] - 1
    cum = np.cumsum(plan.length) - plan.length
    within = cum - np.repeat(cum[first], per_block)  # each piece's offset inside its block
    fill = within[last] + plan.length[last]
    if n and int(fill.max()) > seq_len:
        raise ValueError(f"a block of the plan holds more than seq_len={seq_len} tokens")
    out = within + np.repeat(np.arange(n, dtype=np.int64) * seq_len, per_block)
    # each array written once (no fill before the copies, no mask): pieces, then the padded blocks' tails
    input_ids = np.empty((n, seq_len), dtype=np.int64)
    position_ids = np.empty((n, seq_len), dtype=np.int64)
    ids, pos = input_ids.reshape(-1), position_ids.reshape(-1)
    ramp = np.arange(seq_len, dtype=np.int64)
    for i, s, k, o in zip(
        plan.item.tolist(), plan.start.tolist(), plan.length.tolist(), out.tolist(), strict=True
    ):
        ids[o : o + k] = inputs[i][s : s + k]
        pos[o : o + k] = ramp[:k]
    padded = np.flatnonzero(fill < seq_len)
    for b, f in zip(padded.tolist(), fill[padded].tolist(), strict=True):
        input_ids[b, f:] = pad_id
        position_ids[b, f:] = ramp[: seq_len - f]
    labels = input_ids.copy()
    for b, f in zip(padded.tolist(), fill[padded].tolist(), strict=True):
        labels[b, f:] = ignore_index
    if ignore_doc_starts:
        labels.reshape(-1)[out] = ignore_index
    # cu_seqlens of block b: cu_seqlens[cu_ptr[b]:cu_ptr[b + 1]] = [0, piece ends..., seq_len if padded]
    pad = seq_len - fill
    has_pad = pad > 0
    cu_ptr = np.concatenate(([0], np.cumsum(per_block + has_pad + 1))).astype(np.int64)
    cu = np.zeros(int(cu_ptr[-1]), dtype=np.int32)
    cu[np.arange(plan.length.size) + np.repeat(cu_ptr[:-1] + 1 - first, per_block)] = within + plan.length
    cu[cu_ptr[1:][has_pad] - 1] = seq_len
    longest = np.maximum.reduceat(plan.length, first) if n else np.zeros(0, dtype=np.int64)
    return Blocks(
        input_ids=input_ids,
        position_ids=position_ids,
        labels=labels,
        cu_seqlens=cu,
        cu_ptr=cu_ptr,
        max_seqlen=np.maximum(longest, pad).astype(np.int64),
        fill=fill.astype(np.int64),
    )


def segment_ids(cu_seqlens: NDArray[np.integer]) -> NDArray[np.int32]:
    """Segment number of every token of one block, from its ``cu_seqlens`` (for block-diagonal masks)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    return np.repeat(np.arange(cu.size - 1, dtype=np.int32), np.diff(cu))
