"""The state of one :class:`fastload.PackedSequences` pass and its checkpoint: the upstream's position,
the pieces held over, the planned blocks not yet handed out and how the pass ends; saved per rank, and
restored on the same ranks or dealt to another number of ranks (see :mod:`fastload.core.packranks`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fastload.core.packranks import deal, resumed_origins
from fastload.core.seqpack import Blocks, RoundPlan
from fastload.core.sharding import EpochLayout
from fastload.errors import ConfigError

STATE_VERSION = 1
EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class Round:
    """A materialised round and how far it was handed out: blocks ``next:stop`` are still to come."""

    plan: RoundPlan
    blocks: Blocks
    next: int = 0
    stop: int = -1

    def __post_init__(self) -> None:
        if self.stop < 0:
            self.stop = len(self.blocks)

    def pieces(self, first: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Blocks ``first:stop`` as ``(their real tokens, piece lengths, pieces per block)``."""
        rows = self.blocks.input_ids[first:stop]
        real = np.arange(rows.shape[1]) < self.blocks.fill[first:stop, None]
        ptr = self.plan.block_ptr
        return rows[real], self.plan.length[ptr[first] : ptr[stop]], np.diff(ptr)[first:stop]


@dataclass
class CrossWorld:
    """A pass resumed under another world size: the old ranks' orders are read from position ``base``
    (the fewest any old rank had read) and dealt to the new ranks; a document old rank ``r`` had already
    read (position below ``delivered[r]``) is left out (its tokens were handed out, or came in the state)."""

    old_world: int
    world: int
    rank: int
    base: int
    delivered: list[int]
    remaining: int

    def keep(self, docs: list[np.ndarray], seen: int) -> list[np.ndarray]:
        """The documents of ``docs`` (items ``seen, seen + 1, ...`` of this rank's resumed order) to pack."""
        k = np.arange(seen, seen + len(docs), dtype=np.int64)
        old, at, valid = resumed_origins(
            k, rank=self.rank, world=self.world, old_world=self.old_world, remaining=self.remaining
        )
        read = valid & (self.base + at < np.asarray(self.delivered, dtype=np.int64)[old])
        return [d for d, r in zip(docs, read.tolist(), strict=True) if not r]

    def state(self) -> dict[str, Any]:
        return vars(self).copy()


@dataclass
class Live:
    """Everything a checkpoint must hold at a point between two blocks: the upstream's position after the
    documents read, the pieces held over, the planned blocks not yet handed out (``rounds``), and how the
    pass ends (``exhausted``: the upstream ended; ``final``: equal steps settled, ``owed`` empty blocks
    follow the rounds)."""

    upstream: dict[str, Any]
    carry: list[np.ndarray] = field(default_factory=list)
    rounds: deque[Round] = field(default_factory=deque)
    exhausted: bool = False
    final: bool = False
    owed: int = 0
    handed: int = 0
    seen: int = 0
    resume: CrossWorld | None = None
    report: dict[str, Any] = field(default_factory=dict)
    consumed: int = 0  # upstream items read in this process's pass (not saved: the upstream's own state)

    def avail(self) -> int:
        return sum(r.stop - r.next for r in self.rounds)

    @property
    def done(self) -> bool:
        """Nothing more to read or plan: what is left is in ``rounds``."""
        return self.exhausted and not self.carry


