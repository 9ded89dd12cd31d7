"""``fastload/__init__.py`` only re-exports; its ``__all__`` is sorted and complete."""

from __future__ import annotations

import fastload


def test_all_is_sorted_and_unique() -> None:
    assert fastload.__all__ == sorted(set(fastload.__all__))


def test_every_exported_name_exists() -> None:
    missing = [name for name in fastload.__all__ if not hasattr(fastload, name)]
    assert not missing


def test_public_names_are_exported() -> None:
    """Every public attribute of the package that is not a submodule is listed in ``__all__``."""
    import types

    public = {
        name
        for name, value in vars(fastload).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public <= set(fastload.__all__)


def test_token_names_are_exported() -> None:
    """Token datasets: ``fastload.collate`` is the module; the torch-side class loads on first use."""
    import types

    import fastload.train.packed

    assert isinstance(fastload.collate, types.ModuleType) and "collate" in fastload.__all__
    assert callable(fastload.train.collate.pad) and callable(fastload.train.collate.blocks)
    assert fastload.PackedSequences is fastload.train.packed.PackedSequences
    assert callable(fastload.pack_tokens)
