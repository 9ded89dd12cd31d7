"""Planning a worker's reads: its sample references, in order, grouped into read tasks.

A task is one read of one shard: a run of consecutive samples of a tar (or TFRecord) shard, read as one byte
range from the index offsets and capped at ``max_task_bytes`` so prefetch stays fine-grained; or the rows of
a Parquet shard wanted in a row, read by row group. Tasks keep the order of the references exactly, so the
samples they return, concatenated, are the references' samples in order.

A task never spans two shards, so the references can be planned one run of a shard at a time
(:func:`iter_reads`), each when its shard's per-sample columns are at hand (index v2 fetches a shard's
sample table only when the reader reaches it): the tasks are the same as :func:`plan_reads` gives. A run of
a shard read by row groups whose whole file fits in one task is one task whatever its row groups, so it is
planned without its per-sample columns (``whole`` in :func:`iter_reads`): its reader fetches the table, not
the planner.

A sample shuffle scatters a shard's references over the order, so runs of a shard are short and each
would read (and decode) its row groups again. With ``hold_bytes`` (:class:`GroupReads`), a shard read by row
groups whose references are not one run in order is read one row group at a time, each read serving every
later reference to that row group (soonest first) while the samples read ahead of their turn stay within
``hold_bytes``: a task then says which references it serves (``serves``), and the caller hands its samples
on in reference order.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from fastload.core.index import ShardEntry


@dataclass(frozen=True)
class ReadTask:
    """Read ``positions`` (index positions, in delivery order) of shard number ``shard``; ~``nbytes``.
    ``serves``: the references (indexes into the planned list, ascending) the samples are for, one per
    position; None: the references following those of the tasks before, in order."""

    shard: int
    positions: tuple[int, ...]
    nbytes: int
    serves: tuple[int, ...] | None = None


def _row_group_starts(entry: ShardEntry) -> list[int]:
    starts = [0]
    for rg in entry.row_groups:
        starts.append(starts[-1] + rg[2])
    return starts


def plan_reads(
    refs: Sequence[tuple[int, int]], shards: Sequence[ShardEntry], *, max_task_bytes: int
) -> list[ReadTask]:
    """Read tasks covering ``refs`` (``(shard, position)`` pairs) in order.

    With byte offsets (tar), a task is a run of ascending consecutive positions of one shard whose byte
    range stays within ``max_task_bytes`` (a single larger sample gets a task of its own). Without offsets
    (Parquet), a task is a maximal group of consecutive references to one shard.
    """
    return list(iter_reads(refs, shards.__getitem__, max_task_bytes=max_task_bytes))


def shard_runs(refs: Sequence[tuple[int, int]]) -> Iterator[tuple[int, int, int]]:
    """``(shard, i, j)`` for each maximal run ``refs[i:j]`` of references to one shard, in order."""
    n = len(refs)
    if not n:
        return
    shards = np.fromiter(map(itemgetter(0), refs), dtype=np.int64, count=n)  # (no Python loop per ref)
    starts = [0, *(np.flatnonzero(shards[1:] != shards[:-1]) + 1).tolist(), n]
    for i, j in itertools.pairwise(starts):
        yield int(shards[i]), i, j


def iter_reads(
    refs: Sequence[tuple[int, int]],
    entry_of: Callable[[int], ShardEntry],
    *,
    max_task_bytes: int | Callable[[], int],
    ahead: Callable[[int], None] | None = None,
    depth: int = 1,
    whole: Callable[[int], int | None] | None = None,
    hold_bytes: int = 0,
) -> Iterator[ReadTask]:
    """The tasks of :func:`plan_reads`, planned lazily one run of a shard at a time: ``entry_of(shard)``
    (the shard's full entry, with its per-sample columns) is called when the run is reached, and
    ``ahead(shard)`` (if given) with the shards of the next ``depth`` runs, each once, before this run's
    tasks, so that a caller can start fetching those shards' columns while this run is read.

    ``whole(shard)``: the byte size of a shard read by row groups (no byte offsets), else None. A run of
    such a shard of at most ``max_task_bytes`` bytes is one task of that many bytes (the task
    :func:`plan_reads` gives, as its row groups cannot add up to more than the file), planned without
    ``entry_of`` and not announced to ``ahead``: nothing waits for its per-sample columns.

    ``hold_bytes`` > 0: a shard read by row groups whose references are not one run (or one run that is
    neither such a whole shard nor consecutive positions in order) is planned by :class:`GroupReads`
    instead: one task per row group read, serving later references too (``ReadTask.serves``).

    ``max_task_bytes`` may be a function, asked again for each task planned (a tuned size, see
    :mod:`fastload.core.autotune`): tasks are the same references in the same order whatever their size."""
    cap = max_task_bytes if callable(max_task_bytes) else _fixed(max_task_bytes)
    if cap() < 1 or depth < 1:
        raise ValueError(f"need max_task_bytes={cap()} >= 1 and depth={depth} >= 1")
    groups = GroupReads(refs, hold_bytes=hold_bytes) if hold_bytes > 0 else None

    def size_of(shard: int) -> int | None:
        size = whole(shard) if whole is not None else None
        return size if size is not None and size <= cap() else None

    def grouped(shard: int, i: int, stop: int) -> bool:
        if groups is None:
            return False
        return not (groups.alone(shard, i, stop) and (size_of(shard) is not None or groups.stretch(i, stop)))

    def announce(run: tuple[int, int, int]) -> None:
        if ahead is None:
            return
        if groups is not None and grouped(*run):
            if not groups.served(run[1], run[2]):
                ahead(run[0])
        elif size_of(run[0]) is None:
            ahead(run[0])

    pending = shard_runs(refs)
    window: deque[tuple[int, int, int]] = deque(itertools.islice(pending, depth + 1))
    for later in itertools.islice(window, 1, None):
        announce(later)
    while window:
        shard, i, stop = window.popleft()
        size = size_of(shard)
        if groups is not None and grouped(shard, i, stop):
            yield from groups.plan(shard, i, stop, entry_of, max(1, cap()))
        elif size is not None:
            yield ReadTask(shard, tuple(p for _, p in refs[i:stop]), size)
        else:
            yield from _plan_run(refs, i, stop, shard, entry_of(shard), cap)
        following = next(pending, None)
        if following is not None:
            window.append(following)
            announce(following)


class GroupReads:
    """Reads by row group for references that come back to a row group (a sample shuffle): pure state over
    one list of references, planned in order, one run of a shard at a time (:meth:`plan`).

    At a reference whose sample no earlier task read, its row group is read once, for it and for the later
    references to that row group not read yet, soonest first, as many as fit: the samples read ahead of
    their turn (each weighed as its row group's stored bytes / rows) stay within ``hold_bytes`` at every
    point of the order. Behind a streaming shuffle buffer of ``b`` samples that is about ``b`` + a row
    group's samples (what the buffer itself would hold), so with ``hold_bytes`` above that every row group
    is read once per pass."""

    def __init__(self, refs: Sequence[tuple[int, int]], *, hold_bytes: int) -> None:
        if hold_bytes < 1:
            raise ValueError(f"hold_bytes={hold_bytes} must be >= 1")
        n = len(refs)
        self.hold_bytes = hold_bytes
        self._refs = refs
        self._shards = np.fromiter(map(itemgetter(0), refs), dtype=np.int64, count=n)
        self._positions = np.fromiter(map(itemgetter(1), refs), dtype=np.int64, count=n)
        self._span = int(self._positions.max()) + 1 if n else 1
        keys = self._shards * self._span + self._positions
        self._order = np.argsort(keys, kind="stable")  # by shard and position, then reference
        self._keys = keys[self._order]
        self._counts = np.bincount(self._shards) if n else np.zeros(0, dtype=np.int64)
        self._done = bytearray(n)  # references some task reads (planned already)
        self._done_a = np.frombuffer(self._done, dtype=np.uint8)
        self._weight: dict[int, float] = {}  # references read ahead of their turn -> their estimated bytes
        self.held = 0.0  # their sum: at most hold_bytes
        self.peak = 0.0

    def alone(self, shard: int, i: int, stop: int) -> bool:
        """Whether references ``i..stop-1`` are all those to ``shard``."""
        return bool(self._counts[shard] == stop - i)

    def stretch(self, i: int, stop: int) -> bool:
        """Whether references ``i..stop-1`` are consecutive positions in ascending order."""
        p = self._positions[i:stop]
        return bool(len(p) == 0 or (p[-1] - p[0] == len(p) - 1 and (np.diff(p) == 1).all()))

    def served(self, i: int, stop: int) -> bool:
        """Whether every reference of ``i..stop-1`` is read by a task planned already."""
        return bool(self._done_a[i:stop].all())

    def plan(
        self, shard: int, i: int, stop: int, entry_of: Callable[[int], ShardEntry], max_task_bytes: int
    ) -> Iterator[ReadTask]:
        """The tasks for references ``i..stop-1`` (all to ``shard``) that no earlier task reads, in order;
        ``entry_of(shard)`` is called only if there is one."""
        starts: list[int] | None = None
        entry: ShardEntry | None = None
        done, weight = self._done, self._weight
        for t in range(i, stop):
            if done[t]:
                self.held -= weight.pop(t, 0.0)
                continue
            if entry is None:
                entry = entry_of(shard)
                if entry.offsets or not entry.row_groups:  # not read by row groups: the usual tasks
                    yield from _plan_run(self._refs, t, stop, shard, entry, _fixed(max_task_bytes))
                    self._done_a[t:stop] = 1
                    return
                starts = _row_group_starts(entry)
            assert starts is not None
            yield self._read(shard, t, entry, starts)

    def _read(self, shard: int, t: int, entry: ShardEntry, starts: list[int]) -> ReadTask:
        """The task reading reference ``t``'s row group, for ``t`` and later references as room allows."""
        p = int(self._positions[t])
        g = bisect.bisect_right(starts, p) - 1
        self._done[t] = 1
        if not 0 <= g < len(entry.row_groups):  # not in the shard: its reader says so
            return ReadTask(shard, (p,), 0, (t,))
        _, size, rows = entry.row_groups[g]
        base = shard * self._span
        hi = min(starts[g + 1], self._span)  # (no reference is past the span: keys stay in the shard's)
        a, b = np.searchsorted(self._keys, [base + starts[g], base + hi])
        later = self._order[a:b]
        later = np.sort(later[(later > t) & (self._done_a[later] == 0)])
        w = size / max(rows, 1)
        room = int((self.hold_bytes - self.held) // w) if w > 0 else len(later)
        take = later[: max(room, 0)]
        self._done_a[take] = 1
        for u in take.tolist():
            self._weight[u] = w
        self.held += w * len(take)
        self.peak = max(self.peak, self.held)
        serves = np.concatenate(([t], take))
        return ReadTask(shard, tuple(self._positions[serves].tolist()), size, tuple(serves.tolist()))


def _fixed(max_task_bytes: int) -> Callable[[], int]:
    return lambda: max_task_bytes


def _plan_run(
    refs: Sequence[tuple[int, int]],
    i: int,
    stop: int,
    shard: int,
    entry: ShardEntry,
    cap: Callable[[], int],
) -> Iterator[ReadTask]:
    """The tasks of ``refs[i:stop]``, all references to ``shard`` (see :func:`plan_reads`), each cut at
    ``cap()`` bytes as it is planned."""
    if entry.offsets:
        positions = list(map(itemgetter(1), refs[i:stop]))
        first = positions[0]
        if positions == list(range(first, first + len(positions))):  # one stretch (compared in C)
            yield from _plan_stretch(shard, first, first + len(positions), entry.sizes, cap)
            return
        while i < stop:
            max_task_bytes = cap()
            first = refs[i][1]
            end = first + 1
            nbytes = entry.sizes[first]
            j = i + 1
            while j < stop and refs[j][1] == end:
                size = entry.sizes[end]
                if nbytes + size > max_task_bytes:
                    break
                nbytes += size
                end += 1
                j += 1
            yield ReadTask(shard, tuple(range(first, end)), nbytes)
            i = j
        return
    starts = _row_group_starts(entry)
    while i < stop:
        max_task_bytes = cap()
        groups: set[int] = set()
        nbytes = 0
        j = i
        while j < stop:
            g = bisect.bisect_right(starts, refs[j][1]) - 1
            if g not in groups:
                size = entry.row_groups[g][1] if 0 <= g < len(entry.row_groups) else 0
                if groups and nbytes + size > max_task_bytes:
                    break
                groups.add(g)
                nbytes += size
            j += 1
        yield ReadTask(shard, tuple(p for _, p in refs[i:j]), nbytes)
        i = j


def _plan_stretch(
    shard: int, a: int, b: int, sizes: Sequence[int], cap: Callable[[], int]
) -> Iterator[ReadTask]:
    """:func:`_plan_run`'s tasks for positions ``a..b-1`` in order: each from a running total of sizes."""
    ends = list(itertools.accumulate(sizes[a:b]))
    k = 0
    while k < len(ends):
        base = ends[k - 1] if k else 0
        j = max(k + 1, bisect.bisect_right(ends, base + cap(), lo=k))
        yield ReadTask(shard, tuple(range(a + k, a + j)), ends[j - 1] - base)
        k = j


def runs(positions: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive ascending positions grouped as ``(first, last + 1)`` runs, in the given order."""
    n = len(positions)
    if (
        n
        and positions[-1] - positions[0] == n - 1
        and list(positions) == list(range(positions[0], n + positions[0]))
    ):
        return [(positions[0], positions[0] + n)]  # one run (the usual task): compared in C
    out: list[tuple[int, int]] = []
    for p in positions:
        if out and out[-1][1] == p:
            out[-1] = (out[-1][0], p + 1)
        else:
            out.append((p, p + 1))
    return out
