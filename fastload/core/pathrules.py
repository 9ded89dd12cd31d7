"""Which listed paths a pack leaves out before grouping: hidden files and folders (a name starting with
``.``: ``.DS_Store``, ``.git/``) unless asked for, and paths matching ``--exclude`` globs.

A glob without ``/`` is matched against the name at any depth (``*.tmp``, ``__pycache__``); one with ``/``
against the whole path relative to the source (``raw/*.wav``); one ending in ``/`` matches folders only
(``cache/``). ``*`` and ``?`` match ``/`` too (:func:`fnmatch.fnmatchcase`, case-sensitive). A folder left
out is not listed at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

HIDDEN = "hidden"
EXCLUDED = "excluded"


@dataclass(frozen=True, kw_only=True)
class PathRules:
    """What a listing leaves out: hidden names unless ``include_hidden``, and the ``exclude`` globs."""

    include_hidden: bool = False
    exclude: tuple[str, ...] = ()

    def left_out(self, relpath: str, *, folder: bool) -> str | None:
        """:data:`HIDDEN`, :data:`EXCLUDED` or None for a ``/``-separated ``relpath`` (no trailing ``/``)."""
        name = relpath.rsplit("/", 1)[-1]
        if not self.include_hidden and name.startswith("."):
            return HIDDEN
        for pattern in self.exclude:
            if pattern.endswith("/"):
                if not folder:
                    continue
                pattern = pattern.rstrip("/")
            if fnmatchcase(relpath if "/" in pattern else name, pattern):
                return EXCLUDED
        return None

    def left_out_key(self, relpath: str) -> str | None:
        """The same for an object key's path (S3: no folders are listed, so each of its folders is tried)."""
        parts = relpath.split("/")
        for i in range(1, len(parts)):
            why = self.left_out("/".join(parts[:i]), folder=True)
            if why is not None:
                return why
        return self.left_out(relpath, folder=False)
