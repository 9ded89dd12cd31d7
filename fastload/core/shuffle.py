"""The bounded sample shuffle: a streaming shuffle buffer of ``buffer`` items, as a permutation.

:func:`buffer_shuffle` is defined by the loop :func:`_buffer_shuffle_loop` (one ``rng.randrange`` per sample
once the buffer is full, the rest shuffled at the end); :func:`buffer_shuffle_array` computes the same
permutation, leaving ``rng`` in the same state, with O(n) numpy work: the draws are read from ``rng``'s own
Mersenne Twister stream by numpy's MT19937, and which sample each draw gives out is a stable sort by slot.
Checked once per process against the loop (a Python whose ``randrange`` draws otherwise gets the loop).
An accelerator (the C loop of ``fastload._native``, registered by ``fastload.formats.native``) can be given
with :func:`use_native`; it is used only once it gives the loop's permutation and state on the same checks.
:func:`buffer_shuffle_at` is the permutation at a few positions (a resume on another world size needs a few
of each old rank's): the accelerator then keeps only those outputs, which makes the steps between them cheap.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from fastload.core.refs import Ints


def _buffer_shuffle_loop(n: int, buffer: int, rng: random.Random) -> list[int]:
    """The streaming shuffle buffer, one sample at a time (the definition; see :func:`buffer_shuffle`)."""
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


def _draws(rng: random.Random, steps: int, buffer: int) -> npt.NDArray[np.uint64]:
    """The next ``steps`` values of ``rng.randrange(buffer)``, drawn from ``rng``'s own Mersenne Twister
    stream by numpy (CPython draws ``getrandbits(buffer.bit_length())`` until one is below ``buffer``; for
    ``k <= 32`` bits that is the top ``k`` bits of one 32-bit output). ``rng`` is left where the draws
    leave it."""
    shift = np.uint64(32 - buffer.bit_length())
    version, words, gauss = rng.getstate()
    gen = np.random.MT19937()
    start: Any = {"key": np.asarray(words[:624], dtype=np.uint32), "pos": words[624]}
    gen.state = {"bit_generator": "MT19937", "state": start}
    got: list[npt.NDArray[np.uint64]] = []
    have = 0
    while have < steps:  # each draw takes at least one word: never more words than draws still wanted
        raw = gen.random_raw(steps - have) >> shift
        got.append(raw[raw < buffer])
        have += len(got[-1])
    end: Any = gen.state["state"]
    rng.setstate((version, (*end["key"].tolist(), int(end["pos"])), gauss))
    return np.concatenate(got) if got else np.zeros(0, dtype=np.uint64)


def _buffer_shuffle_vectorised(n: int, buffer: int, rng: random.Random) -> Ints:
    """:func:`_buffer_shuffle_loop`'s permutation by numpy. Once the buffer is full, step ``t`` takes in
    sample ``buffer - 1 + t`` and draws a slot ``j``: the last slot gives out the new sample, any other
    gives out what it held (the sample put there by the previous step that drew it, or its first one) and
    keeps the new sample; the slots left at the end are shuffled by ``rng`` as the loop does."""
    steps = max(0, n - buffer + 1)
    out = np.arange(buffer - 1, buffer - 1 + steps, dtype=np.int64)  # j == buffer - 1: the new sample
    slots = np.arange(min(n, buffer - 1), dtype=np.int64)
    if steps:
        j = _draws(rng, steps, buffer)
        t = np.flatnonzero(j < buffer - 1)
        js = j[t].astype(np.uint16 if buffer <= 1 << 16 else np.int64)  # 16 bits: a radix sort
        ts = t[np.argsort(js, kind="stable")]
        gs = np.repeat(np.arange(buffer - 1, dtype=np.int64), np.bincount(js, minlength=buffer - 1))
        same = gs[1:] == gs[:-1]  # entry m + 1 is the next draw of entry m's slot
        given = gs.copy()  # a slot's first draw gives out its first sample, a later one the previous new one
        given[1:] = np.where(same, buffer - 1 + ts[:-1], gs[1:])
        out[ts] = given
        last = np.append(~same, len(ts) > 0)[: len(ts)]
        slots[gs[last]] = buffer - 1 + ts[last]
    rest = slots.tolist()
    rng.shuffle(rest)
    return np.concatenate([out, np.asarray(rest, dtype=np.int64)])


_CASES = [(300, 7, 1), (200, 16, 2), (50, 64, 3), (1000, 1000, 4), (40, 2, 5), (3000, 300, 6), (5, 9, 7)]


def _matches_loop(shuffle: Callable[[int, int, random.Random], Ints]) -> bool:
    """Whether ``shuffle`` gives :func:`_buffer_shuffle_loop`'s permutation and leaves the same state."""
    for n, b, seed in _CASES:
        mine, theirs = random.Random(seed), random.Random(seed)
        if shuffle(n, b, mine).tolist() != _buffer_shuffle_loop(n, b, theirs):
            return False
        if mine.getstate() != theirs.getstate():
            return False
    return True


