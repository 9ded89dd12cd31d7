"""Samples given to :class:`fastload.ShardWriter` as the bytes of their members: key and field names checked,
each value encoded by its type (and, for images, by its field's extension), or by the user's ``encoders``.

=============================  ===========================================================
value                          bytes written
=============================  ===========================================================
bytes, bytearray, memoryview   as they are
str                            UTF-8
int, float (and numpy scalars) text: ``str(value)`` (``bool``: ``1`` / ``0``)
dict, list, tuple              JSON (``json.dumps``, UTF-8)
numpy.ndarray                  ``.npy`` (``numpy.save``)
PIL.Image.Image                encoded by the field's last extension: ``jpg``/``jpeg``, ``png``,
                               ``webp`` (and any other PIL writes)
=============================  ===========================================================

``encoders`` maps a field's last extension (``"pth"``, ``"cls"``) to a function of the value returning bytes;
it is asked first. Anything else is a :class:`~fastload.errors.SampleError` naming key and field.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fastload.core.keys import KeyRuleError, split_key, webdataset_would_split
from fastload.errors import SampleError

KEY = "__key__"
Encoders = Mapping[str, Callable[[Any], bytes]]
Encoded = tuple[str, tuple[tuple[str, bytes], ...]]  # (key, ((field, bytes), ...) sorted by field)

_FIELD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*(\.[A-Za-z0-9][A-Za-z0-9_\-]*)*$")
_PIL_FORMATS: dict[str, str] = {}  # ".jpg" -> "JPEG", filled on the first image


def check_key(key: object) -> str:
    """``key`` if it can be a sample's key (a non-empty string that WebDataset's and fastload's key rules
    both read back whole: no ``.`` in its last ``/`` part); else :class:`SampleError`."""
    if not isinstance(key, str) or not key:
        raise SampleError(
            f"a sample needs a '__key__' that is a non-empty string, got {key!r}",
            key=None if not isinstance(key, str) else key,
        )
    name = f"{key}.x"
    try:
        ours = split_key(name)
    except KeyRuleError as exc:
        raise SampleError(f"key {key!r} cannot be a sample key: {exc}", key=key) from None
    if ours != (key, "x") or webdataset_would_split(name) != (key, "x"):
        raise SampleError(
            f"key {key!r} has a '.' (or an empty part): WebDataset would split the key there; use "
            f"e.g. {key.replace('.', '_')!r}",
            key=key,
        )
    if any(c in key for c in "\0\n\r"):
        raise SampleError(f"key {key!r} holds a control character", key=key)
    return key


def check_field(key: str, field: object) -> str:
    """``field`` if it is a valid member extension (``jpg``, ``seg.png``, ``json``); else
    :class:`SampleError` naming the key."""
    if not isinstance(field, str) or not _FIELD.match(field):
        raise SampleError(
            f"sample {key!r}: field {field!r} is not a valid extension (letters, digits, '_' and '-', parts "
            "joined by '.', e.g. 'jpg', 'seg.png'; names starting with '_' are reserved)",
            key=key,
            field=field if isinstance(field, str) else None,
        )
    return field


def encode_value(key: str, field: str, value: Any, encoders: Encoders | None = None) -> bytes:
    """The bytes of one member (the module docstring's table)."""
    ext = field.rsplit(".", 1)[-1].lower()
    if encoders:
        fn = encoders.get(ext)
        if fn is not None:
            out = fn(value)
            if not isinstance(out, (bytes, bytearray, memoryview)):
                raise SampleError(
                    f"sample {key!r} field {field!r}: encoders[{ext!r}] returned {type(out).__name__}, "
                    "not bytes",
                    key=key,
                    field=field,
                )
            return out if type(out) is bytes else bytes(out)
    if type(value) is bytes:
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, (int, float)):
        return str(value).encode()
    if isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise SampleError(
                f"sample {key!r} field {field!r}: not JSON-serialisable ({exc}); pass encoders="
                f"{{{ext!r}: fn}} or encode it to bytes",
                key=key,
                field=field,
            ) from None
    kind = type(value)
    module = kind.__module__.split(".", 1)[0]
    if module == "numpy":
        return _numpy(key, field, value)
    if module == "PIL" and hasattr(value, "save"):
        return _image(key, field, ext, value)
    raise SampleError(
        f"sample {key!r} field {field!r}: cannot encode a {kind.__module__}.{kind.__qualname__}; give bytes, "
        f"str, int, float, dict/list, a numpy array or a PIL image, or pass encoders={{{ext!r}: fn}}",
        key=key,
        field=field,
    )


