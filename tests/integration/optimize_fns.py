"""Functions for the ``fastload.optimize`` tests, in a module of their own so that spawned workers, Ray
tasks and the CLI (``tests.integration.optimize_fns:make``) import them by name."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

INPUTS = 60


def make(n: int) -> Any:
    """Nothing for some inputs, else 1-3 samples of text, JSON and a NumPy array (so shards end inside an
    input's samples too)."""
    if n % 7 == 3:
        return None
    return [
        {
            "__key__": f"{n:05d}-{i}",
            "txt": f"input {n} part {i} " * (n % 5 + 1),
            "json": {"n": n, "i": i},
            "npy": np.arange(n % 4 + i, dtype=np.int32),
        }
        for i in range(n % 3 + 1)
    ]


def make_from_text(line: str) -> Any:
    """``make`` of an input given as text (a line of an --inputs file)."""
    return make(int(line))


def fail_on_env(n: int) -> Any:
    """``make``, but raise on input ``$OPTIMIZE_FAIL_AT`` (the same code whatever the variable: a resume
    without it is a resume of the same function)."""
    if os.environ.get("OPTIMIZE_FAIL_AT") == str(n):
        raise ValueError(f"refusing input {n}")
    return make(n)


def fail_on_fives(n: int) -> Any:
    if n % 5 == 0:
        raise ValueError(f"{n} is a multiple of five")
    return make(n)


def slow(n: int) -> Any:
    """``make``, slowly (so that a run can be killed in the middle)."""
    time.sleep(0.02)
    return make(n)


def burn(n: int) -> Any:
    """CPU-bound: a pure-Python loop, then one sample."""
    acc = 0
    for i in range(200_000):
        acc = (acc * 31 + i) % 1_000_003
    return {"__key__": f"{n:06d}", "txt": str(acc)}


def fives_or_interrupt(n: int) -> Any:
    """``fail_on_fives``, and a Ctrl-C (KeyboardInterrupt, which is not a failure of the input) on input
    ``$OPTIMIZE_FAIL_AT``."""
    if os.environ.get("OPTIMIZE_FAIL_AT") == str(n):
        raise KeyboardInterrupt
    return fail_on_fives(n)


def repeat_a_key(n: int) -> Any:
    """``fail_on_env``, but input 50's first sample repeats input 4's first key."""
    samples = fail_on_env(n)
    if n == 50:
        samples[0]["__key__"] = "00004-0"
    return samples
