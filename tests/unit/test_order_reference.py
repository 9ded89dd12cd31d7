"""``core.sharding``'s compact orders (spans, vectorised shuffle, resume building only the old ranks it
needs) against a plain reference: the list-of-pairs implementation they replaced, kept here verbatim
(plus the ``split`` rotation without a seed), on small inputs, every policy, shuffle and world change."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core import shuffle
from fastload.core.refs import Refs
from fastload.core.sharding import (
    buffer_shuffle_array,
    epoch_seed,
    rank_order,
    resumed_rank_order,
    shard_order,
    split_rotation,
    worker_position_array,
)

SETTINGS = settings(max_examples=200, deadline=None)
COUNTS = st.lists(st.one_of(st.just(0), st.integers(1, 3), st.integers(0, 40)), max_size=10)
Pairs = list[tuple[int, int]]


def ref_shard_order(shards: int, seed: int | None, epoch: int) -> list[int]:
    order = list(range(shards))
    if seed is not None:
        random.Random(epoch_seed(seed, epoch)).shuffle(order)
    return order


def ref_plan(counts: list[int], rank: int, world: int, seed: int | None, epoch: int, even: str):
    order = ref_shard_order(len(counts), seed, epoch)
    if even == "split":
        seq = [(s, i) for s in order for i in range(counts[s])]
        turn = epoch * (len(seq) % world) % len(seq) if seed is None and seq else 0
        seq = seq[turn:] + seq[:turn]
        per = len(seq) // world
        dropped = seq[world * per :] if rank == world - 1 else []
        return seq[rank * per : (rank + 1) * per], dropped, []
    per_rank: list[Pairs] = [[] for _ in range(world)]
    for k, s in enumerate(order):
        per_rank[k % world].extend((s, i) for i in range(counts[s]))
    sizes = [len(p) for p in per_rank]
    samples = per_rank[rank]
    if even == "drop":
        return samples[: min(sizes)], samples[min(sizes) :], []
    if even == "pad":
        extra = [samples[i % len(samples)] for i in range(max(sizes) - len(samples))]
        return samples + extra, [], extra
    return samples, [], []


def ref_buffer_shuffle(n: int, buffer: int, rng: random.Random) -> list[int]:
    if buffer <= 1:
        return list(range(n))
    pending: list[int] = []
    out: list[int] = []
    for i in range(n):
        pending.append(i)
        if len(pending) >= buffer:
            j = rng.randrange(len(pending))
            pending[j], pending[-1] = pending[-1], pending[j]
            out.append(pending.pop())
    rng.shuffle(pending)
    out.extend(pending)
    return out


def ref_order(counts, rank, world, seed, epoch, even, buffer):
    samples, dropped, repeated = ref_plan(counts, rank, world, seed, epoch, even)
    if seed is not None and buffer > 1:
        rng = random.Random(epoch_seed(seed, epoch) ^ (rank * 0x9E3779B97F4A7C15 % 2**63))
        samples = [samples[i] for i in ref_buffer_shuffle(len(samples), buffer, rng)]
    return samples, dropped, repeated


def ref_resumed(counts, rank, world, old_world, delivered, seed, epoch, even, buffer):
    rests = [
        ref_order(counts, o, old_world, seed, epoch, even, buffer)[0][delivered:] for o in range(old_world)
    ]
    longest = max((len(r) for r in rests), default=0)
    remaining = [r[i] for i in range(longest) for r in rests if i < len(r)]
    if even in ("split", "drop"):
        cut = len(remaining) // world * world
        return remaining[:cut][rank::world], remaining[cut:] if rank == world - 1 else [], []
    mine = remaining[rank::world]
    if even == "pad":
        want = -(-len(remaining) // world)
        pool = mine or remaining[:1]
        extra = [pool[i % len(pool)] for i in range(want - len(mine))] if pool else []
        return mine + extra, [], extra
    return mine, [], []


def pads_ok(counts: list[int], world: int, seed: int | None, epoch: int) -> bool:
    """Whether even='pad' has something to repeat on every rank (else it is refused, tested elsewhere)."""
    order = ref_shard_order(len(counts), seed, epoch)
    sizes = [sum(counts[s] for s in order[r::world]) for r in range(world)]
    return not (max(sizes) and min(sizes) == 0)


@SETTINGS
@given(
    counts=COUNTS,
    world=st.integers(1, 5),
    seed=st.one_of(st.none(), st.integers(0, 2**40)),
    epoch=st.integers(0, 6),
    even=st.sampled_from(["split", "drop", "pad", "none"]),
    buffer=st.one_of(st.just(0), st.integers(2, 70)),
    data=st.data(),
)
def test_rank_order_is_the_reference_order(counts, world, seed, epoch, even, buffer, data) -> None:
    if even == "pad" and not pads_ok(counts, world, seed, epoch):
        return
    rank = data.draw(st.integers(0, world - 1))
    got = rank_order(
        counts, rank=rank, world_size=world, seed=seed, epoch=epoch, even=even, shuffle_buffer=buffer
    )
    want = ref_order(counts, rank, world, seed, epoch, even, buffer)
    assert (list(got.samples), list(got.dropped), list(got.repeated)) == want
    assert len(got.samples) == len(want[0])


@SETTINGS
@given(
    counts=st.lists(st.integers(0, 30), min_size=1, max_size=8),
    old=st.integers(1, 5),
    new=st.integers(1, 6),
    frac=st.floats(0, 1),
    seed=st.one_of(st.none(), st.integers(0, 50)),
    epoch=st.integers(0, 4),
    even=st.sampled_from(["split", "drop", "pad", "none"]),
    buffer=st.integers(0, 9),
    data=st.data(),
)
def test_resumed_rank_order_is_the_reference_order(counts, old, new, frac, seed, epoch, even, buffer, data):
    if even == "pad" and not pads_ok(counts, old, seed, epoch):
        return
    lengths = [len(ref_order(counts, o, old, seed, epoch, even, buffer)[0]) for o in range(old)]
    delivered = int(frac * min(lengths))
    rank = data.draw(st.integers(0, new - 1))
    kw = {"seed": seed, "epoch": epoch, "even": even, "shuffle_buffer": buffer}
    got = resumed_rank_order(counts, rank=rank, world_size=new, old_world_size=old, delivered=delivered, **kw)
    want = ref_resumed(counts, rank, new, old, delivered, seed, epoch, even, buffer)
    assert (list(got.samples), list(got.dropped), list(got.repeated)) == want


def _native_shuffle(n: int, buffer: int, rng: random.Random) -> np.ndarray:
    from fastload import _native  # the C loop (CI builds it); core.shuffle's wrapper around it

    return np.arange(n) if buffer <= 1 else shuffle._with_native(_native.buffer_shuffle, n, buffer, rng)


# buffer_shuffle_array (whichever this process picked), the numpy version and the C loop, each by name
SHUFFLES = [buffer_shuffle_array, shuffle._buffer_shuffle_vectorised, _native_shuffle]


@pytest.mark.parametrize("impl", SHUFFLES, ids=lambda f: f.__name__)
@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 400), buffer=st.integers(-1, 120), rng_seed=st.integers(0, 2**64))
def test_buffer_shuffles_are_the_loop_and_leave_the_rng_where_the_loop_does(impl, n, buffer, rng_seed):
    if impl is shuffle._buffer_shuffle_vectorised and buffer <= 1:
        return  # (buffer_shuffle_array answers these itself)
    a, b = random.Random(rng_seed), random.Random(rng_seed)
    assert impl(n, buffer, a).tolist() == ref_buffer_shuffle(n, buffer, b)
    assert a.random() == b.random()


@pytest.mark.parametrize("impl", SHUFFLES[1:], ids=lambda f: f.__name__)
def test_buffer_shuffles_with_a_large_buffer(impl) -> None:
    # 2**16 + 1 slots: past the 16-bit sort, and a buffer whose draws reject almost half the words
    n, buffer = 200_000, (1 << 16) + 1
    assert impl(n, buffer, random.Random(9)).tolist() == ref_buffer_shuffle(n, buffer, random.Random(9))


def test_the_c_shuffle_is_used_once_it_passes_its_checks() -> None:
    from fastload import _native
    from fastload.formats.native import accelerate_shuffle

    assert accelerate_shuffle()  # (what ShardDataset calls)
    assert shuffle.native_in_use()
    try:
        shuffle.use_native(lambda n, b, key, pos: (bytearray(np.arange(n).tobytes()), key, pos))
        assert not shuffle.native_in_use(), "an accelerator that does not shuffle must be refused"
    finally:
        shuffle.use_native(_native.buffer_shuffle)
    assert shuffle.native_in_use()


def _native_shuffle_at(n: int, buffer: int, rng: random.Random, at: np.ndarray) -> np.ndarray:
    from fastload import _native

    return shuffle._with_native(_native.buffer_shuffle, n, buffer, rng, np.sort(at))


@pytest.mark.parametrize("impl", [shuffle.buffer_shuffle_at, _native_shuffle_at], ids=lambda f: f.__name__)
@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 300), buffer=st.integers(0, 80), rng_seed=st.integers(0, 2**64), data=st.data())
def test_the_shuffle_at_some_positions_is_the_loop_there(impl, n, buffer, rng_seed, data) -> None:
    # positions in any order, repeated, before, inside and after the steps (the last buffer - 1 outputs
    # come from the final shuffle of what is left)
    at = np.asarray(data.draw(st.lists(st.integers(0, n - 1), max_size=12)), dtype=np.int64)
    if impl is _native_shuffle_at and buffer <= 1:
        return  # (buffer_shuffle_at answers these itself)
    a, b = random.Random(rng_seed), random.Random(rng_seed)
    want = np.asarray(ref_buffer_shuffle(n, buffer, b), dtype=np.int64)
    got = impl(n, buffer, a, at)
    assert got.tolist() == (want[np.sort(at)] if impl is _native_shuffle_at else want[at]).tolist()
    assert a.random() == b.random()


def test_the_c_shuffle_refuses_positions_out_of_order_or_range() -> None:
    from fastload import _native

    key = np.zeros(624, dtype=np.uint32).tobytes()
    for at in ([3, 1], [0, 10], [-1], [2**40]):
        with pytest.raises(ValueError, match="ascending within"):
            _native.buffer_shuffle(10, 4, key, 624, np.asarray(at, dtype=np.int64))
    with pytest.raises(ValueError, match="ascending within"):
        _native.buffer_shuffle(10, 4, key, 624, b"\0" * 12)  # not whole int64s
    with pytest.raises(IndexError):
        shuffle.buffer_shuffle_at(10, 4, random.Random(0), np.asarray([10]))


def test_shard_order_is_random_shuffle_of_the_shards() -> None:
    # (computed as a shuffle buffer larger than the input: in C, past the accelerator's checked sizes)
    for shards in (0, 1, 2, 7, 5_000):
        for seed, epoch in ((None, 3), (0, 0), (11, 4)):
            assert shard_order(shards, seed=seed, epoch=epoch) == ref_shard_order(shards, seed, epoch)


@SETTINGS
@given(
    spans=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 9), st.integers(0, 6)), max_size=8),
    extra=st.integers(0, 20),
    data=st.data(),
)
def test_refs_behave_as_the_list_of_pairs(spans, extra, data) -> None:
    pairs = [(s, f + i) for s, f, n in spans for i in range(n)]
    refs = Refs([s for s, _, _ in spans], [f for _, f, _ in spans], [n for _, _, n in spans])
    assert refs == pairs and list(refs) == pairs and len(refs) == len(pairs)
    if pairs:
        want = len(pairs) + extra
        cyc = refs.cycled(want)
        assert cyc == [pairs[i % len(pairs)] for i in range(want)]
        a = data.draw(st.integers(0, want))
        b = data.draw(st.integers(a, want))
        assert cyc[a:b] == cyc.pairs()[a:b]
        assert cyc[a:b][1:] == cyc.pairs()[a:b][1:]
        perm = data.draw(st.permutations(range(b - a)))
        view = cyc[a:b].permuted(np.asarray(perm, dtype=np.int64))
        assert view == [cyc.pairs()[a:b][i] for i in perm]
        assert [view[i] for i in range(-len(view), len(view))] == view.pairs() * 2
        assert view[::2] == view.pairs()[::2]
        assert Refs.from_arrays(*view.arrays()) == view


def test_split_rotation_is_zero_when_nothing_is_cut_or_a_seed_is_given() -> None:
    assert [split_rotation(12, world_size=4, seed=None, epoch=e) for e in range(3)] == [0, 0, 0]
    assert [split_rotation(14, world_size=4, seed=None, epoch=e) for e in range(4)] == [0, 2, 4, 6]
    assert split_rotation(14, world_size=4, seed=3, epoch=5) == 0
    assert split_rotation(0, world_size=4, seed=None, epoch=5) == 0


@SETTINGS
@given(
    total=st.integers(0, 300),
    workers=st.integers(1, 9),
    chunk=st.one_of(st.integers(1, 40), st.integers(1, 10**9)),
    data=st.data(),
)
def test_worker_positions_are_the_reference_loop(total: int, workers: int, chunk: int, data) -> None:
    start = data.draw(st.integers(0, total))
    for worker in range(workers):
        want: list[int] = []
        for a in range(start + worker * chunk, total, workers * chunk):
            want.extend(range(a, min(a + chunk, total)))
        got = worker_position_array(total, worker=worker, workers=workers, chunk=chunk, start=start)
        assert got.tolist() == want


def test_importing_fastload_gives_core_no_accelerator_until_asked() -> None:
    """The C shuffle is given by an explicit call (ShardDataset's), not as a side effect of an import."""
    code = (
        "import fastload, fastload.formats\n"
        "from fastload.core import shuffle\n"
        "assert not shuffle._NATIVE, 'installed at import'\n"
        "fastload.ShardDataset\n"
        "from fastload.formats.native import accelerate_shuffle\n"
        "assert accelerate_shuffle() and shuffle.native_in_use()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
