"""``fastload.collate``: collate functions for ``DataLoader(collate_fn=...)`` (kept at this name for users;
the code lives in :mod:`fastload.train.collate`)."""

from fastload.train.collate import blocks, pad

__all__ = ["blocks", "pad"]
