"""Fixtures for the TFRecord tests, made once per module.

- ``tfr_uneven``: the dataset tests' 95 uneven samples (``cls``, ``txt``, ``json``, ``bin``) packed as
  TFRecord shards with the same options as the tar fixture.
- ``foreign``: TFRecord files written by the ``tfrecord`` package (plain and gzip, with and without a
  ``__key__`` feature, in two folders), indexed with ``fastload index``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dataset.helpers import UNEVEN_OPTIONS, Packed, pack_files, uneven_files
from tfr_helpers import Foreign, write_foreign

from fastload.packing.indexing import build_index

FOREIGN_LAYOUT = {
    "train/a.tfrecord": (23, False),
    "train/b.tfrecord.gz": (17, True),
    "val/c.tfrecords.gz": (4, False),
    "val/d.tfrec": (31, True),
}


@pytest.fixture(scope="module")
def tfr_uneven(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    packed = pack_files(
        tmp_path_factory.mktemp("tfr-uneven"), uneven_files(), shard_format="tfrecord", **UNEVEN_OPTIONS
    )
    assert len(packed.counts) >= 5 and len(set(packed.counts)) >= 4, packed.counts  # uneven shards
    return packed


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> Foreign:
    made = write_foreign(tmp_path_factory.mktemp("tfr-foreign") / "ds", FOREIGN_LAYOUT)
    report = build_index(made.root)
    assert report.ok, report.summary()
    return made


@pytest.fixture
def foreign_copy(tmp_path: Path) -> Foreign:
    """A fresh foreign folder (not indexed) that a test may damage."""
    return write_foreign(tmp_path / "ds", FOREIGN_LAYOUT, seed=1)
