"""What a ``fastload cp`` copies and what it skips, and why: a pure decision per object.

An object is skipped only when its bytes are *shown* equal at both ends; anything that cannot be shown
equal is copied. The evidence, in the order it is tried:

1. no object at the destination: copy (``new``); a different size: copy (``size differs``);
2. S3 to S3: equal ETags (the same MD5, or the same multipart ETag: the same parts' MD5s); else, when
   either is a multipart ETag, the source ETag a server-side copy recorded in the destination's metadata
   (:data:`SOURCE_ETAG_META`, read with a HEAD: a copy in parts, or of a multipart object, may get an ETag
   of its own);
3. one end local, the other S3: the CRC32C the source's ``index.json`` records for a shard (a table:
   its CRC32C and ``content``, its trailing 4 bytes) against the local copy's, for S3 to local; else the
   S3 ETag against the local file's MD5 (a plain ETag) or its multipart ETag recomputed at the part sizes
   that give the ETag's part count (:func:`part_size_candidates`: fastload's, the AWS CLI's);
4. nothing to compare (an ETag that is not an MD5, e.g. under SSE-KMS, or of unknown part sizes): copy.

Size and modification time alone (``aws s3 sync``'s test) never skip: equal sizes with different bytes are
copied. :func:`decide` says what to check; the caller computes it (:class:`Check`) and :func:`verdict` says
copy or skip. :func:`index_checksums` reads the checksums out of an ``index.json`` (any version of it:
only ``shards[].name/bytes/checksum/table`` are read)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

SOURCE_ETAG_META = "fastload-source-etag"  # x-amz-meta-… a server-side copy of a multipart object records
_MD5 = re.compile(r"[0-9a-f]{32}")
_MULTIPART = re.compile(r"(?P<md5>[0-9a-f]{32})-(?P<parts>[1-9][0-9]{0,4})")


@dataclass(frozen=True)
class Found:
    """One object at one end: its size, and its ETag when it is in S3 (quotes stripped; "" for a file)."""

    size: int
    etag: str = ""


@dataclass(frozen=True)
class Known:
    """What a source's ``index.json`` records of an object: whole-file CRC32C (8 hex digits) and, for a
    sample table, ``content`` (its trailing u32, which tells it from another table of the same size)."""

    size: int
    crc32c: str
    content: str | None = None


CheckKind = Literal["crc32c", "md5", "multipart", "recorded-etag"]


@dataclass(frozen=True)
class Check:
    """A digest the caller computes of one end's object, and what it must equal for a skip.

    ``crc32c``: the local file's :func:`crc_digest` (with ``content``, a table's: its trailing u32 too);
    ``md5``: its MD5 in hex; ``multipart``: its multipart ETag at one of ``part_sizes`` (the caller returns
    the one that matched, or any); ``recorded-etag``: the destination object's :data:`SOURCE_ETAG_META`."""

    kind: CheckKind
    expected: str
    content: str | None = None
    part_sizes: tuple[int, ...] = ()
    local: Literal["src", "dst"] = "dst"  # which end's object the digest is of


@dataclass(frozen=True)
class Step:
    """One object's fate: ``copy`` True/False, or None while ``check`` is to be computed."""

    name: str
    copy: bool | None
    reason: str
    check: Check | None = None


def plain_md5(etag: str) -> bool:
    """True for an ETag that is the object's MD5 (a single PUT or CopyObject without SSE-KMS)."""
    return bool(_MD5.fullmatch(etag.strip('"').lower()))


def multipart_parts(etag: str) -> int | None:
    """The part count of a multipart ETag (``<md5 of the parts' MD5s>-N``), else None."""
    m = _MULTIPART.fullmatch(etag.strip('"').lower())
    return int(m["parts"]) if m else None


