"""Read plans: tasks cover a worker's references exactly, in order; tar tasks are consecutive runs within a
byte cap, Parquet tasks group references to one shard within a row-group byte cap."""

from __future__ import annotations

import bisect
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core.index import ShardEntry
from fastload.core.readplan import ReadTask, iter_reads, plan_reads, shard_runs

SETTINGS = settings(max_examples=100, deadline=None)


def tar_entry(n: int, sizes: list[int]) -> ShardEntry:
    offsets = [0, *itertools.accumulate(sizes)][:-1]
    return ShardEntry(
        f"t{n}.tar", sum(sizes), "00000000", [f"k{i}" for i in range(len(sizes))], offsets, sizes
    )


def parquet_entry(n: int, groups: list[tuple[int, int]]) -> ShardEntry:
    """``groups``: ``(bytes, rows)`` per row group."""
    rows = sum(r for _, r in groups)
    offsets = [4 + o for o in itertools.accumulate((b for b, _ in groups), initial=0)][:-1]  # after "PAR1"
    row_groups = [(o, b, r) for o, (b, r) in zip(offsets, groups, strict=True)]
    total = 8 + sum(b for b, _ in groups)
    return ShardEntry(
        f"p{n}.parquet", total, "00000000", [f"k{i}" for i in range(rows)], row_groups=row_groups
    )


@st.composite
def shards(draw: st.DrawFn) -> list[ShardEntry]:
    out: list[ShardEntry] = []
    for n in range(draw(st.integers(1, 5))):
        if draw(st.booleans()):
            sizes = draw(st.lists(st.integers(1, 5000), min_size=1, max_size=30))
            out.append(tar_entry(n, sizes))
        else:
            groups = draw(
                st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 8)), min_size=1, max_size=8).filter(
                    lambda gs: sum(r for _, r in gs) > 0
                )
            )
            out.append(parquet_entry(n, groups))
    return out


@st.composite
def plans(draw: st.DrawFn) -> tuple[list[ShardEntry], list[tuple[int, int]], int]:
    """Shards, references to them (runs, jumps, repeats, interleavings: what shuffles and pads produce) and
    a byte cap."""
    entries = draw(shards())
    refs: list[tuple[int, int]] = []
    for _ in range(draw(st.integers(0, 12))):
        s = draw(st.integers(0, len(entries) - 1))
        n = entries[s].samples
        first = draw(st.integers(0, n - 1))
        length = draw(st.integers(1, n - first))
        if draw(st.booleans()):  # a run, as an unshuffled order gives
            refs.extend((s, p) for p in range(first, first + length))
        else:  # scattered positions, as a shuffle buffer gives
            refs.extend((s, draw(st.integers(0, n - 1))) for _ in range(length))
    cap = draw(st.one_of(st.integers(1, 20), st.integers(1, 40_000)))
    return entries, refs, cap


def group_of(entry: ShardEntry, position: int) -> int:
    starts = [0, *itertools.accumulate(rg[2] for rg in entry.row_groups)]
    g = bisect.bisect_right(starts, position) - 1
    assert starts[g] <= position < starts[g + 1]
    return g


@SETTINGS
@given(plans())
def test_tasks_cover_the_references_in_order(
    plan: tuple[list[ShardEntry], list[tuple[int, int]], int],
) -> None:
    entries, refs, cap = plan
    tasks = plan_reads(refs, entries, max_task_bytes=cap)
    assert [(t.shard, p) for t in tasks for p in t.positions] == refs
    assert all(t.positions for t in tasks)


@SETTINGS
@given(plans())
def test_tar_tasks_are_capped_consecutive_runs(
    plan: tuple[list[ShardEntry], list[tuple[int, int]], int],
) -> None:
    entries, refs, cap = plan
    tasks = plan_reads(refs, entries, max_task_bytes=cap)
    at = 0
    for t in tasks:
        entry = entries[t.shard]
        at += len(t.positions)
        if not entry.offsets:
            continue
        first = t.positions[0]
        assert list(t.positions) == list(range(first, first + len(t.positions)))
        nbytes = sum(entry.sizes[p] for p in t.positions)
        # the byte range read is [offsets[first], offsets[last] + sizes[last]): the samples' sizes
        last = t.positions[-1]
        assert entry.offsets[last] + entry.sizes[last] - entry.offsets[first] == nbytes
        assert t.nbytes == nbytes
        assert nbytes <= cap or len(t.positions) == 1
        # maximal: the next reference continues the run only if it would overflow the cap
        if at < len(refs) and refs[at] == (t.shard, last + 1):
            assert nbytes + entry.sizes[last + 1] > cap


