"""PyTorch Lightning resumes a fastload.DataLoader mid-epoch exactly (docs/recipes.md): its checkpoint holds
the loader's state, and it counts the epoch's batches with ``len(loader)`` minus those it restored, so the
loader's length is the whole epoch's, as torch's and torchdata's loaders give it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import fastload

from .helpers import Packed, pack_files, small_files

L = pytest.importorskip("lightning", reason="Lightning is installed by .ci/run (recipes)")

BATCH = 4
STOP_AFTER = 3  # batches trained before the "kill"


class Stop(Exception):
    """The job dies after its checkpoint."""


class Model(L.LightningModule):  # type: ignore[misc, name-defined]
    def __init__(self, packed: Packed, seen: list[list[str]]) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
        self.packed, self.seen = packed, seen

    def train_dataloader(self) -> Any:
        ds = fastload.ShardDataset(str(self.packed.root), decode=False, seed=1, shuffle_buffer=8)
        return fastload.DataLoader(ds, batch_size=BATCH, collate_fn=list)

    def training_step(self, batch: list[dict[str, Any]], batch_idx: int) -> torch.Tensor:
        self.seen.append([s["__key__"] for s in batch])
        return (self.w**2).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class CheckpointThenDie(L.Callback):  # type: ignore[misc, name-defined]
    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == STOP_AFTER:
            trainer.save_checkpoint(self.path)
            raise Stop


def trainer(**kwargs: Any) -> Any:
    quiet = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}
    quiet["enable_checkpointing"] = False
    return L.Trainer(max_epochs=1, accelerator="cpu", devices=1, **quiet, **kwargs)


# (Lightning's own deprecation warnings, from its use of torch's pytree; not fastload's)
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")
@pytest.mark.filterwarnings("ignore:Your `IterableDataset` has `__len__` defined:UserWarning")
def test_lightning_resumes_mid_epoch_with_the_rest_of_the_epoch(tmp_path: Path) -> None:
    packed = pack_files(tmp_path / "data", small_files(n=32))
    whole: list[list[str]] = []
    trainer().fit(Model(packed, whole))
    assert len(whole) == 32 // BATCH

    before: list[list[str]] = []
    ckpt = tmp_path / "mid.ckpt"
    with pytest.raises(Stop):
        trainer(callbacks=[CheckpointThenDie(ckpt)]).fit(Model(packed, before))
    assert before == whole[:STOP_AFTER]

    after: list[list[str]] = []
    trainer().fit(Model(packed, after), ckpt_path=ckpt)
    assert after == whole[STOP_AFTER:], "the resumed epoch must read exactly the batches not trained on"
