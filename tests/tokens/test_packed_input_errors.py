"""PackedSequences names what it was given when it is not documents of token ids: a batch collated by the
DataLoader (collate_fn=list forgotten), negative ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch.utils.data

import fastload
from fastload.errors import ConfigError

from .conftest import TokenDataset


def test_a_collated_batch_says_to_pass_collate_fn_list(token_dataset: TokenDataset) -> None:
    ds = fastload.ShardDataset(token_dataset.root, decode=False)
    batches = torch.utils.data.DataLoader(ds, batch_size=4)  # collate_fn=list forgotten
    with pytest.raises(ConfigError, match=r"collated batch of 4 samples.*collate_fn=list"):
        next(iter(fastload.PackedSequences(batches, seq_len=64)))


def test_negative_ids_are_refused() -> None:
    docs = [np.arange(5), np.asarray([3, -2, 4])]
    with pytest.raises(ConfigError, match=r"negative token id \(-2 at position 1\)"):
        list(fastload.PackedSequences(docs, seq_len=8))
