"""Stable digests for ``fastload.optimize``'s resume check: of a function's code (:func:`fn_fingerprint`) and
of input values (:func:`value_digest`, folded in order by :class:`RunningDigest`).

Best effort, by design: a digest must be the same in every process and every run for the same function or
value (so no ``id``, no memory address, no ``hash()`` of a ``str``, which is salted per process), and should
change when the function's code or an input changes. What it cannot see:

- a function's digest covers its qualified name (not its module's name), bytecode, constants (nested
  functions and lambdas included), names, defaults and closure values, not the code of the functions it
  calls nor the globals it reads;
- a value of a type it does not know (not a plain Python value, path, NumPy array or buffer) counts by its
  type name, and its ``repr`` when that names no memory address (``<Foo object at 0x7f...>``).
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Mapping
from typing import Any

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_MAX_DEPTH = 20  # nesting followed in a value; deeper levels count by type name only


def value_digest(value: Any) -> bytes:
    """A 16-byte digest of ``value``, equal across processes and runs for equal values (see the module
    docstring for what counts)."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, value, 0)
    return h.digest()


def fn_fingerprint(fn: Any) -> str:
    """A hex digest of a callable's identity and code: its qualified name, and for a Python function
    its bytecode, constants, names, defaults and closure values (for a ``functools.partial``, its function
    and arguments; for an object with ``__call__``, its type and that method's code, and its attributes)."""
    h = hashlib.blake2b(digest_size=16)
    _feed_callable(h, fn, 0)
    return h.hexdigest()


class RunningDigest:
    """The digests of a sequence of values folded in order: ``hexdigest()`` after ``n`` calls of ``add``
    depends on those ``n`` values (and their order) only."""

    def __init__(self) -> None:
        self._state = b"\0" * 16
        self.count = 0

    def add(self, value: Any) -> None:
        self._state = hashlib.blake2b(self._state + value_digest(value), digest_size=16).digest()
        self.count += 1

    def hexdigest(self) -> str:
        return self._state.hex()


def _tag(h: Any, tag: bytes, payload: bytes = b"") -> None:
    h.update(tag + struct.pack("<Q", len(payload)) + payload)


def _feed(h: Any, value: Any, depth: int) -> None:
    if value is None or isinstance(value, bool):
        _tag(h, b"c", repr(value).encode())
    elif isinstance(value, int):
        _tag(h, b"i", str(value).encode())
    elif isinstance(value, float):
        _tag(h, b"f", struct.pack("<d", value))
    elif isinstance(value, complex):
        _tag(h, b"j", struct.pack("<dd", value.real, value.imag))
    elif isinstance(value, str):
        _tag(h, b"s", value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        _tag(h, b"b", bytes(value))
    elif depth >= _MAX_DEPTH:
        _tag(h, b"t", _type_name(value).encode())
    elif hasattr(value, "__fspath__"):
        _tag(h, b"p", str(value.__fspath__()).encode("utf-8", "surrogatepass"))
    elif isinstance(value, (list, tuple)):
        _tag(h, b"l" if isinstance(value, list) else b"u", str(len(value)).encode())
        for item in value:
            _feed(h, item, depth + 1)
    elif isinstance(value, (set, frozenset)):
        digests = sorted(value_digest(item) for item in value)
        _tag(h, b"e", b"".join(digests))
    elif isinstance(value, Mapping):
        _tag(h, b"d", str(len(value)).encode())
        for key, item in value.items():
            _feed(h, key, depth + 1)
            _feed(h, item, depth + 1)
    elif _is_array(value):
        _tag(h, b"a", f"{value.dtype.str}{tuple(value.shape)}".encode())
        _tag(h, b"b", value.tobytes())
    elif hasattr(value, "__code__") or (callable(value) and hasattr(value, "__qualname__")):
        _feed_callable(h, value, depth + 1)
    else:
        _tag(h, b"o", _type_name(value).encode())
        shown = _safe_repr(value)
        if shown is not None:
            _tag(h, b"r", shown.encode("utf-8", "surrogatepass"))


def _feed_callable(h: Any, fn: Any, depth: int) -> None:
    # (the qualified name, not the module's: one file is ``__main__`` when run, ``mod`` when imported, and
    # ``pkg.mod`` or ``mod`` depending on sys.path; its code says whether it is the same function)
    _tag(h, b"F", str(getattr(fn, "__qualname__", type(fn).__qualname__)).encode())
    if depth >= _MAX_DEPTH:
        return
    func = getattr(fn, "func", None)
    if func is not None and hasattr(fn, "args") and hasattr(fn, "keywords"):  # functools.partial
        _feed_callable(h, func, depth + 1)
        _feed(h, (tuple(fn.args), dict(fn.keywords)), depth + 1)
        return
    code = getattr(fn, "__code__", None)
    if code is None:  # an object with __call__: its method's code and its attributes
        call = type(fn).__dict__.get("__call__") or getattr(type(fn), "__call__", None)  # noqa: B004
        code = getattr(call, "__code__", None)
        attrs = getattr(fn, "__dict__", None)
        if isinstance(attrs, dict):
            _feed(h, attrs, depth + 1)
    else:
        _feed(h, getattr(fn, "__defaults__", None), depth + 1)
        _feed(h, getattr(fn, "__kwdefaults__", None), depth + 1)
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                _feed(h, cell.cell_contents, depth + 1)
            except ValueError:  # an empty cell
                _tag(h, b"z")
    if code is not None:
        _feed_code(h, code, depth + 1)


def _feed_code(h: Any, code: Any, depth: int) -> None:
    _tag(h, b"C", code.co_code)
    _tag(h, b"N", "\0".join(code.co_names).encode())
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            if depth < _MAX_DEPTH:
                _feed_code(h, const, depth + 1)
        else:
            _feed(h, const, depth + 1)


def _is_array(value: Any) -> bool:
    return all(hasattr(value, a) for a in ("dtype", "shape", "tobytes")) and hasattr(value.dtype, "str")


def _type_name(value: Any) -> str:
    t = type(value)
    return f"{t.__module__}.{t.__qualname__}"


def _safe_repr(value: Any) -> str | None:
    """``repr(value)``, or None when it fails or names a memory address (not stable across runs)."""
    try:
        shown = repr(value)
    except Exception:
        return None
    return None if _ADDRESS.search(shown) else shown


__all__ = ["RunningDigest", "fn_fingerprint", "value_digest"]
