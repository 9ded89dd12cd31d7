"""URLs of stores read over plain HTTP(S), as users write them: brace patterns of shard URLs
(``https://host/shard-{000000..000099}.tar``, as webdataset and the Hub's users pass them) expanded to a
list, ``hf://`` URLs of the Hugging Face Hub mapped to the Hub's https routes, ``gs://`` URLs split into
bucket and name. Pure: the endpoint is
passed in."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

from fastload.errors import ConfigError

WEB_SCHEMES = ("http://", "https://", "hf://", "gs://", "az://")  # gs://, az://: their REST APIs over HTTPS
MAX_EXPANDED = 1_000_000
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.(\d+))?$")


def is_web(url: str) -> bool:
    """Whether ``url`` is read over plain HTTP(S) by fastload's own transport: ``http://``, ``https://``,
    ``hf://`` or ``gs://`` (Google Cloud Storage's JSON API)."""
    return url.startswith(WEB_SCHEMES)


def has_braces(text: str) -> bool:
    """Whether ``text`` holds a brace pattern (``{a,b}`` or ``{000..009}``)."""
    return _BRACE.search(text) is not None


def expand_braces(text: str) -> list[str]:
    """Every string ``text``'s brace groups spell, in order: ``{000..003}`` (a numeric range, zero-padded
    to the wider bound when either bound is written with a leading zero; ``{0..10..2}`` with a step),
    ``{a,b,c}`` (alternatives), several groups as their product (the last one varying fastest), as bash and
    webdataset's ``braceexpand`` expand them. :class:`ConfigError` for an empty group or over
    ``MAX_EXPANDED`` strings."""
    match = _BRACE.search(text)
    if match is None:
        return [text]
    body, head, tail = match.group(1), text[: match.start()], text[match.end() :]
    choices = _choices(body, text)
    rest = expand_braces(tail)
    if len(choices) * len(rest) > MAX_EXPANDED:
        raise ConfigError(f"{text!r} expands to over {MAX_EXPANDED:,} URLs; give fewer shards")
    return [head + c + r for c in choices for r in rest]


def _choices(body: str, text: str) -> list[str]:
    m = _RANGE.match(body)
    if m is not None:
        lo, hi, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
        if step < 1:
            raise ConfigError(f"{text!r}: the step of {{{body}}} must be >= 1")
        padded = any(len(s.lstrip("-")) > 1 and s.lstrip("-").startswith("0") for s in m.group(1, 2))
        width = max(len(m.group(1)), len(m.group(2))) if padded else 0
        if abs(hi - lo) // step + 1 > MAX_EXPANDED:
            raise ConfigError(f"{text!r} expands to over {MAX_EXPANDED:,} URLs; give fewer shards")
        numbers = range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step)
        return [str(n).zfill(width) for n in numbers]
    if "," in body:
        return body.split(",")
    raise ConfigError(
        f"{text!r}: {{{body}}} is not a brace pattern; write {{000000..000099}} for a range or {{a,b}} for "
        "alternatives"
    )


@dataclass(frozen=True)
class HubPath:
    """An ``hf://`` URL's parts: ``repo_type`` (datasets, models, spaces), ``repo`` (``ORG/NAME``),
    ``revision`` (``main`` unless ``@REVISION`` follows the name) and ``path`` within the repository."""

    repo_type: str
    repo: str
    revision: str
    path: str

    def resolve_url(self, endpoint: str) -> str:
        """The Hub's URL of the file at ``path`` (``/resolve/``: the bytes, after a redirect to its CDN)."""
        return f"{self._base(endpoint)}/resolve/{quote(self.revision, safe='')}/{quote(self.path)}"

    def tree_url(self, endpoint: str) -> str:
        """The Hub API's listing of the folder at ``path``, recursive."""
        api = f"{endpoint.rstrip('/')}/api/{self.repo_type}/{self.repo}/tree/{quote(self.revision, safe='')}"
        return f"{api}/{quote(self.path)}?recursive=true" if self.path else f"{api}?recursive=true"

    def child(self, path: str) -> str:
        """The ``hf://`` URL of ``path`` (relative to the repository's root) in the same revision."""
        rev = "" if self.revision == "main" else f"@{self.revision}"
        return f"hf://{self.repo_type}/{self.repo}{rev}/{path}"

    def _base(self, endpoint: str) -> str:
        prefix = "" if self.repo_type == "models" else f"/{self.repo_type}"
        return f"{endpoint.rstrip('/')}{prefix}/{self.repo}"


def parse_hf_url(url: str) -> HubPath:
    """The parts of ``hf://datasets/ORG/NAME[@REVISION]/PATH`` (also ``models``, ``spaces``).
    :class:`ConfigError` for a URL not of that form."""
    if not url.startswith("hf://"):
        raise ConfigError(f"{url!r} is not an hf:// URL")
    parts = url[len("hf://") :].split("/")
    if len(parts) < 3 or parts[0] not in ("datasets", "models", "spaces") or not parts[1] or not parts[2]:
        raise ConfigError(
            f"{url!r}: write hf://datasets/ORG/NAME/PATH (or hf://datasets/ORG/NAME@REVISION/PATH)"
        )
    name, _, revision = parts[2].partition("@")
    return HubPath(parts[0], f"{parts[1]}/{name}", revision or "main", "/".join(parts[3:]).strip("/"))


def parse_gs_url(url: str) -> tuple[str, str]:
    """``(bucket, object name)`` of ``gs://BUCKET/NAME`` (the name may be empty: the bucket's root, or end
    in ``/``: a folder). :class:`ConfigError` for a URL without a bucket."""
    if not url.startswith("gs://"):
        raise ConfigError(f"{url!r} is not a gs:// URL")
    bucket, _, name = url[len("gs://") :].partition("/")
    if not bucket:
        raise ConfigError(f"{url!r}: write gs://BUCKET/PATH")
    return bucket, name


def lists_folders(url: str) -> bool:
    """Whether the web store of ``url`` can list a folder: the Hub (its tree API) and GCS do, a plain web
    server does not."""
    return url.startswith(("hf://", "gs://", "az://"))
