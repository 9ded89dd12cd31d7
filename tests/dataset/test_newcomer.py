"""Traps a newcomer meets in the first hour (issue 19): names that dir() must show, a device that does not
exist, the version."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import fastload
from fastload.errors import ConfigError

from .helpers import Packed, child_env


def test_dir_lists_the_lazily_loaded_names() -> None:
    names = dir(fastload)
    for name in ("ShardDataset", "DataLoader", "loader", "Loader", "PackedSequences", "pack", "open"):
        assert name in names, name


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_asking_for_cuda_without_cuda_is_a_clear_config_error(small: Packed) -> None:
    with pytest.raises(ConfigError, match="no CUDA GPU") as info:
        fastload.loader(small.root, batch_size=2, num_workers=0, device="cuda")
    assert "device=None" in str(info.value)
    with pytest.raises(ConfigError, match="not a torch device"):
        fastload.loader(small.root, batch_size=2, num_workers=0, device="gpu")


def test_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fastload", "--version"], capture_output=True, text=True, env=child_env()
    )
    assert out.returncode == 0 and out.stdout.strip() == f"fastload {fastload.__version__}"