def part_size_candidates(size: int, parts: int, sizes: Iterable[int]) -> tuple[int, ...]:
    """The part sizes of ``sizes`` that cut ``size`` bytes into exactly ``parts`` parts (in order, once)."""
    out: list[int] = []
    for p in sizes:
        if p > 0 and -(-size // p) == parts and p not in out:
            out.append(p)
    return tuple(out)


def decide(
    name: str,
    src: Found,
    dst: Found | None,
    *,
    src_remote: bool,
    dst_remote: bool,
    known: Known | None = None,
    part_sizes: Sequence[int] = (),
) -> Step:
    """What to do with ``name`` (see the module docstring): copy, skip, or a :class:`Check` to compute."""
    if dst is None:
        return Step(name, True, "new")
    if dst.size != src.size:
        return Step(name, True, "size differs")
    if src_remote and dst_remote:
        s, d = src.etag.strip('"').lower(), dst.etag.strip('"').lower()
        if s and s == d and (plain_md5(s) or multipart_parts(s)):
            return Step(name, False, "same MD5 (ETag)" if plain_md5(s) else "same multipart ETag")
        if multipart_parts(s) or multipart_parts(d):  # a multipart source, or a copy made in parts
            return Step(name, None, "", Check("recorded-etag", s))
        return Step(name, True, "checksum differs (ETag)" if plain_md5(s) and plain_md5(d) else _NONE)
    local: Literal["src", "dst"] = "dst" if src_remote else "src"
    if src_remote and known is not None and known.size == src.size and (known.content or not _table(name)):
        expected = known.crc32c if known.content is None else f"{known.crc32c}/{known.content}"
        return Step(name, None, "", Check("crc32c", expected, known.content, local=local))
    etag = (src if src_remote else dst).etag.strip('"').lower()
    if plain_md5(etag):
        return Step(name, None, "", Check("md5", etag, local=local))
    parts = multipart_parts(etag)
    candidates = part_size_candidates(src.size, parts, part_sizes) if parts else ()
    if candidates:
        return Step(name, None, "", Check("multipart", etag, part_sizes=candidates, local=local))
    return Step(name, True, _NONE)


_NONE = "no checksum to compare (an ETag that is not an MD5, or of unknown part sizes)"


def verdict(step: Step, found: str | None) -> Step:
    """``step``'s fate once its check's digest is ``found`` (None: it could not be computed, e.g. the
    destination has no recorded source ETag): skip when it equals what was expected, else copy."""
    check = step.check
    if check is None:
        return step
    if found is not None and found == check.expected:
        return Step(step.name, False, _SAME[check.kind], check)
    if found is None:
        return Step(step.name, True, _NONE, check)
    return Step(step.name, True, f"checksum differs ({_WHAT[check.kind]})", check)


_SAME = {
    "crc32c": "same CRC32C as index.json",
    "md5": "same MD5 (ETag)",
    "multipart": "same multipart ETag",
    "recorded-etag": "same source ETag (recorded by an earlier server-side copy)",
}
_WHAT = {"crc32c": "CRC32C", "md5": "MD5", "multipart": "multipart ETag", "recorded-etag": "ETag"}


def _table(name: str) -> bool:
    return name.endswith(".fltable")


def crc_digest(crc: int, trailer: bytes | None) -> str:
    """The digest a ``crc32c`` check compares: the CRC32C in hex, and for a table (``trailer``: its last
    4 bytes) the content checksum they hold, ``"<crc>/<content>"``."""
    if trailer is None:
        return f"{crc:08x}"
    return f"{crc:08x}/{int.from_bytes(trailer, 'little'):08x}"


def index_checksums(raw: Mapping[str, Any], root: str) -> dict[str, Known]:
    """Name (``root`` + the index's relative name, ``/``-separated) -> what ``index.json`` records of each
    shard and sample table. ``root`` is the dataset folder's prefix ("" or ending in ``/``). Entries that do
    not parse are left out (they are then compared by ETag or copied)."""
    out: dict[str, Known] = {}
    shards = raw.get("shards")
    if not isinstance(shards, list):
        return out
    for shard in shards:
        if not isinstance(shard, dict):
            continue
        _add(out, root, shard.get("name"), shard.get("bytes"), shard.get("checksum"), None)
        table = shard.get("table")
        if isinstance(table, dict):
            content = table.get("content")
            _add(out, root, table.get("name"), table.get("bytes"), table.get("checksum"), content)
    return out


def _add(out: dict[str, Known], root: str, name: Any, size: Any, crc: Any, content: Any) -> None:
    if not (isinstance(name, str) and isinstance(size, int) and isinstance(crc, str)):
        return
    if content is not None and not isinstance(content, str):
        content = None
    out[root + name] = Known(size, crc.lower(), content.lower() if content else None)
