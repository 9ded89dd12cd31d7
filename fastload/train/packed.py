"""``fastload.PackedSequences``: documents of token ids packed into fixed-length blocks, resumable.

The plan of every round (a look-ahead window of documents) comes from :mod:`fastload.core.seqpack`; this
module reads documents from the upstream, keeps the state needed for exact resume, and hands out blocks
as tensors. Batch blocks with :func:`fastload.train.collate.blocks`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.utils.data

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

STATE_VERSION = 1
_EMPTY = np.zeros(0, dtype=np.int64)


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


@dataclass
class _Round:
    """A materialised round and how far it was handed out."""

    plan: RoundPlan
    blocks: Blocks
    next: int = 0


@dataclass
class _Live:
    """Everything a checkpoint must hold at a point between two blocks."""

    upstream: dict[str, Any]
    carry: list[np.ndarray] = field(default_factory=list)
    round: _Round | None = None


class _Upstream:
    """The upstream's position: its own ``state_dict`` when it has one (a :class:`~fastload.ShardDataset`
    read in this process, ``fastload.DataLoader``, any ``Stateful``), else a count of items to skip when
    iterating it again (a list, or any iterable that yields the same items every time)."""

    def __init__(self, source: Iterable[Any]) -> None:
        self.source = source
        if callable(getattr(source, "state_dict", None)) and callable(
            getattr(source, "load_state_dict", None)
        ):
            self.kind = "stateful"
        else:
            self.kind = "replay"
        self.skip = 0

    def start(self) -> Iterator[Any]:
        it = iter(self.source)
        if self.kind == "replay" and self.skip:
            for n in range(self.skip):
                if next(it, _END) is _END:
                    raise ConfigError(
                        f"cannot resume: the upstream yielded only {n} items, the checkpoint skips "
                        f"{self.skip}; resume with the same data"
                    )
        return it

    def idle(self) -> dict[str, Any]:
        """The position while no iteration is under way."""
        return self.snapshot(0)

    def snapshot(self, consumed: int) -> dict[str, Any]:
        """The position after ``consumed`` items of the current iteration."""
        if self.kind == "stateful":
            return {"kind": self.kind, "state": self.source.state_dict()}  # type: ignore[attr-defined]
        return {"kind": self.kind, "consumed": self.skip + consumed}

    def restore(self, state: dict[str, Any]) -> None:
        kind = state.get("kind")
        if kind == "shard_dataset" and self.kind == "stateful":  # a checkpoint of fastload <= 0.1.0
            kind, state = "stateful", {"state": {"epoch": state["epoch"], "delivered": state["delivered"]}}
        if kind != self.kind:
            raise ConfigError(
                f"cannot resume: the checkpoint's upstream is {state.get('kind')!r}, this one is "
                f"{self.kind!r}; wrap the same kind of dataset or loader"
            )
        if self.kind == "stateful":
            self.source.load_state_dict(state["state"])  # type: ignore[attr-defined]
        else:
            self.skip = int(state["consumed"])

    def finished(self) -> None:
        """A complete pass: the next one starts from the beginning (a stateful upstream rewinds itself)."""
        self.skip = 0


_END = object()


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
    little. Memory: about ``window`` documents plus one round's blocks (3 x 8 bytes x window tokens).
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
    ) -> None:
        super().__init__()
        try:
            check_seq_len(seq_len)
            check_split(split)
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
        self._upstream = _Upstream(dataset)
        self._live: _Live | None = None
        self._restored: _Live | None = None
        self._auto_field: str | None = None

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
        where = "a document"
        name: str | None = None
        if isinstance(doc, dict):
            name = self._token_field(doc)
            where = f"sample {doc.get('__key__')!r}"
            if name not in doc:
                raise ConfigError(f"{where} has no field {name!r} (it has {sorted(doc)}); pass field=NAME")
            doc = doc[name]
        if isinstance(doc, (bytes, bytearray, memoryview)):
            ext = (name or "").rsplit(".", 1)[-1]
            if ext not in TOKEN_DTYPES:
                raise ConfigError(
                    f"{where}: field {name!r} holds bytes; token bytes need a field ending in "
                    f"{' or '.join('.' + e for e in TOKEN_DTYPES)}"
                )
            if len(doc) % TOKEN_DTYPES[ext].itemsize:
                raise ConfigError(f"{where}: {len(doc)} bytes in {name!r} is not a whole number of token ids")
            return np.frombuffer(doc, dtype=TOKEN_DTYPES[ext])
        arr = doc.detach().cpu().numpy() if isinstance(doc, torch.Tensor) else np.asarray(doc)
        if arr.ndim != 1 or (arr.dtype.kind not in "iu" and arr.size):
            raise ConfigError(
                f"{where} is not a 1-D sequence of integer token ids (got {arr.dtype} with shape "
                f"{arr.shape}); give token ids, e.g. from a `fastload pack-tokens` dataset"
            )
        return arr

    # -- iteration ----------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from fastload.train.dataset import ShardDataset

        splits = isinstance(self.dataset, ShardDataset)  # it deals itself to workers
        if (
            torch.utils.data.get_worker_info() is not None
            and not splits
            and (self._upstream.kind == "stateful" or isinstance(self.dataset, Sequence))
        ):
            raise ConfigError(
                f"PackedSequences over a {type(self.dataset).__name__} in DataLoader workers would hand "
                "every worker every document; iterate it in the training process (num_workers=0) and give "
                "the upstream the workers (fastload.DataLoader), or wrap a ShardDataset (it splits by worker)"
            )
        restored, self._restored = self._restored, None
        it = self._upstream.start()
        live = restored or _Live(self._upstream.snapshot(0))
        self._live = live
        if live.round is not None:
            yield from self._hand_out(live.round)
        consumed = 0
        exhausted = False
        while not exhausted or live.carry:
            docs: list[np.ndarray] = []
            while len(docs) < self.window:
                item = next(it, _END)
                if item is _END:
                    exhausted = True
                    break
                consumed += 1
                docs += self._documents(item)
            self.stats.documents += len(docs)
            inputs = live.carry + docs
            lengths = np.fromiter((d.size for d in inputs), dtype=np.int64, count=len(inputs))
            fresh = np.arange(len(inputs)) >= len(live.carry)
            plan = plan_round(lengths, seq_len=self.seq_len, split=self.split, fresh=fresh, final=exhausted)
            self.stats.truncated += plan.truncated
            carry = [
                inputs[i][s : s + n].copy()
                for i, s, n in zip(
                    plan.held_item.tolist(), plan.held_start.tolist(), plan.held_length.tolist(), strict=True
                )
            ]
            current = _Round(plan, self._materialize(inputs, plan))
            live.upstream, live.carry, live.round = self._upstream.snapshot(consumed), carry, current
            yield from self._hand_out(current)
        self._upstream.finished()
        self._live = None

    def _materialize(self, inputs: list[np.ndarray], plan: RoundPlan) -> Blocks:
        return materialize(
            inputs,
            plan,
            seq_len=self.seq_len,
            pad_id=self.pad_id,
            ignore_index=self.ignore_index,
            ignore_doc_starts=self.ignore_doc_starts,
        )

    def _hand_out(self, current: _Round) -> Iterator[dict[str, Any]]:
        blocks = current.blocks
        while current.next < len(blocks):
            b = current.next
            current.next = b + 1  # counted before the yield: a checkpoint taken after it excludes it
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
            yield out

    # -- checkpointing ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands after the blocks handed out so far (tensors and plain values only, so
        ``torch.save`` / ``torch.load(weights_only=True)`` keep it)."""
        live = self._restored or self._live or _Live(self._upstream.idle())
        pending_tokens, pending_lengths, pending_pieces = _EMPTY, _EMPTY, _EMPTY
        if live.round is not None and live.round.next < len(live.round.blocks):
            r, first = live.round, live.round.next
            rows = r.blocks.input_ids[first:]
            real = np.arange(self.seq_len) < r.blocks.fill[first:, None]
            pending_tokens = rows[real]
            pending_lengths = r.plan.length[r.plan.block_ptr[first] :]
            pending_pieces = np.diff(r.plan.block_ptr)[first:]
        carry_lengths = np.asarray([c.size for c in live.carry], dtype=np.int64)
        carry_tokens = np.concatenate(live.carry).astype(np.int64) if live.carry else _EMPTY
        return {
            "version": STATE_VERSION,
            "config": self._config(),
            "upstream": live.upstream,
            "carry_tokens": torch.from_numpy(carry_tokens.copy()),
            "carry_lengths": torch.from_numpy(carry_lengths),
            "pending_tokens": torch.from_numpy(pending_tokens.astype(np.int64, copy=True)),
            "pending_lengths": torch.from_numpy(pending_lengths.copy()),
            "pending_pieces": torch.from_numpy(pending_pieces.copy()),
            "stats": vars(self.stats).copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields exactly the blocks not yet handed out."""
        version = state.get("version") if isinstance(state, dict) else None
        if version != STATE_VERSION:
            raise ConfigError(
                f"not a PackedSequences state (version {version!r}, expected {STATE_VERSION}); pass what "
                "PackedSequences.state_dict() returned"
            )
        mine = self._config()
        for name, value in state["config"].items():
            if mine.get(name) != value:
                raise ConfigError(
                    f"cannot resume: the checkpoint has {name}={value!r}, this PackedSequences has "
                    f"{mine.get(name)!r}; build it with the same options"
                )
        self._upstream.restore(state["upstream"])
        carry_tokens = state["carry_tokens"].numpy()
        bounds = np.cumsum(state["carry_lengths"].numpy())
        carry = [c.copy() for c in np.split(carry_tokens, bounds[:-1])] if bounds.size else []
        live = _Live(dict(state["upstream"]), carry)
        lengths = state["pending_lengths"].numpy()
        if lengths.size:
            pieces = np.split(state["pending_tokens"].numpy(), np.cumsum(lengths)[:-1])
            plan = plan_from_blocks(lengths, state["pending_pieces"].numpy())
            live.round = _Round(plan, self._materialize(pieces, plan))
        self.stats = PackStats(**state["stats"])
        self._restored = live
        self._live = None


__all__ = ["PackStats", "PackedSequences"]
