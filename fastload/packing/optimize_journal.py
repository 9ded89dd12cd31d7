"""``fastload.optimize``'s resume journal: where in the inputs each published shard ends.

Kept in the destination's journal folder (``.fastload-pack/optimize/``, beside the shard writer's own
records, removed with them once ``index.json`` is written; an append's in its own,
``.fastload-pack/append-<tag>/optimize/``):

- ``state.json``: the fingerprints of the function and of the options that decide the bytes, and whether
  the inputs were a sequence (with its length); a resume compares them first (:meth:`OptimizeJournal.check`);
- ``NNNNNN.json`` per published shard: its :class:`Position` (the first input not wholly written, and how
  many of that input's samples were: a shard may end inside one input's fan-out), the running digest of
  every input before that one, the samples written so far, and the failures skipped within the shard's
  stretch of inputs.

:class:`ShardEnds` turns the stream of samples written (each with its input position) and the writer's
"shard k holds n samples" into those records; :func:`resume_point` finds, on resume, the longest run of
shards 0..k-1 recorded, and where their inputs end.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fastload.errors import PackError, ResumeMismatchError
from fastload.packing.dest import Destination
from fastload.packing.fanout import Failure
from fastload.packing.journal import STATE_DIR

FOLDER = f"{STATE_DIR}/optimize"


@dataclass(frozen=True, order=True)
class Position:
    """Inputs before ``input`` are written whole, and the first ``offset`` samples of input ``input``."""

    input: int = 0
    offset: int = 0


@dataclass(frozen=True)
class ShardEnd:
    """What the journal keeps of one published shard (see the module docstring)."""

    number: int
    end: Position
    digest: str  # running digest of the inputs before end.input
    samples: int  # samples in shards 0..number
    failures: list[Failure] = field(default_factory=list)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), ensure_ascii=False).encode()

    @staticmethod
    def from_json(raw: bytes) -> ShardEnd:
        d = json.loads(raw)
        return ShardEnd(
            number=int(d["number"]),
            end=Position(int(d["end"]["input"]), int(d["end"]["offset"])),
            digest=str(d["digest"]),
            samples=int(d["samples"]),
            failures=[Failure(**f) for f in d["failures"]],
        )


class OptimizeJournal:
    """The records of one optimize run in ``dest``, in ``folder`` (see the module docstring)."""

    def __init__(self, dest: Destination, folder: str = FOLDER, *, restart: str = "") -> None:
        self.dest = dest
        self.folder = folder
        self._state = f"{folder}/state.json"
        # how to start again, in messages (an append's: a new append, its leftovers named)
        self.restart = restart or "delete the destination and run again without resume"

    def exists(self) -> bool:
        return self.dest.read_bytes(self._state) is not None

    def state(self) -> dict[str, Any] | None:
        """What :meth:`start` recorded (None: nothing, or unreadable)."""
        try:
            return dict(json.loads(self.dest.read_bytes(self._state) or b""))
        except (ValueError, TypeError):
            return None

    def start(self, state: Mapping[str, Any]) -> None:
        self.dest.write_bytes(self._state, json.dumps(dict(state), sort_keys=True).encode())

    def check(self, state: Mapping[str, Any]) -> None:
        """Refuse a resume whose function, options or inputs differ from the recorded run's."""
        raw = self.dest.read_bytes(self._state)
        if raw is None:
            raise PackError(
                f"{self.dest.url} holds an interrupted pack that fastload.optimize did not write (or whose "
                "state is gone); resume it with the command that started it, or delete the folder"
            )
        try:
            old = json.loads(raw)
        except ValueError as exc:
            where = f"{self.dest.url}/{self._state}"
            raise PackError(f"the optimize state in {where} is unreadable ({exc})") from None
        url = self.dest.url
        if old.get("fn") != state.get("fn"):
            raise ResumeMismatchError(
                f"the function differs from the one of the interrupted optimize in {url} (its code, "
                "constants, defaults or closure changed), so the shards written cannot be continued to the "
                f"same bytes; restore the function, or {self.restart}",
                what="function",
                url=url,
            )
        if old.get("options") != state.get("options"):
            raise ResumeMismatchError(
                f"the options that decide the bytes (format, shard size, encoders, prefix...) differ from "
                f"the interrupted optimize's in {url}: it ran with {old.get('shown')}; run with those, or "
                f"{self.restart}",
                what="options",
                url=url,
            )
        if old.get("length") != state.get("length"):
            detail = f"{old.get('length')} inputs then, {state.get('length')} now"
            raise inputs_changed(url, detail, restart=self.restart)

    def record(self, end: ShardEnd) -> None:
        self.dest.write_bytes(f"{self.folder}/{end.number:06d}.json", end.to_json())

    def ends(self) -> dict[int, ShardEnd]:
        """Every complete record, by shard number (records are written atomically)."""
        out: dict[int, ShardEnd] = {}
        for name in self.dest.list(self.folder):
            if not name.rsplit("/", 1)[-1][:6].isdigit():
                continue
            try:
                end = ShardEnd.from_json(self.dest.read_bytes(name) or b"")
            except (ValueError, KeyError, TypeError):
                continue
            out[end.number] = end
        return out


