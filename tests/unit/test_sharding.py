"""Who reads which sample: even policies partition the epoch, shard order and the bounded shuffle are
permutations, chunked worker positions merge back into the rank's order for any number of workers, and
worker stretches (batch size unknown) partition it into near-equal contiguous pieces."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core.sharding import (
    EVEN_POLICIES,
    buffer_shuffle,
    epoch_seed,
    rank_order,
    rank_plan,
    resumed_rank_order,
    shard_order,
    worker_positions,
    worker_span,
)

SETTINGS = settings(max_examples=150, deadline=None)

# Shard sample counts: empty shards, single-sample shards and uneven sizes, sometimes no shard at all.
COUNTS = st.lists(st.one_of(st.just(0), st.integers(1, 3), st.integers(0, 40)), max_size=12)
WORLD = st.integers(1, 4)
SEEDS = st.one_of(st.none(), st.integers(0, 2**40))
EPOCHS = st.integers(0, 6)


def all_samples(counts: list[int]) -> list[tuple[int, int]]:
    return [(s, i) for s, n in enumerate(counts) for i in range(n)]


def epoch_sequence(counts: list[int], seed: int | None, epoch: int, world: int) -> list[tuple[int, int]]:
    """Every sample, shards in this epoch's order (the sequence ``split`` cuts into slices); without a
    seed, rotated by ``epoch * (N mod world)`` samples so the cut tail moves on every epoch."""
    seq = [(s, i) for s in shard_order(len(counts), seed=seed, epoch=epoch) for i in range(counts[s])]
    turn = epoch * (len(seq) % world) % len(seq) if seed is None and seq else 0
    return seq[turn:] + seq[:turn]


def own_samples(
    counts: list[int], rank: int, world: int, seed: int | None, epoch: int
) -> list[tuple[int, int]]:
    """The samples of the shards dealt round-robin to ``rank`` (what drop/pad/none start from)."""
    order = shard_order(len(counts), seed=seed, epoch=epoch)
    return [(s, i) for k, s in enumerate(order) if k % world == rank for i in range(counts[s])]


def plans(counts: list[int], world: int, seed: int | None, epoch: int, even: str) -> list:
    return [
        rank_plan(counts, rank=r, world_size=world, seed=seed, epoch=epoch, even=even) for r in range(world)
    ]


# --- even="split" -------------------------------------------------------------------------------------


@SETTINGS
@given(counts=COUNTS, world=WORLD, seed=SEEDS, epoch=EPOCHS)
def test_split_is_equal_disjoint_and_covers_every_sample_once(
    counts: list[int], world: int, seed: int | None, epoch: int
) -> None:
    ps = plans(counts, world, seed, epoch, "split")
    total = sum(counts)
    delivered = [x for p in ps for x in p.samples]
    dropped = [x for p in ps for x in p.dropped]
    # Equal counts, the largest possible.
    assert [len(p.samples) for p in ps] == [total // world] * world
    # Every sample exactly once, either delivered by one rank or reported dropped.
    assert Counter(delivered + dropped) == Counter(all_samples(counts))
    assert len(dropped) == total % world < world
    assert not any(p.repeated for p in ps)
    # Contiguous slices of the epoch's sequence, in rank order, the dropped tail last.
    assert delivered + dropped == epoch_sequence(counts, seed, epoch, world)


def test_split_examples() -> None:
    # 7 samples over 3 ranks: 2 each, the last one dropped and reported by the last rank only.
    ps = plans([3, 0, 4], 3, None, 0, "split")
    assert [p.samples for p in ps] == [[(0, 0), (0, 1)], [(0, 2), (2, 0)], [(2, 1), (2, 2)]]
    assert [p.dropped for p in ps] == [[], [], [(2, 3)]]
    # More ranks than samples: everything is dropped, nobody reads anything.
    ps = plans([1, 1], 4, 3, 0, "split")
    assert [p.samples for p in ps] == [[], [], [], []]
    assert sorted(x for p in ps for x in p.dropped) == [(0, 0), (1, 0)]


# --- even="drop" --------------------------------------------------------------------------------------


@SETTINGS
@given(counts=COUNTS, world=WORLD, seed=SEEDS, epoch=EPOCHS)
def test_drop_gives_equal_disjoint_counts_and_reports_the_rest(
    counts: list[int], world: int, seed: int | None, epoch: int
) -> None:
    ps = plans(counts, world, seed, epoch, "drop")
    delivered = [x for p in ps for x in p.samples]
    dropped = [x for p in ps for x in p.dropped]
    owns = [own_samples(counts, r, world, seed, epoch) for r in range(world)]
    smallest = min(len(o) for o in owns)
    assert [len(p.samples) for p in ps] == [smallest] * world
    assert Counter(delivered + dropped) == Counter(all_samples(counts))
    for p, own in zip(ps, owns, strict=True):
        # A rank keeps a prefix of its own shards' samples and reports the rest of them.
        assert p.samples + p.dropped == own
        assert not p.repeated


# --- even="pad" ---------------------------------------------------------------------------------------


@SETTINGS
@given(counts=COUNTS, world=WORLD, seed=SEEDS, epoch=EPOCHS)
def test_pad_gives_equal_counts_repeating_exactly_what_it_reports(
    counts: list[int], world: int, seed: int | None, epoch: int
) -> None:
    owns = [own_samples(counts, r, world, seed, epoch) for r in range(world)]
    largest = max(len(o) for o in owns)
    if largest and not all(owns):
        # A rank with nothing of its own has nothing to repeat: refused with a hint, never a hang.
        empty = next(r for r, o in enumerate(owns) if not o)
        with pytest.raises(ValueError, match="split"):
            rank_plan(counts, rank=empty, world_size=world, seed=seed, epoch=epoch, even="pad")
        return
    ps = plans(counts, world, seed, epoch, "pad")
    assert [len(p.samples) for p in ps] == [largest] * world
    delivered = [x for p in ps for x in p.samples]
    assert set(delivered) == set(all_samples(counts))  # every sample at least once
    for p, own in zip(ps, owns, strict=True):
        assert not p.dropped
        assert p.samples[: len(own)] == own
        # Exactly the reported repeats come on top of the rank's own samples.
        assert Counter(p.samples) == Counter(own) + Counter(p.repeated)
        assert set(p.repeated) <= set(own)
    repeats = Counter(x for p in ps for x in p.repeated)
    assert Counter(delivered) == Counter(all_samples(counts)) + repeats


# --- even="none" --------------------------------------------------------------------------------------


@SETTINGS
@given(counts=COUNTS, world=WORLD, seed=SEEDS, epoch=EPOCHS)
def test_none_is_a_partition(counts: list[int], world: int, seed: int | None, epoch: int) -> None:
    ps = plans(counts, world, seed, epoch, "none")
    delivered = [x for p in ps for x in p.samples]
    assert Counter(delivered) == Counter(all_samples(counts))
    assert not any(p.dropped or p.repeated for p in ps)
    for r, p in enumerate(ps):
        assert p.samples == own_samples(counts, r, world, seed, epoch)


# --- the sample shuffle on top of a plan ---------------------------------------------------------------


@SETTINGS
@given(
    counts=COUNTS,
    world=WORLD,
    seed=SEEDS,
    epoch=EPOCHS,
    even=st.sampled_from(["split", "drop", "none"]),
    buffer=st.integers(0, 50),
    data=st.data(),
)
def test_rank_order_permutes_the_plan_deterministically(
    counts: list[int], world: int, seed: int | None, epoch: int, even: str, buffer: int, data: st.DataObject
) -> None:
    rank = data.draw(st.integers(0, world - 1))
    kw = {"rank": rank, "world_size": world, "seed": seed, "epoch": epoch, "even": even}
    plan = rank_plan(counts, **kw)
    shuffled = rank_order(counts, shuffle_buffer=buffer, **kw)
    assert Counter(shuffled.samples) == Counter(plan.samples)
    assert shuffled.dropped == plan.dropped
    assert rank_order(counts, shuffle_buffer=buffer, **kw).samples == shuffled.samples  # deterministic
    if seed is None or buffer <= 1:
        assert shuffled.samples == plan.samples


def test_rank_order_actually_shuffles_samples() -> None:
    kw = {"rank": 0, "world_size": 1, "seed": 7, "epoch": 0}
    plan = rank_plan([50, 50], **kw)
    shuffled = rank_order([50, 50], shuffle_buffer=16, **kw).samples
    assert shuffled != plan.samples
    # The window is bounded: no sample moves ahead by more than the buffer.
    position = {x: i for i, x in enumerate(plan.samples)}
    assert all(position[x] <= i + 15 for i, x in enumerate(shuffled))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rank": 0, "world_size": 0},
        {"rank": 2, "world_size": 2},
        {"rank": -1, "world_size": 2},
        {"rank": 0, "world_size": 1, "even": "evenly"},
    ],
)
def test_rank_plan_rejects_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        rank_plan([3, 4], seed=1, epoch=0, **kwargs)


def test_rank_plan_rejects_negative_counts() -> None:
    with pytest.raises(ValueError):
        rank_plan([3, -1], rank=0, world_size=1, seed=None, epoch=0)


def test_even_policies_are_the_documented_four() -> None:
    assert set(EVEN_POLICIES) == {"split", "drop", "pad", "none"}


# --- shard_order ------------------------------------------------------------------------------------


@SETTINGS
@given(shards=st.integers(0, 60), seed=SEEDS, epoch=EPOCHS)
def test_shard_order_is_a_permutation(shards: int, seed: int | None, epoch: int) -> None:
    order = shard_order(shards, seed=seed, epoch=epoch)
    assert sorted(order) == list(range(shards))
    assert shard_order(shards, seed=seed, epoch=epoch) == order  # deterministic
    if seed is None:
        assert order == list(range(shards))


@SETTINGS
@given(
    shards=st.integers(10, 60),
    seed=st.integers(0, 2**40),
    epochs=st.lists(st.integers(0, 1000), min_size=2, max_size=2, unique=True),
)
def test_shard_order_differs_across_epochs(shards: int, seed: int, epochs: list[int]) -> None:
    a, b = (shard_order(shards, seed=seed, epoch=e) for e in epochs)
    assert a != b


@SETTINGS
@given(shards=st.integers(10, 60), seeds=st.lists(st.integers(0, 2**40), min_size=2, max_size=2, unique=True))
def test_shard_order_differs_across_seeds(shards: int, seeds: list[int]) -> None:
    a, b = (shard_order(shards, seed=s, epoch=0) for s in seeds)
    assert a != b


def test_epoch_seed_is_stable() -> None:
    # Pinned: a change would silently change every resumed job's order.
    assert epoch_seed(0, 0) == 12_345
    assert epoch_seed(1, 2) == 1_000_003 + 2 * 7_919 + 12_345
    assert shard_order(5, seed=None, epoch=3) == [0, 1, 2, 3, 4]


# --- buffer_shuffle ---------------------------------------------------------------------------------


@SETTINGS
@given(n=st.integers(0, 300), buffer=st.integers(-2, 80), rng_seed=st.integers(0, 2**32))
def test_buffer_shuffle_is_a_bounded_permutation(n: int, buffer: int, rng_seed: int) -> None:
    out = buffer_shuffle(n, buffer, random.Random(rng_seed))
    assert sorted(out) == list(range(n))
    if buffer <= 1:
        assert out == list(range(n))
    # Output position i can only hold an input the buffer has already seen.
    assert all(x <= i + max(buffer, 1) - 1 for i, x in enumerate(out))
    assert buffer_shuffle(n, buffer, random.Random(rng_seed)) == out  # a function of the rng


def test_buffer_shuffle_mixes() -> None:
    out = buffer_shuffle(100, 10, random.Random(0))
    assert out != list(range(100))
    assert buffer_shuffle(100, 10, random.Random(1)) != out


# --- worker_positions ---------------------------------------------------------------------------------


def merge_round_robin(per_worker: list[list[int]], chunk: int) -> list[int]:
    """What DataLoader hands the training loop: one chunk (batch) from each worker in turn, skipping
    workers that have run out."""
    chunks = [[lst[i : i + chunk] for i in range(0, len(lst), chunk)] for lst in per_worker]
    out: list[int] = []
    turn = [0] * len(chunks)
    active = [w for w in range(len(chunks)) if chunks[w]]
    while active:
        for w in list(active):
            out.extend(chunks[w][turn[w]])
            turn[w] += 1
            if turn[w] == len(chunks[w]):
                active.remove(w)
    return out


@SETTINGS
@given(
    total=st.integers(0, 250),
    workers=st.integers(1, 9),
    chunk=st.integers(1, 12),
    data=st.data(),
)
def test_worker_positions_merge_back_into_the_rank_order(
    total: int, workers: int, chunk: int, data: st.DataObject
) -> None:
    start = data.draw(st.integers(0, total))
    per_worker = [
        worker_positions(total, worker=w, workers=workers, chunk=chunk, start=start) for w in range(workers)
    ]
    # A partition of [start, total) ...
    assert sorted(p for lst in per_worker for p in lst) == list(range(start, total))
    for lst in per_worker:
        assert lst == sorted(lst)
        # ... made of whole chunks of consecutive positions aligned at start (only the last may be short).
        pieces = [lst[i : i + chunk] for i in range(0, len(lst), chunk)]
        for piece in pieces:
            assert piece == list(range(piece[0], piece[0] + len(piece)))
            assert (piece[0] - start) % chunk == 0
            assert len(piece) == chunk or piece[-1] == total - 1
    # Taking one chunk from each worker in turn gives back the rank's order, whatever the worker count.
    assert merge_round_robin(per_worker, chunk) == list(range(start, total))


def test_worker_positions_example() -> None:
    got = [worker_positions(10, worker=w, workers=2, chunk=3, start=1) for w in range(2)]
    assert got == [[1, 2, 3, 7, 8, 9], [4, 5, 6]]
    assert worker_positions(10, worker=2, workers=3, chunk=4) == [8, 9]
    assert worker_positions(5, worker=0, workers=1, chunk=2, start=5) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"worker": 0, "workers": 0},
        {"worker": 2, "workers": 2},
        {"worker": -1, "workers": 2},
        {"worker": 0, "workers": 1, "chunk": 0},
        {"worker": 0, "workers": 1, "chunk": -3},
        {"worker": 0, "workers": 1, "start": -1},
        {"worker": 0, "workers": 1, "start": 11},
    ],
)
def test_worker_positions_rejects_bad_arguments(kwargs: dict) -> None:
    kwargs = {"chunk": 4, **kwargs}
    with pytest.raises(ValueError):
        worker_positions(10, **kwargs)


# --- worker_span ------------------------------------------------------------------------------------


@SETTINGS
@given(total=st.integers(0, 250), workers=st.integers(1, 9), data=st.data())
def test_worker_spans_cut_the_rest_of_the_order_into_near_equal_stretches(
    total: int, workers: int, data: st.DataObject
) -> None:
    start = data.draw(st.integers(0, total))
    spans = [worker_span(total, worker=w, workers=workers, start=start) for w in range(workers)]
    # consecutive, covering [start, total) exactly once, in worker order
    assert spans[0][0] == start and spans[-1][1] == total
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    sizes = [stop - first for first, stop in spans]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1
    # one worker reads what worker_positions gives it with any chunk
    assert list(range(*worker_span(total, worker=0, workers=1, start=start))) == worker_positions(
        total, worker=0, workers=1, chunk=3, start=start
    )


def test_worker_span_example() -> None:
    assert [worker_span(10, worker=w, workers=3) for w in range(3)] == [(0, 3), (3, 6), (6, 10)]
    assert [worker_span(10, worker=w, workers=2, start=4) for w in range(2)] == [(4, 7), (7, 10)]
    assert worker_span(2, worker=2, workers=3) == (1, 2)  # more workers than samples: some read nothing
    assert worker_span(2, worker=0, workers=3) == (0, 0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"worker": 0, "workers": 0},
        {"worker": 2, "workers": 2},
        {"worker": 0, "workers": 1, "start": -1},
        {"worker": 0, "workers": 1, "start": 11},
    ],
)
def test_worker_span_rejects_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        worker_span(10, **kwargs)


@settings(max_examples=150, deadline=None)
@given(
    counts=st.lists(st.integers(0, 30), min_size=1, max_size=8),
    old=st.integers(1, 4),
    new=st.integers(1, 5),
    frac=st.floats(0, 1),
    seed=st.one_of(st.none(), st.integers(0, 50)),
    even=st.sampled_from(["split", "drop", "none"]),
    shuffle_buffer=st.integers(0, 8),
)
def test_resumed_rank_order_partitions_the_rest_of_the_epoch(
    counts: list[int], old: int, new: int, frac: float, seed: int | None, even: str, shuffle_buffer: int
) -> None:
    kw = {"seed": seed, "epoch": 3, "even": even, "shuffle_buffer": shuffle_buffer}
    plans = [rank_order(counts, rank=r, world_size=old, **kw) for r in range(old)]
    shortest = min(len(p.samples) for p in plans)
    delivered = int(frac * shortest)
    before = [s for p in plans for s in p.samples[:delivered]]
    rest = [
        resumed_rank_order(counts, rank=r, world_size=new, old_world_size=old, delivered=delivered, **kw)
        for r in range(new)
    ]
    after = [s for p in rest for s in p.samples]
    dropped = [s for p in rest for s in p.dropped]
    epoch = [s for p in plans for s in p.samples]
    assert sorted(before + after + dropped) == sorted(epoch)  # nothing lost, nothing repeated
    if even != "none":
        assert len({len(p.samples) for p in rest}) == 1
        assert len(dropped) < new


@SETTINGS
@given(counts=COUNTS, world=WORLD, first=EPOCHS)
def test_split_without_seed_trains_every_sample_within_world_size_epochs(
    counts: list[int], world: int, first: int
) -> None:
    total = sum(counts)
    trained: set[tuple[int, int]] = set()
    cut: list[set[tuple[int, int]]] = []
    for epoch in range(first, first + world):
        ps = plans(counts, world, None, epoch, "split")
        trained |= {x for p in ps for x in p.samples}
        cut.append({x for p in ps for x in p.dropped})
    if total >= world:
        assert trained == set(all_samples(counts))
        # the cut moves on: consecutive epochs never cut the same sample
        assert all(not (a & b) for a, b in itertools.pairwise(cut))
    else:
        assert not trained  # fewer samples than ranks: nobody reads anything


def test_split_without_seed_rotates_the_cut_example() -> None:
    # 7 samples over 3 ranks: one is cut each epoch, a different one every epoch
    cuts = [[x for p in plans([3, 0, 4], 3, None, e, "split") for x in p.dropped] for e in range(4)]
    assert cuts == [[(2, 3)], [(0, 0)], [(0, 1)], [(0, 2)]]
