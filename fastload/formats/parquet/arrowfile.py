"""Opening Parquet with pyarrow safely: fastload reads every Parquet file through :func:`open_parquet`.

pyarrow's ``ParquetFile`` pre-buffers by default (``pre_buffer=True``): it reads column chunks with
``ReadAsync`` on its I/O thread pool. On a *Python* file object (a local file opened by fastload, the S3
reader), each such read returns a buffer that wraps a Python ``bytes``, and the pool thread that completes
the read may drop the last reference to it later, after the interpreter began to exit: freeing it needs the
GIL, Python ends a thread that asks for the GIL during finalisation with ``pthread_exit``, and the forced
unwind through arrow's C++ frames aborts the process ("terminate called without an active exception", exit
134, after all the work was done: seen in about 0.4% of ``fastload verify`` runs on Parquet, core dump
traced to ``arrow::py::PyBuffer::~PyBuffer`` on an I/O pool thread). Reading synchronously in the calling
thread (``pre_buffer=False``) leaves no pyarrow thread holding a Python object, so nothing of the kind can
happen; fastload reads whole row groups or column chunks it has already fetched, so pre-buffering bought
nothing here.
"""

from __future__ import annotations

from typing import IO, Any


def open_parquet(source: str | IO[bytes] | Any, **options: Any) -> Any:
    """``pyarrow.parquet.ParquetFile(source, pre_buffer=False, **options)`` (see the module docstring)."""
    import pyarrow.parquet as pq

    options.setdefault("pre_buffer", False)
    if options["pre_buffer"]:
        raise ValueError(
            "pre_buffer=True reads through pyarrow's I/O threads; see fastload.formats.parquet.arrowfile"
        )
    return pq.ParquetFile(source, **options)
