"""The ShardDataset contract tests of tests/dataset (exactly once per epoch across ranks and DataLoader worker
processes; exact resume), run over TFRecord shards: packed ones, and foreign plain + gzip ones indexed by
`fastload index`."""

from __future__ import annotations

import dataset.test_exactly_once as exactly_once
import dataset.test_resume as resume
import pytest
from dataset.conftest import WORKER_COUNT_WARNING
from dataset.helpers import Packed, make_loader
from tfr_helpers import Foreign, check_sample

pytestmark = pytest.mark.filterwarnings(WORKER_COUNT_WARNING)


@pytest.mark.parametrize(("world", "num_workers"), [(2, 2), (3, 0)])
def test_packed_every_sample_once(tfr_uneven: Packed, world: int, num_workers: int) -> None:
    exactly_once.test_split_every_sample_once(tfr_uneven, world=world, num_workers=num_workers)


def test_packed_drop_policy(tfr_uneven: Packed) -> None:
    exactly_once.test_drop_equal_counts_and_reports_the_rest(tfr_uneven, world=2, num_workers=0)


def test_packed_resume_at_every_stop_point(tfr_uneven: Packed) -> None:
    resume.test_resume_at_every_stop_point(tfr_uneven)


def test_packed_resume_with_another_worker_count(tfr_uneven: Packed) -> None:
    resume.test_resume_with_another_worker_count(tfr_uneven, workers_before=2, workers_after=0)


def test_foreign_gzip_every_sample_once_with_workers(foreign: Foreign) -> None:
    exactly_once.test_split_every_sample_once(foreign.packed(), world=2, num_workers=2)


def test_foreign_gzip_resume_with_workers(foreign: Foreign) -> None:
    packed = foreign.packed()
    full = resume.uninterrupted(packed, batch_size=5)
    for k in (1, 7):
        before, state = resume.stop_after(packed, k, batch_size=5, num_workers=2)
        assert before + resume.resume(packed, state, batch_size=5, num_workers=1) == full


def test_foreign_values_through_worker_processes(foreign: Foreign) -> None:
    _, dl = make_loader(foreign.packed(), batch_size=6, num_workers=2, loader={"collate_fn": list}, seed=5)
    samples = [s for batch in dl for s in batch]
    assert sorted(s["__key__"] for s in samples) == sorted(foreign.expected)
    for s in samples:
        check_sample(s, foreign.expected)