@SETTINGS
@given(plans())
def test_parquet_tasks_keep_order_within_row_group_cap(
    plan: tuple[list[ShardEntry], list[tuple[int, int]], int],
) -> None:
    entries, refs, cap = plan
    tasks = plan_reads(refs, entries, max_task_bytes=cap)
    at = 0
    for t in tasks:
        entry = entries[t.shard]
        mine = refs[at : at + len(t.positions)]
        at += len(t.positions)
        if entry.offsets:
            continue
        assert [p for _, p in mine] == list(t.positions)  # reference order, not sorted
        groups = {group_of(entry, p) for p in t.positions}
        nbytes = sum(entry.row_groups[g][1] for g in groups)
        assert t.nbytes == nbytes
        # a row group is the unit of reading: only a task touching a single group may exceed the cap
        assert nbytes <= cap or len(groups) == 1
        if at < len(refs) and refs[at][0] == t.shard:  # maximal: the next reference would overflow
            g = group_of(entry, refs[at][1])
            assert g not in groups and nbytes + entry.row_groups[g][1] > cap


def test_a_sample_larger_than_the_cap_gets_a_task_of_its_own() -> None:
    entry = tar_entry(0, [10, 500, 10, 10])
    tasks = plan_reads([(0, p) for p in range(4)], [entry], max_task_bytes=100)
    assert tasks == [ReadTask(0, (0,), 10), ReadTask(0, (1,), 500), ReadTask(0, (2, 3), 20)]


def test_runs_break_at_gaps_repeats_and_shard_changes() -> None:
    a, b = tar_entry(0, [1] * 6), tar_entry(1, [1] * 6)
    refs = [(0, 0), (0, 1), (0, 3), (0, 3), (1, 4), (1, 5), (0, 5)]
    tasks = plan_reads(refs, [a, b], max_task_bytes=1 << 20)
    assert [(t.shard, t.positions) for t in tasks] == [
        (0, (0, 1)),
        (0, (3,)),
        (0, (3,)),
        (1, (4, 5)),
        (0, (5,)),
    ]


def test_parquet_references_in_one_row_group_share_a_task() -> None:
    entry = parquet_entry(0, [(1000, 4), (1000, 4)])
    tasks = plan_reads([(0, 3), (0, 1), (0, 2), (0, 6)], [entry], max_task_bytes=1500)
    assert [(t.positions, t.nbytes) for t in tasks] == [((3, 1, 2), 1000), ((6,), 1000)]


def test_no_references_no_tasks() -> None:
    assert plan_reads([], [tar_entry(0, [5])], max_task_bytes=1) == []


@pytest.mark.parametrize("cap", [0, -1, -(1 << 40)])
def test_max_task_bytes_below_one_raises(cap: int) -> None:
    with pytest.raises(ValueError, match="max_task_bytes"):
        plan_reads([(0, 0)], [tar_entry(0, [5])], max_task_bytes=cap)


@SETTINGS
@given(plans())
def test_planned_lazily_the_tasks_are_the_same_and_each_shard_is_looked_up_when_reached(
    plan: tuple[list[ShardEntry], list[tuple[int, int]], int],
) -> None:
    entries, refs, cap = plan
    looked_up: list[int] = []
    announced: list[int] = []

    def entry_of(shard: int) -> ShardEntry:
        looked_up.append(shard)
        return entries[shard]

    depth = 1 + len(refs) % 4
    lazy = iter_reads(refs, entry_of, max_task_bytes=cap, ahead=announced.append, depth=depth)
    got: list[ReadTask] = []
    runs = [s for s, _, _ in shard_runs(refs)]
    for task in lazy:
        assert looked_up[-1] == task.shard  # looked up no earlier than its first task is handed out
        # announced: the shards of the next `depth` runs after the one being read, no further
        assert announced == runs[1 : len(looked_up) + depth]
        got.append(task)
    assert got == plan_reads(refs, entries, max_task_bytes=cap)
    assert looked_up == runs  # once per run of a shard, in order
    assert announced == runs[1:]  # each later run's shard, once, `depth` runs ahead


def test_shard_runs_split_references_where_the_shard_changes() -> None:
    refs = [(0, 1), (0, 2), (1, 0), (0, 3), (0, 0), (2, 5)]
    assert list(shard_runs(refs)) == [(0, 0, 2), (1, 2, 3), (0, 3, 5), (2, 5, 6)]
    assert list(shard_runs([])) == []


@settings(max_examples=50, deadline=None)
@given(plans())
def test_shards_planned_whole_are_one_task_a_run_without_their_columns(
    plan: tuple[list[ShardEntry], list[tuple[int, int]], int],
) -> None:
    """``whole``: a run of a row-group shard that fits in one task is that task, as plan_reads makes it
    (the positions, in reference order), planned without looking the shard up or announcing it ahead;
    other shards are planned as before."""
    entries, refs, cap = plan
    looked_up: list[int] = []
    announced: list[int] = []

    def entry_of(shard: int) -> ShardEntry:
        looked_up.append(shard)
        return entries[shard]

    def whole(shard: int) -> int | None:
        return None if entries[shard].offsets else entries[shard].bytes

    fits = {s for s, e in enumerate(entries) if not e.offsets and e.bytes <= cap}
    got = list(iter_reads(refs, entry_of, max_task_bytes=cap, ahead=announced.append, whole=whole))
    want = plan_reads(refs, entries, max_task_bytes=cap)
    assert [(t.shard, t.positions) for t in got] == [(t.shard, t.positions) for t in want]
    assert [t.nbytes for t in got] == [entries[t.shard].bytes if t.shard in fits else t.nbytes for t in want]
    runs = [s for s, _, _ in shard_runs(refs)]
    assert looked_up == [s for s in runs if s not in fits]
    assert announced == [s for s in runs[1:] if s not in fits]


