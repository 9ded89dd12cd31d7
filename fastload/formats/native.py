"""The optional C readers and writer (``fastload._native``, built from ``fastload/_native.c`` at install time
when a C compiler is available): which ones this process uses.

Each is an accelerator behind its format's one read function (tar:
:func:`fastload.formats.tar.reader.read_run`), which hands the rest of a run to the Python parser where the
C reader stops. :func:`accelerate_shuffle` gives :mod:`fastload.core.shuffle` the C loop of the sample
shuffle (a pure function that ``core`` may not import itself). ``tar_fill`` is the tar shard writer's
loop over local files (:func:`fastload.formats.tar.writer.write_tar_shard`: the same bytes and skips as
its Python loop). ``FASTLOAD_NATIVE=0`` in the environment turns them off (the Python readers and writer
are then used everywhere; both give the same samples and errors)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from fastload.core import shuffle

Run = Callable[..., tuple[list[dict[str, Any]], int, bool]]
Fill = Callable[..., tuple[int, int, int, int, list[tuple[int, ...]]]]
Crc = Callable[[Any, int], int]


def _load() -> tuple[Run | None, Run | None, Fill | None, Crc | None]:
    if os.environ.get("FASTLOAD_NATIVE", "1") == "0":
        return None, None, None, None
    try:
        from fastload import _native
    except ImportError:  # not built (no C compiler at install time): the Python reader is used
        return None, None, None, None
    # (TFRecord records, and the tar writer's CRC32C, only with a CRC32C instruction here: the crc32c
    # package is faster than a table)
    hardware = bool(_native.crc32c_hardware)
    return (
        _native.layout_run,
        _native.tfrecord_run if hardware else None,
        getattr(_native, "tar_fill", None) if hardware else None,
        _native.crc32c if hardware else None,
    )


# fastload._native.layout_run, tfrecord_run, tar_fill and crc32c: see fastload/_native.c
layout_run, tfrecord_run, tar_fill, crc32c = _load()


def accelerate_shuffle() -> bool:
    """Give :mod:`fastload.core.shuffle` the C loop of the sample shuffle, where it is built (and not
    turned off); it is used once it passes its checks at its first use. Called by what plans sample orders
    (``ShardDataset``), not at import. Returns whether the C loop was given."""
    if layout_run is None:  # not built, or FASTLOAD_NATIVE=0
        return False
    from fastload import _native

    if not shuffle.accelerated(_native.buffer_shuffle):
        shuffle.use_native(_native.buffer_shuffle)
    return True


def in_use(shard_format: str = "tar") -> str:
    """``"C"`` or ``"Python"``: which reader reads local shards of ``shard_format`` (``"tar"``: those with a
    member layout; ``"tfrecord"``)."""
    if shard_format not in ("tar", "tfrecord"):
        raise ValueError(f"shard_format must be 'tar' or 'tfrecord', not {shard_format!r}")
    run = layout_run if shard_format == "tar" else tfrecord_run
    return "C" if run is not None else "Python"