def joined(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not parts:
        return EMPTY, EMPTY, EMPTY
    return tuple(np.concatenate([p[i] for p in parts]).astype(np.int64) for i in range(3))  # type: ignore[return-value]


class Upstream:
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
                if next(it, END) is END:
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


END = object()


def shard_dataset_of(source: Any) -> Any | None:
    """The :class:`~fastload.ShardDataset` that ``source`` reads in order (itself, or a
    ``fastload.DataLoader``'s), else None."""
    from fastload.train.dataset import ShardDataset
    from fastload.train.loader import DataLoader

    if isinstance(source, DataLoader):
        source = source.dataset
    return source if isinstance(source, ShardDataset) else None


def rank_world(source: Any) -> tuple[int, int]:
    """The rank and world size the upstream reads as (its own, else torch.distributed's, else 0 of 1)."""
    own = getattr(source, "rank_world", None) or getattr(getattr(source, "dataset", None), "rank_world", None)
    if callable(own):
        rank, world = own()
        return int(rank), int(world)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def save_state(packer: Any, live: Live) -> dict[str, Any]:
    """``packer``'s checkpoint at ``live`` (tensors and plain values: ``torch.load(weights_only=True)``)."""
    tokens, lengths, per_block = joined([r.pieces(r.next, r.stop) for r in live.rounds if r.next < r.stop])
    carry_lengths = np.asarray([c.size for c in live.carry], dtype=np.int64)
    carry_tokens = np.concatenate(live.carry).astype(np.int64) if live.carry else EMPTY
    rank, world = rank_world(packer.dataset)
    return {
        "version": STATE_VERSION,
        "config": packer._config(),
        "rank": rank,
        "world_size": world,
        "upstream": live.upstream,
        "carry_tokens": torch.from_numpy(carry_tokens.copy()),
        "carry_lengths": torch.from_numpy(carry_lengths),
        "pending_tokens": torch.from_numpy(tokens.astype(np.int64, copy=True)),
        "pending_lengths": torch.from_numpy(lengths.copy()),
        "pending_pieces": torch.from_numpy(per_block.copy()),
        "exhausted": live.exhausted,
        "final": live.final,
        "owed": live.owed,
        "handed": live.handed,
        "seen": live.seen,
        "resumed": None if live.resume is None else live.resume.state(),
        "report": dict(live.report),
        "stats": vars(packer.stats).copy(),
    }


def _check(packer: Any, state: Any) -> dict[str, Any]:
    version = state.get("version") if isinstance(state, dict) else None
    if version != STATE_VERSION:
        raise ConfigError(
            f"not a PackedSequences state (version {version!r}, expected {STATE_VERSION}); pass what "
            "PackedSequences.state_dict() returned (or a list of every rank's)"
        )
    mine = packer._config()
    for name, value in state["config"].items():
        if mine.get(name) != value:
            raise ConfigError(
                f"cannot resume: the checkpoint has {name}={value!r}, this PackedSequences has "
                f"{mine.get(name)!r}; build it with the same options"
            )
    return dict(state)


def load_state(packer: Any, state: dict[str, Any] | Sequence[dict[str, Any]]) -> Live:
    """The pass ``state`` (one rank's, or every old rank's) continues, with ``packer``'s upstream restored."""
    states = [state] if isinstance(state, dict) else list(state)
    if not states:
        raise ConfigError("load_state_dict got an empty list; pass state_dict(), or every rank's")
    states = [_check(packer, s) for s in states]
    rank, world = rank_world(packer.dataset)
    olds = {int(s.get("world_size") or world) for s in states}
    if len(olds) != 1:
        raise ConfigError(
            f"these states come from jobs of {sorted(olds)} ranks; pass one job's, every rank's"
        )
    old_world = olds.pop()
    if len(states) == 1 and old_world == world:
        return _own(packer, states[0])
    if len(states) == 1 and old_world > 1:
        raise ConfigError(
            f"cannot resume: this is rank {states[0].get('rank')}'s state of a {old_world}-rank job and this "
            f"job has {world} rank(s). Each old rank packed its own documents and held its own pieces, so "
            f"resuming under another world size needs every old rank's state: save each rank's "
            f"state_dict() (or gather them with torch.distributed.all_gather_object) and pass the list, "
            f"load_state_dict([state of rank 0, ..., state of rank {old_world - 1}])"
        )
    by_rank = {int(s.get("rank", 0)): s for s in states}
    if sorted(by_rank) != list(range(old_world)) or len(states) != old_world:
        raise ConfigError(
            f"need the state of every rank 0..{old_world - 1} of the {old_world}-rank job, got ranks "
            f"{sorted(int(s.get('rank', 0)) for s in states)}"
        )
    if old_world == world:
        return _own(packer, by_rank[rank])
    return _cross(packer, [by_rank[r] for r in range(old_world)], rank, world)


def _pieces(tokens: torch.Tensor, lengths: torch.Tensor) -> list[np.ndarray]:
    bounds = np.cumsum(lengths.numpy())
    return [c.copy() for c in np.split(tokens.numpy(), bounds[:-1])] if bounds.size else []


def _own(packer: Any, state: dict[str, Any]) -> Live:
    """This rank's own state, on as many ranks as it was taken."""
    packer._upstream.restore(state["upstream"])
    live = Live(dict(state["upstream"]), _pieces(state["carry_tokens"], state["carry_lengths"]))
    lengths = state["pending_lengths"]
    if lengths.numel():
        live.rounds.append(
            packer._round_of(
                state["pending_tokens"].numpy(), lengths.numpy(), state["pending_pieces"].numpy()
            )
        )
    live.exhausted, live.final = bool(state.get("exhausted", False)), bool(state.get("final", False))
    live.owed, live.handed, live.seen = (int(state.get(k) or 0) for k in ("owed", "handed", "seen"))
    resumed = state.get("resumed")
    if resumed is not None:
        live.resume = CrossWorld(**resumed)
    live.report = dict(state.get("report") or {})
    packer.stats = type(packer.stats)(**state["stats"])
    return live


def _cross(packer: Any, olds: list[dict[str, Any]], rank: int, world: int) -> Live:
    """Every old rank's state, dealt to rank ``rank`` of ``world`` (another world size)."""
    old_world = len(olds)
    ds = shard_dataset_of(packer.dataset)
    why = None
    if ds is None:
        name = type(packer.dataset).__name__
        why = f"its upstream is a {name}, not a ShardDataset (or fastload.DataLoader over one)"
    elif ds.even not in ("split", "drop", "pad"):
        why = f"the ShardDataset has even={ds.even!r}, whose ranks' orders differ in length"
    elif any(s.get("resumed") is not None for s in olds):
        why = (
            "the checkpoint already continues a pass resumed under another world size; finish it on that one"
        )
    elif any(s["upstream"].get("kind") != "stateful" for s in olds):
        why = "the checkpoint was written by an older fastload"
    if why or ds is None:
        raise ConfigError(
            f"cannot resume this {old_world}-rank PackedSequences checkpoint on {world} rank(s): {why}; "
            f"resume on {old_world} rank(s)"
        )
    if all(s.get("completed") for s in olds):  # every rank's pass had ended: the epoch starts again
        return _own(packer, olds[min(rank, old_world - 1)])
    # a rank whose pass had ended (without equal steps) read all its documents and holds no piece
    olds = [{**s, "exhausted": True} if s.get("completed") else s for s in olds]
    ups = [s["upstream"]["state"] for s in olds]
    epochs = {int(u["epoch"]) for u in ups}
    if len(epochs) != 1:
        raise ConfigError(
            f"the ranks' states are of different epochs {sorted(epochs)}; pass one checkpoint's"
        )
    epoch = epochs.pop()
    length = EpochLayout(ds._counts(), world_size=old_world, seed=ds.seed, epoch=epoch, even=ds.even).length(
        0
    )
    delivered = [
        length if s.get("exhausted") else int(u["delivered"]) for s, u in zip(olds, ups, strict=True)
    ]
    reading = [r for r in range(old_world) if not olds[r].get("exhausted")]
    live = Live(packer._upstream.idle())
    if reading:
        slowest = min(reading, key=lambda r: delivered[r])
        base = delivered[slowest]
        packer._upstream.restore(olds[slowest]["upstream"])
        live.upstream = dict(olds[slowest]["upstream"])
    else:
        base, live.exhausted = length, True
    pieces: list[np.ndarray] = []
    for s in olds:  # in stream order: the blocks not handed out, then the pieces held over
        pieces += _pieces(s["pending_tokens"], s["pending_lengths"])
        pieces += _pieces(s["carry_tokens"], s["carry_lengths"])
    live.carry = [pieces[i] for i in deal(len(pieces), rank=rank, world=world).tolist()]
    live.resume = CrossWorld(old_world, world, rank, base, delivered, old_world * (length - base))
    live.handed = max(int(s.get("handed") or 0) for s in olds)
    stats = olds[rank]["stats"] if rank < old_world else {}
    packer.stats = type(packer.stats)(**stats)
    return live


__all__ = [
    "END",
    "STATE_VERSION",
    "CrossWorld",
    "Live",
    "Round",
    "Upstream",
    "load_state",
    "save_state",
    "shard_dataset_of",
]
