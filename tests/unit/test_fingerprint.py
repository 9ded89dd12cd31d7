"""``core.fingerprint``: digests that are stable across processes and change with what they cover."""

from __future__ import annotations

import functools
import pathlib
import subprocess
import sys

import numpy as np

from fastload.core.fingerprint import RunningDigest, fn_fingerprint, value_digest


def double(x: int) -> int:
    return 2 * x


def triple(x: int) -> int:
    return 3 * x


class Scale:
    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, x: int) -> int:
        return self.k * x


def test_values_digest_by_content_not_identity() -> None:
    assert value_digest("a/b.jpg") == value_digest("a/b.jpg")
    assert value_digest("a/b.jpg") != value_digest("a/c.jpg")
    assert value_digest(pathlib.Path("a/b.jpg")) == value_digest(pathlib.PurePosixPath("a/b.jpg"))
    assert value_digest(1) != value_digest("1") != value_digest(1.0)
    assert value_digest({"a": 1, "b": [1, 2]}) == value_digest({"a": 1, "b": [1, 2]})
    assert value_digest({"a": 1}) != value_digest({"a": 2})
    assert value_digest(np.arange(4)) == value_digest(np.arange(4))
    assert value_digest(np.arange(4)) != value_digest(np.arange(4).astype(np.int8))
    assert value_digest([1, 2]) != value_digest((1, 2))


def test_objects_with_addresses_in_their_repr_count_by_type() -> None:
    a, b = object(), object()
    assert value_digest(a) == value_digest(b)  # "<object object at 0x...>": the address is left out


def test_value_digest_is_the_same_in_another_process() -> None:
    """``hash(str)`` is salted per process; the digest must not be."""
    code = "from fastload.core.fingerprint import value_digest; print(value_digest({'k': ('x', 1.5)}).hex())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == value_digest({"k": ("x", 1.5)}).hex()


def test_running_digest_depends_on_values_and_order() -> None:
    def run(values: list[object]) -> str:
        d = RunningDigest()
        for v in values:
            d.add(v)
        return d.hexdigest()

    assert run(["a", "b"]) == run(["a", "b"])
    assert run(["a", "b"]) != run(["b", "a"])
    assert run([]) != run([""])


def test_fn_fingerprint_follows_code_constants_closures_and_partials() -> None:
    assert fn_fingerprint(double) == fn_fingerprint(double)
    assert fn_fingerprint(double) != fn_fingerprint(triple)
    assert fn_fingerprint(lambda x: x + 1) != fn_fingerprint(lambda x: x + 2)

    def make(k: int):  # type: ignore[no-untyped-def]
        return lambda x: k * x

    assert fn_fingerprint(make(2)) == fn_fingerprint(make(2))
    assert fn_fingerprint(make(2)) != fn_fingerprint(make(3))
    assert fn_fingerprint(functools.partial(double)) != fn_fingerprint(functools.partial(triple))
    assert fn_fingerprint(Scale(2)) == fn_fingerprint(Scale(2))
    assert fn_fingerprint(Scale(2)) != fn_fingerprint(Scale(3))


def test_recursive_closures_terminate() -> None:
    def outer():  # type: ignore[no-untyped-def]
        def f(n: int) -> int:
            return 1 if n < 1 else f(n - 1)

        return f

    assert fn_fingerprint(outer()) == fn_fingerprint(outer())
