"""``fastload.PackedSequences``: documents of token ids packed into fixed-length blocks, resumable.

The plan of every round (a look-ahead window of documents) comes from :mod:`fastload.core.seqpack`; this
module reads documents from the upstream, keeps the state needed for exact resume, and hands out blocks
as tensors. Batch blocks with :func:`fastload.train.collate.blocks`.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils.data

from fastload.core.packranks import check_even
from fastload.core.seqpack import (
    TOKEN_DTYPES,
    Blocks,
    RoundPlan,
    check_seq_len,
    check_split,
    materialize,
    plan_from_blocks,
    plan_round,
    segment_ids,
)
from fastload.errors import ConfigError
from fastload.train.packdocs import refuse_collated, token_ids
from fastload.train.packstate import END, Live, Round, Upstream, load_state, save_state
from fastload.train.packsync import data_group, synced


@dataclass
class PackStats:
    """What the packer did so far: documents read, tokens in blocks, padding, truncated tokens."""

    documents: int = 0
    blocks: int = 0
    tokens: int = 0
    padding: int = 0
    truncated: int = 0

    @property
    def waste(self) -> float:
        """Padding share of the blocks handed out (0.0 when none were)."""
        total = self.tokens + self.padding
        return self.padding / total if total else 0.0


class PackedSequences(torch.utils.data.IterableDataset[dict[str, Any]]):
    """Pack a stream of documents into blocks of exactly ``seq_len`` tokens.

    ``dataset`` yields documents: dicts (a :class:`~fastload.ShardDataset` of a ``fastload pack-tokens``
    dataset; the token field is ``field``, else ``input_ids``, else the one field ending in ``.u16`` or
    ``.i32``, decoded or raw bytes), 1-D integer tensors or arrays, or lists of ints; or lists of such
    documents (``fastload.DataLoader(..., collate_fn=list)`` batches). Each block is a dict:

    - ``input_ids``, ``position_ids``, ``labels``: ``int64`` tensors of ``seq_len``; positions restart at 0
      at every document; labels are ``ignore_index`` at padding and, with ``ignore_doc_starts``, at the
      first token of every document piece (so no token learns to predict an unrelated document's start);
    - ``cu_seqlens`` (``int32``, FlashAttention varlen convention: ``[0, l1, l1 + l2, ..., seq_len]``, the
      padding of a non-full block being its last segment, so no row of a varlen kernel's output is left
      undefined), ``max_seqlen`` (int) and ``num_tokens`` (int: real tokens; the rest is padding at the end);
    - with ``attention_mask=True``, a block-diagonal ``bool`` mask ``[seq_len, seq_len]`` (True where a
      token may attend: same document; not causal, the model adds that).

    Documents are packed over a look-ahead ``window`` of documents with best-fit decreasing (see
    :mod:`fastload.core.seqpack`); ``split="split"`` cuts documents longer than ``seq_len`` into full
    blocks plus a tail that is packed like any document, ``"truncate"`` keeps their first ``seq_len``
    tokens. With ``"split"`` every token appears exactly once, in order within its document. The output
    depends only on the input stream and the options.

    :meth:`state_dict` / :meth:`load_state_dict` resume mid-stream with the same blocks an uninterrupted
    run would give. The state holds the upstream's position (after the documents read so far) and the
    tokens read but not yet handed out (at most one window plus one block), so the upstream is never
    re-read. It describes iteration in *this* process: iterate this dataset in the training process
    (``torch.utils.data.DataLoader(packed, batch_size=B, collate_fn=fastload.train.collate.blocks)`` with the
    default ``num_workers=0``) and let the upstream use workers (``fastload.DataLoader``); packing costs
    little (iterated in DataLoader workers, :meth:`state_dict` raises). Memory: about ``window`` documents
    plus one round's blocks (3 x 8 bytes x window tokens).

    Data parallelism: under an initialised ``torch.distributed`` group every rank hands out the same number
    of blocks (``even``: ``"balance"`` moves surplus blocks between ranks at the end of a pass, ``"pad"``
    adds empty blocks, ``"drop"`` stops at the smallest count, ``"none"`` leaves counts uneven; see
    :mod:`fastload.core.packranks` and :meth:`epoch_report`). Each rank's state is its own; a job of another
    size resumes from the list of every old rank's state (:meth:`load_state_dict`).
    """

    def __init__(
        self,
        dataset: Iterable[Any],
        *,
        seq_len: int,
        window: int = 1000,
        split: str = "split",
        field: str | None = None,
        pad_id: int = 0,
        ignore_index: int = -100,
        ignore_doc_starts: bool = True,
        attention_mask: bool = False,
        even: str = "balance",
    ) -> None:
        super().__init__()
        try:
            check_seq_len(seq_len)
            check_split(split)
            check_even(even)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ConfigError(f"window={window!r} must be an integer >= 1 (documents looked at ahead)")
        self.dataset = dataset
        self.seq_len, self.window, self.split = int(seq_len), window, split
        self.field = field
        self.pad_id, self.ignore_index = int(pad_id), int(ignore_index)
        self.ignore_doc_starts, self.attention_mask = bool(ignore_doc_starts), bool(attention_mask)
        self.stats = PackStats()
        self._upstream = Upstream(dataset)
        self._live: Live | None = None
        self._restored: Live | None = None
        self._auto_field: str | None = None
        self.even = even
        self._report: dict[str, Any] = {}
        self._restored_pid = 0
        self._completed = False  # the last pass ran to its end
        # set by a DataLoader worker's copy when it iterates (shared: the training process sees it)
        self._in_workers = multiprocessing.get_context("spawn").RawValue(ctypes.c_int64, 0)

    def __repr__(self) -> str:
        return f"PackedSequences({self.dataset!r}, seq_len={self.seq_len}, window={self.window})"

    def _config(self) -> dict[str, Any]:
        return {
            "seq_len": self.seq_len,
            "window": self.window,
            "split": self.split,
            "pad_id": self.pad_id,
            "ignore_index": self.ignore_index,
            "ignore_doc_starts": self.ignore_doc_starts,
        }

    # -- documents ----------------------------------------------------------------------------------------

    def _documents(self, item: Any) -> list[np.ndarray]:
        if isinstance(item, (list, tuple)) and item and not isinstance(item[0], (int, np.integer)):
            return [self._document(x) for x in item]
        return [self._document(item)]

    def _token_field(self, sample: dict[str, Any]) -> str:
        if self.field is not None:
            return self.field
        if "input_ids" in sample:
            return "input_ids"
        if self._auto_field is not None and self._auto_field in sample:
            return self._auto_field
        found = [k for k in sample if k.rsplit(".", 1)[-1] in TOKEN_DTYPES]
        if len(found) != 1:
            raise ConfigError(
                f"sample {sample.get('__key__')!r} has fields {sorted(sample)}: cannot tell which holds "
                "the token ids; pass field=NAME"
            )
        self._auto_field = found[0]
        return found[0]

    def _document(self, doc: Any) -> np.ndarray:
        where, name = "a document", None
        if isinstance(doc, dict):
            refuse_collated(doc)
            name = self._token_field(doc)
            where = f"sample {doc.get('__key__')!r}"
            if name not in doc:
                raise ConfigError(f"{where} has no field {name!r} (it has {sorted(doc)}); pass field=NAME")
            doc = doc[name]
        return token_ids(doc, name, where)

    # -- iteration ----------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from fastload.train.dataset import ShardDataset

        in_worker = torch.utils.data.get_worker_info() is not None
        splits = isinstance(self.dataset, ShardDataset)  # it deals itself to workers
        if (
            in_worker
            and not splits
            and (self._upstream.kind == "stateful" or isinstance(self.dataset, Sequence))
        ):
            raise ConfigError(
                f"PackedSequences over a {type(self.dataset).__name__} in DataLoader workers would hand "
                "every worker every document; iterate it in the training process (num_workers=0) and give "
                "the upstream the workers (fastload.DataLoader), or wrap a ShardDataset (it splits by worker)"
            )
        restored, self._restored = self._restored, None
        self._completed = False
        if in_worker:
            if restored is not None and self._restored_pid != os.getpid():
                raise ConfigError(
                    "this PackedSequences was restored (load_state_dict) in the training process and is now "
                    "iterated in DataLoader workers, which would each hand out the restored blocks; iterate "
                    "it in the training process (num_workers=0) and give the upstream the workers "
                    "(fastload.DataLoader)"
                )
            self._in_workers.value = 1
        else:
            self._in_workers.value = 0
        live = restored or Live(self._upstream.snapshot(0))
        it: Iterator[Any] = iter(()) if live.exhausted else self._upstream.start()
        self._live = live
        group = None if in_worker or self.even == "none" else data_group()
        if group is None:
            live.report.setdefault("equal_steps", None if self.even == "none" else False)
            yield from self._local(live, it)
        else:
            yield from synced(self, live, it, group)
        self._report = {**live.report, "blocks": live.handed}
        self._completed = True
        self._upstream.finished()
        self._live = None

    def _local(self, live: Live, it: Iterator[Any]) -> Iterator[dict[str, Any]]:
        while True:
            while not live.avail() and self._read_round(live, it):
                pass
            if live.avail():
                yield self._take(live)
            elif live.owed:
                yield self._empty(live)
            else:
                return

    def _round_of(self, tokens: np.ndarray, lengths: np.ndarray, per_block: np.ndarray) -> Round:
        pieces = np.split(tokens, np.cumsum(lengths)[:-1]) if lengths.size else []
        plan = plan_from_blocks(lengths, per_block)
        return Round(plan, self._materialize(pieces, plan))

    def _read_round(self, live: Live, it: Iterator[Any]) -> bool:
        """Read up to a window of documents and plan them (with the pieces held over) into a round of
        blocks; False when there is nothing more to read or plan."""
        if live.done:
            return False
        docs: list[np.ndarray] = []
        while not live.exhausted and len(docs) < self.window:
            item = next(it, END)
            if item is END:
                live.exhausted = True
                break
            live.consumed += 1
            new = self._documents(item)
            if live.resume is not None:
                new, live.seen = live.resume.keep(new, live.seen), live.seen + len(new)
            docs += new
        self.stats.documents += len(docs)
        inputs = live.carry + docs
        lengths = np.fromiter((d.size for d in inputs), dtype=np.int64, count=len(inputs))
        fresh = np.arange(len(inputs)) >= len(live.carry)
        plan = plan_round(lengths, seq_len=self.seq_len, split=self.split, fresh=fresh, final=live.exhausted)
        self.stats.truncated += plan.truncated
        live.carry = [
            inputs[i][s : s + n].copy()
            for i, s, n in zip(
                plan.held_item.tolist(), plan.held_start.tolist(), plan.held_length.tolist(), strict=True
            )
        ]
        if plan.blocks:
            live.rounds.append(Round(plan, self._materialize(inputs, plan)))
        live.upstream = self._upstream.snapshot(live.consumed)
        return True

    def _materialize(self, inputs: Sequence[np.ndarray], plan: RoundPlan) -> Blocks:
        return materialize(
            inputs,
            plan,
            seq_len=self.seq_len,
            pad_id=self.pad_id,
            ignore_index=self.ignore_index,
            ignore_doc_starts=self.ignore_doc_starts,
        )

    def _take(self, live: Live) -> dict[str, Any]:
        """The next block (counted before it is handed out: a checkpoint taken after excludes it)."""
        while live.rounds[0].next >= live.rounds[0].stop:
            live.rounds.popleft()
        current = live.rounds[0]
        blocks, b = current.blocks, current.next
        current.next = b + 1
        if current.next >= current.stop:
            live.rounds.popleft()
        live.handed += 1
        fill = int(blocks.fill[b])
        self.stats.blocks += 1
        self.stats.tokens += fill
        self.stats.padding += self.seq_len - fill
        cu = blocks.cu_seqlens[blocks.cu_ptr[b] : blocks.cu_ptr[b + 1]]
        out: dict[str, Any] = {
            "input_ids": torch.from_numpy(blocks.input_ids[b]),
            "position_ids": torch.from_numpy(blocks.position_ids[b]),
            "labels": torch.from_numpy(blocks.labels[b]),
            "cu_seqlens": torch.from_numpy(cu),
            "max_seqlen": int(blocks.max_seqlen[b]),
            "num_tokens": fill,
        }
        if self.attention_mask:
            seg = segment_ids(cu)
            out["attention_mask"] = torch.from_numpy(seg[:, None] == seg[None, :])
        return out

    def _empty(self, live: Live) -> dict[str, Any]:
        """A block of padding only (``num_tokens`` 0, every label ``ignore_index``): a step for a rank whose
        documents are used up (equal steps)."""
        live.owed -= 1
        live.handed += 1
        n = self.seq_len
        self.stats.blocks += 1
        self.stats.padding += n
        out: dict[str, Any] = {
            "input_ids": torch.full((n,), self.pad_id, dtype=torch.int64),
            "position_ids": torch.arange(n, dtype=torch.int64),
            "labels": torch.full((n,), self.ignore_index, dtype=torch.int64),
            "cu_seqlens": torch.tensor([0, n], dtype=torch.int32),
            "max_seqlen": n,
            "num_tokens": 0,
        }
        if self.attention_mask:
            out["attention_mask"] = torch.ones((n, n), dtype=torch.bool)
        return out

    def epoch_report(self) -> dict[str, Any]:
        """How the current (else the last) pass ends on this rank: ``even``, ``blocks`` (handed out so far in
        it, empty ones included), ``equal_steps`` (True: settled
        with every rank over the process group; False: no process group of 2+ ranks in this process, counts
        may differ; None: ``even="none"``), and once settled ``steps`` (blocks every rank hands out this
        pass), ``blocks_per_rank`` (blocks each rank's own documents made), ``empty_blocks``, ``blocks_in`` /
        ``blocks_out`` (moved between ranks), ``dropped_blocks`` / ``dropped_tokens``."""
        live = self._live or self._restored
        report = live.report if live is not None else self._report
        handed = live.handed if live is not None else self._report.get("blocks", 0)
        base = {"even": self.even, "equal_steps": None if self.even == "none" else False, "blocks": handed}
        return {**base, **report}

    # -- checkpointing ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands after the blocks handed out so far (tensors and plain values only, so
        ``torch.save`` / ``torch.load(weights_only=True)`` keep it): this rank's. Under data parallelism
        every rank saves its own; resuming under another world size takes all of them (see
        :meth:`load_state_dict`)."""
        if torch.utils.data.get_worker_info() is None and self._in_workers.value:
            raise ConfigError(
                "this PackedSequences was iterated in DataLoader workers: each worker packed its own copy, "
                "so the training process cannot say what was handed out. For a checkpoint, iterate it in "
                "the training process (torch DataLoader num_workers=0) over fastload.DataLoader(dataset, "
                "num_workers=N, collate_fn=list), which reads in workers and resumes exactly"
            )
        state = save_state(self, self._restored or self._live or Live(self._upstream.idle()))
        state["completed"] = self._live is None and self._restored is None and self._completed
        return state

    def load_state_dict(self, state: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """Continue from ``state``: the next iteration yields exactly the blocks not yet handed out.

        ``state`` is this rank's :meth:`state_dict`, or the list of every rank's (in any order) from a job
        with another number of ranks: their buffered pieces are dealt to the new ranks and the documents
        every old rank had not read are dealt as :class:`~fastload.ShardDataset` deals them, so every token
        comes exactly once over the new ranks (a ``ShardDataset`` upstream, or ``fastload.DataLoader`` over
        one, with ``even`` split, drop or pad)."""
        live = load_state(self, state)
        self._restored, self._restored_pid = live, os.getpid()
        self._live = None


__all__ = ["PackStats", "PackedSequences"]