def _at_matches_loop(shuffle_at: Callable[[int, int, random.Random, Ints], Ints]) -> bool:
    """Whether ``shuffle_at`` (ascending positions) gives the loop's permutation there and its state."""
    for n, b, seed in _CASES:
        at = np.unique(np.asarray([0, 1, b - 2, b - 1, b, n // 2, n - b, n - 2, n - 1], dtype=np.int64))
        at = np.repeat(at[(at >= 0) & (at < n)], 2)  # each asked for twice
        mine, theirs = random.Random(seed), random.Random(seed)
        if shuffle_at(n, b, mine, at).tolist() != np.asarray(_buffer_shuffle_loop(n, b, theirs))[at].tolist():
            return False
        if mine.getstate() != theirs.getstate():
            return False
    return True


def _vectorised_matches_loop() -> bool:
    """Whether this Python's ``randrange``/``shuffle`` draw as :func:`_draws` assumes (checked once)."""
    return _matches_loop(_buffer_shuffle_vectorised)


_VECTORISED: list[bool] = []
# the accelerator: (n, buffer, key, pos[, at]) -> (order as native int64 bytes, key, pos), with ``at``
# (ascending native int64 positions) only the order's values there; see use_native
NativeShuffle = Callable[..., tuple[bytearray, bytes, int]]
_NATIVE: list[NativeShuffle] = []  # given by use_native
_NATIVE_OK: list[bool] = []  # whether it passed the checks (done at its first use)


def _with_native(
    native: NativeShuffle, n: int, buffer: int, rng: random.Random, at: Ints | None = None
) -> Ints:
    version, words, gauss = rng.getstate()
    key = np.asarray(words[:624], dtype=np.uint32).tobytes()
    wanted = () if at is None else (np.ascontiguousarray(at, dtype=np.int64),)
    order, key, pos = native(n, buffer, key, int(words[624]), *wanted)
    rng.setstate((version, (*np.frombuffer(key, dtype=np.uint32).tolist(), pos), gauss))
    return np.frombuffer(order, dtype=np.int64)


def use_native(native: NativeShuffle | None) -> None:
    """Compute :func:`buffer_shuffle` with ``native`` (None: stop), provided it gives the loop's
    permutations and leaves ``rng`` where the loop does (checked at its first use: :func:`native_in_use`)."""
    _NATIVE[:] = [native] if native is not None else []
    _NATIVE_OK.clear()


def accelerated(native: NativeShuffle) -> bool:
    """Whether ``native`` is the accelerator given (so that giving it again would check it again)."""
    return bool(_NATIVE) and _NATIVE[0] is native


def native_in_use() -> bool:
    """Whether :func:`buffer_shuffle` runs on the accelerator given to :func:`use_native`."""
    if _NATIVE and not _NATIVE_OK:
        native = _NATIVE[0]
        ok = _matches_loop(lambda n, b, rng: _with_native(native, n, b, rng)) and _at_matches_loop(
            lambda n, b, rng, at: _with_native(native, n, b, rng, at)
        )
        _NATIVE_OK.append(ok)
    return bool(_NATIVE) and _NATIVE_OK[0]


def buffer_shuffle_array(n: int, buffer: int, rng: random.Random) -> Ints:
    """:func:`buffer_shuffle` as a numpy array, in O(n) numpy work (+ O(``buffer``) Python)."""
    if buffer <= 1:
        return np.arange(n, dtype=np.int64)
    if buffer.bit_length() <= 32 and native_in_use():
        return _with_native(_NATIVE[0], n, buffer, rng)
    if not _VECTORISED:
        _VECTORISED.append(_vectorised_matches_loop())
    if _VECTORISED[0] and buffer.bit_length() <= 32:
        return _buffer_shuffle_vectorised(n, buffer, rng)
    return np.asarray(_buffer_shuffle_loop(n, buffer, rng), dtype=np.int64)


def buffer_shuffle_at(n: int, buffer: int, rng: random.Random, positions: Ints) -> Ints:
    """``buffer_shuffle_array(n, buffer, rng)[positions]``, leaving ``rng`` in the same state; on the
    accelerator without the whole permutation (a few positions of a long order cost about a quarter)."""
    pos = np.asarray(positions, dtype=np.int64)
    if len(pos) and (pos.min() < 0 or pos.max() >= n):
        raise IndexError(f"positions outside [0, {n=})")
    if buffer <= 1 or buffer.bit_length() > 32 or not native_in_use():
        return buffer_shuffle_array(n, buffer, rng)[pos]
    if np.all(pos[1:] >= pos[:-1]):
        return _with_native(_NATIVE[0], n, buffer, rng, pos)
    order = np.argsort(pos, kind="stable")
    out = np.empty(len(pos), dtype=np.int64)
    out[order] = _with_native(_NATIVE[0], n, buffer, rng, pos[order])
    return out


def buffer_shuffle(n: int, buffer: int, rng: random.Random) -> list[int]:
    """A permutation of ``range(n)`` as a streaming shuffle buffer of ``buffer`` items would produce it:
    each output is drawn at random from the next ``buffer`` pending inputs (``buffer`` <= 1: identity)."""
    return buffer_shuffle_array(n, buffer, rng).tolist()  # type: ignore[no-any-return]