def inputs_changed(url: str, detail: str, *, restart: str) -> ResumeMismatchError:
    return ResumeMismatchError(
        f"the inputs differ from those of the interrupted optimize in {url} ({detail}), so the shards "
        "written cannot be continued to the same bytes; pass the same inputs in the same order, or "
        + restart,
        what="inputs",
        url=url,
    )


def interrupted_append(dest: Destination, fingerprint: str) -> str | None:
    """The writer fingerprint (``{fingerprint}/append-{nonce}``) of the interrupted append into ``dest`` of
    the function and options whose fingerprint is ``fingerprint`` (its journal in
    ``.fastload-pack/append-<tag>/``); with none, that of the one interrupted optimize append of another
    function or options (so that the resume says what differs); None when there is none. Two are refused,
    naming their folders."""
    found: dict[str, str] = {}
    others: dict[str, str] = {}
    for name in dest.list(STATE_DIR):
        folder = name[len(STATE_DIR) + 1 :].split("/")[0]
        if not folder.startswith("append-") or "." in folder or folder in found:
            continue
        raw = dest.read_bytes(f"{STATE_DIR}/{folder}/state.json")
        try:
            writer = str(json.loads(raw or b"")["fingerprint"])
        except (ValueError, KeyError, TypeError):
            continue
        if writer.startswith(f"{fingerprint}/append-"):
            found[folder] = writer
        elif dest.read_bytes(f"{STATE_DIR}/{folder}/optimize/state.json") is not None:
            others[folder] = writer
    found = found or others
    if len(found) > 1:
        raise PackError(
            f"{dest.url} holds {len(found)} interrupted optimize appends "
            f"({', '.join(f'{STATE_DIR}/{f}' for f in sorted(found))}); resume finishes one: delete the "
            "folders of the others (and their unlisted shards, named *-<tag>.*) and resume again"
        )
    return next(iter(found.values()), None)


def resume_point(ends: Mapping[int, ShardEnd], kept: set[int]) -> list[ShardEnd]:
    """The records of shards 0..k-1 for the largest k where every one is both recorded in ``ends`` and
    ``kept`` whole by the shard writer: the run continues after the last of them."""
    out: list[ShardEnd] = []
    while len(out) in ends and len(out) in kept:
        out.append(ends[len(out)])
    return out


class ShardEnds:
    """Samples in, in the order written, each with its input position; the writer's "shard published with
    n samples" in, from any thread and in any order (a shard may even be reported before its samples are
    given: one kept from an interrupted run); a :class:`ShardEnd` per shard out, in shard order, once its
    samples are all in (:meth:`sample` and :meth:`published` return those they complete)."""

    def __init__(self, *, first_shard: int = 0, samples: int = 0, start: Position = Position()) -> None:
        self._lock = threading.Lock()
        self._after: collections.deque[Position] = collections.deque()  # position after each sample
        self._digests: dict[int, str] = {}  # input n -> running digest of inputs before n
        self._failures: list[Failure] = []  # skipped, not yet in a published shard's stretch
        self._counts: dict[int, int] = {}  # shard number -> samples, reported, not yet resolved
        self._next = first_shard
        self._samples = samples
        self._last = start

    def input_seen(self, number: int, digest_before: str) -> None:
        """The running digest of the inputs before input ``number``."""
        with self._lock:
            self._digests[number] = digest_before

    def sample(self, after: Position) -> list[ShardEnd]:
        """One sample given to the writer; ``after`` is where the inputs stand once it is written."""
        with self._lock:
            self._after.append(after)
            return self._resolve()

    def failed(self, failure: Failure) -> None:
        with self._lock:
            self._failures.append(failure)

    def published(self, number: int, samples: int) -> list[ShardEnd]:
        """Shard ``number`` holds ``samples`` samples."""
        with self._lock:
            self._counts[number] = samples
            return self._resolve()

    def _resolve(self) -> list[ShardEnd]:
        out = []
        while self._next in self._counts and len(self._after) >= self._counts[self._next]:
            n = self._counts.pop(self._next)
            for _ in range(n):
                self._last = self._after.popleft()
            self._samples += n
            end = self._last
            mine = [f for f in self._failures if f.number < end.input]
            self._failures = [f for f in self._failures if f.number >= end.input]
            out.append(ShardEnd(self._next, end, self._digests[end.input], self._samples, mine))
            for old in [k for k in self._digests if k < end.input]:
                del self._digests[old]
            self._next += 1
        return out


__all__ = [
    "OptimizeJournal",
    "Position",
    "ShardEnd",
    "ShardEnds",
    "inputs_changed",
    "interrupted_append",
    "resume_point",
]
