"""The tokenizer of ``fastload pack-tokens``: what ``--tokenizer SPEC`` names, as a callable text -> ids,
with a batch form where the tokenizer has one (Hugging Face ``tokenizers`` encodes a batch on all cores).

SPEC is one of: ``module:function`` (a module importable from the working directory or ``sys.path``;
the function may be dotted, ``pkg.mod:tok.encode``), ``path/to/file.py:function``, a ``tokenizer.json``
file of the ``tokenizers`` package, or ``hf:NAME`` (a tokenizer on the Hugging Face Hub, through
``tokenizers.Tokenizer.from_pretrained``: ``HF_ENDPOINT`` and the Hub cache apply).

:func:`load_callable` resolves the first two forms for any hook (``fastload optimize``'s function too)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from fastload.errors import ConfigError

Tokenizer = Callable[[str], Any]


class BatchTokenizer:
    """A ``tokenizers.Tokenizer`` as a hook: ``tok(text)`` gives one document's ids, ``tok.batch(texts)``
    many at once (in parallel, in Rust, outside the GIL). Special tokens are not added (pass
    ``bos_id``/``eos_id`` to ``pack_tokens`` for those)."""

    def __init__(self, tokenizer: Any, name: str) -> None:
        self.tokenizer, self.name = tokenizer, name
        self.__module__, self.__qualname__ = "tokenizers", name  # the resume fingerprint names it

    def __call__(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def batch(self, texts: Sequence[str]) -> list[list[int]]:
        encoded = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [list(e.ids) for e in encoded]

    def __repr__(self) -> str:
        return f"BatchTokenizer({self.name!r})"


def load_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer ``spec`` names (see the module docstring), refused with what to write if not found."""
    if spec.startswith("hf:"):
        return _hub_tokenizer(spec, spec[3:])
    if ":" not in spec and spec.endswith(".json"):
        return _json_tokenizer(spec)
    return load_callable(spec, what="tokenizer", forms="a tokenizer.json file or hf:NAME")


def load_callable(spec: str, *, what: str = "function", forms: str = "") -> Callable[..., Any]:
    """The callable ``spec`` names: ``module:function`` (imported as from the working directory; the
    function may be dotted, ``mod:obj.method``) or ``path/to/file.py:function``; else a
    :class:`ConfigError` saying what to write (``what`` names the hook in messages, ``forms`` lists the
    other forms its option takes)."""
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr:
        other = f", {forms}" if forms else ""
        raise ConfigError(
            f"{what} {spec!r}: write module:function (e.g. mymod:encode), path/to/file.py:function{other}"
        )
    obj: Any = _from_file(spec, where, what) if where.endswith(".py") else _import(spec, where, what)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what} {spec!r}: {where} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{what} {spec!r} is not callable")
    return obj  # type: ignore[no-any-return]


def _import(spec: str, module_name: str, what: str) -> Any:
    """``module_name`` imported as Python would from the working directory (the ``fastload`` command's
    ``sys.path`` holds its own folder, not the working directory, unlike ``python -m``)."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{what} {spec!r}: cannot import {module_name!r} ({exc}); run from the folder holding "
            f"{module_name.split('.')[0]}.py, or write path/to/file.py:function"
        ) from None
    finally:
        if added:
            sys.path.remove(cwd)


def _from_file(spec: str, path: str, what: str) -> Any:
    if not os.path.isfile(path):
        raise ConfigError(f"{what} {spec!r}: no file {path}")
    name = f"_fastload_{what}_" + os.path.splitext(os.path.basename(path))[0]
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ConfigError(f"{what} {spec!r}: {path} cannot be loaded as a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # (so that its functions pickle by reference in this process)
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(f"{what} {spec!r}: running {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def _tokenizers_module(spec: str) -> Any:
    try:
        return importlib.import_module("tokenizers")
    except ImportError:
        raise ConfigError(
            f"tokenizer {spec!r} needs the Hugging Face tokenizers package: pip install 'fastload[tokens]'"
        ) from None


def _json_tokenizer(path: str) -> BatchTokenizer:
    tokenizers = _tokenizers_module(path)
    if not os.path.isfile(path):
        raise ConfigError(f"tokenizer {path!r}: no such tokenizer.json file")
    try:
        return BatchTokenizer(tokenizers.Tokenizer.from_file(path), os.path.basename(path))
    except Exception as exc:
        raise ConfigError(f"tokenizer {path!r} is not a tokenizers JSON file ({exc})") from None


def _hub_tokenizer(spec: str, name: str) -> BatchTokenizer:
    tokenizers = _tokenizers_module(spec)
    if not name:
        raise ConfigError(f"tokenizer {spec!r}: write hf:NAME, e.g. hf:gpt2")
    try:
        return BatchTokenizer(tokenizers.Tokenizer.from_pretrained(name), spec)
    except Exception as exc:
        raise ConfigError(
            f"tokenizer {spec!r}: cannot load {name!r} from the Hugging Face Hub ({exc}); check the name, "
            "HF_ENDPOINT and HF_TOKEN, or pass a local tokenizer.json"
        ) from None


__all__ = ["BatchTokenizer", "Tokenizer", "load_callable", "load_tokenizer"]