def _hand_on(tasks: list[ReadTask], n: int) -> tuple[list[tuple[int, int]], list[int]]:
    """What a reader hands on from ``tasks`` (``serves`` honoured, as train.reading does), and after each
    task how many references were read ahead of their turn."""
    got: dict[int, tuple[int, int]] = {}
    handed, ahead = 0, []
    for task in tasks:
        serves = task.serves if task.serves is not None else range(handed, handed + len(task.positions))
        assert list(serves) == sorted(serves) and serves[0] == handed, "a task starts at the next reference"
        for u, p in zip(serves, task.positions, strict=True):
            assert u not in got, f"reference {u} read twice"
            got[u] = (task.shard, p)
        while handed in got:
            handed += 1
        ahead.append(len(got) - handed)
    assert handed == n == len(got)
    return [got[u] for u in range(n)], ahead


@SETTINGS
@given(plans(), st.integers(1, 60_000), st.booleans())
def test_held_reads_hand_every_reference_on_once_in_order(
    plan: tuple[list[ShardEntry], list[tuple[int, int]], int], hold: int, whole_shards: bool
) -> None:
    """With ``hold_bytes``: each reference read by exactly one task, tasks in the order of their first
    reference, each grouped task within one row group, and the samples read ahead of their turn within
    ``hold_bytes`` (by their row groups' bytes per row) after every task."""
    entries, refs, cap = plan
    whole = (lambda s: None if entries[s].offsets else entries[s].bytes) if whole_shards else None
    tasks = list(iter_reads(refs, entries.__getitem__, max_task_bytes=cap, whole=whole, hold_bytes=hold))
    handed, _ = _hand_on(tasks, len(refs))
    assert handed == refs
    weight = {}
    for t in tasks:
        if t.serves is not None:
            e = entries[t.shard]
            assert not e.offsets and len({group_of(e, p) for p in t.positions}) == 1
            g = e.row_groups[group_of(e, t.positions[0])]
            weight.update({u: g[1] / max(g[2], 1) for u in t.serves[1:]})
    done: set[int] = set()
    handed_at = 0
    for t in tasks:
        done.update(t.serves if t.serves is not None else range(handed_at, handed_at + len(t.positions)))
        while handed_at in done:
            handed_at += 1
        assert sum(w for u, w in weight.items() if u in done and u >= handed_at) <= hold + 1e-6


def test_a_shuffled_order_reads_each_row_group_once_with_room() -> None:
    """A buffer-shuffled order over 3 shards of 10 row groups of 20 rows: without holding, a task per run of
    references (almost one per reference); with room, one read per row group."""
    import random

    from fastload.core.shuffle import buffer_shuffle

    entries = [parquet_entry(s, [(1000, 20)] * 10) for s in range(3)]
    base = [(s, p) for s in (2, 0, 1) for p in range(200)]
    refs = [base[i] for i in buffer_shuffle(len(base), 64, random.Random(5))]
    before = list(iter_reads(refs, entries.__getitem__, max_task_bytes=1000))
    after = list(iter_reads(refs, entries.__getitem__, max_task_bytes=1000, hold_bytes=64 << 10))
    assert _hand_on(after, len(refs))[0] == refs
    assert len(before) > 300
    assert len(after) == 30 and {(t.shard, group_of(entries[t.shard], t.positions[0])) for t in after} == {
        (s, g) for s in range(3) for g in range(10)
    }
    # a bound of 25 samples: more reads, never more than 25 samples waiting
    tight = list(iter_reads(refs, entries.__getitem__, max_task_bytes=1000, hold_bytes=25 * 50))
    handed, ahead = _hand_on(tight, len(refs))
    assert handed == refs and max(ahead) <= 25 and 30 < len(tight) < len(before)


def test_in_order_references_are_planned_as_without_holding() -> None:
    """An unshuffled order (each shard one run of consecutive positions): the same tasks as before."""
    entries = [parquet_entry(s, [(1000, 20)] * 4) for s in range(2)]
    refs = [(s, p) for s in (1, 0) for p in range(80)]
    for cap in (1000, 2500, 1 << 20):
        plain = list(iter_reads(refs, entries.__getitem__, max_task_bytes=cap))
        held = list(iter_reads(refs, entries.__getitem__, max_task_bytes=cap, hold_bytes=1 << 20))
        assert held == plain and all(t.serves is None for t in held)