def _numpy(key: str, field: str, value: Any) -> bytes:
    import numpy as np

    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise SampleError(
                f"sample {key!r} field {field!r}: a numpy array of Python objects cannot be saved as .npy "
                "(it would need pickle); give a numeric array",
                key=key,
                field=field,
            )
        buf = io.BytesIO()
        np.lib.format.write_array(buf, value, allow_pickle=False)
        return buf.getvalue()
    if isinstance(value, np.generic):
        return encode_value(key, field, value.item())
    raise SampleError(f"sample {key!r} field {field!r}: cannot encode {type(value)!r}", key=key, field=field)


def _image(key: str, field: str, ext: str, value: Any) -> bytes:
    if not _PIL_FORMATS:
        from PIL import Image

        _PIL_FORMATS.update(Image.registered_extensions())
    fmt = _PIL_FORMATS.get(f".{ext}")
    if fmt is None:
        raise SampleError(
            f"sample {key!r} field {field!r}: a PIL image needs a field named by its image format "
            "('jpg', 'png', 'webp', ...) to be encoded",
            key=key,
            field=field,
        )
    image = value
    if fmt == "JPEG" and image.mode not in ("RGB", "L", "CMYK"):
        image = image.convert("RGB")  # (JPEG has no alpha)
    buf = io.BytesIO()
    try:
        image.save(buf, format=fmt)
    except (OSError, ValueError, KeyError) as exc:
        raise SampleError(
            f"sample {key!r} field {field!r}: PIL could not save the image as {fmt} ({exc})",
            key=key,
            field=field,
        ) from None
    return buf.getvalue()


def encode_sample(sample: Mapping[str, Any], encoders: Encoders | None = None) -> Encoded:
    """``(key, members)`` of ``sample`` (a dict with ``__key__``), members sorted by field; raises
    :class:`SampleError` before anything is written."""
    if not isinstance(sample, Mapping):
        raise SampleError(f"a sample is a dict with '__key__' and fields, got {type(sample).__name__}")
    key = check_key(sample.get(KEY))
    members: list[tuple[str, bytes]] = []
    for field, value in sample.items():
        if field == KEY:
            continue
        check_field(key, field)
        if value is None:
            raise SampleError(
                f"sample {key!r} field {field!r} is None; leave the field out of the sample instead",
                key=key,
                field=field,
            )
        members.append((field, encode_value(key, field, value, encoders)))
    if not members:
        raise SampleError(f"sample {key!r} has no fields besides '__key__'", key=key)
    members.sort()
    return key, tuple(members)


class KeyRule:
    """Keys a writer has taken, by rule: ``"check"`` refuses a key given twice (a set of every key),
    ``"ordered"`` one not greater than the key before (no memory), ``"off"`` nothing."""

    def __init__(self, rule: str) -> None:
        if rule not in ("check", "ordered", "off"):
            raise SampleError(f"keys={rule!r}; choose 'check', 'ordered' or 'off'")
        self.rule = rule
        self._seen: set[str] = set()
        self._last: str | None = None

    def check(self, key: str) -> None:
        """Raise :class:`SampleError` if ``key`` may not come next."""
        if self.rule == "check" and key in self._seen:
            raise SampleError(
                f"key {key!r} was written already (by this writer, or it is in the dataset appended to or "
                "the shards a resumed run kept); keys must be unique in a dataset",
                key=key,
            )
        if self.rule == "ordered" and self._last is not None and key <= self._last:
            raise SampleError(
                f"key {key!r} does not come after {self._last!r}; with keys='ordered' each key must be "
                "greater than the one before (keys='check' allows any order)",
                key=key,
            )

    def seen(self, keys: Iterable[str]) -> None:
        """``keys`` were taken before (a dataset appended to, a run resumed): ``"check"`` holds them all,
        ``"ordered"`` the greatest."""
        for key in keys:
            if self.rule == "check":
                self._seen.add(key)
            if self._last is None or key > self._last:
                self._last = key

    def add(self, key: str) -> None:
        """``key`` was taken."""
        if self.rule == "check":
            self._seen.add(key)
        self._last = key
