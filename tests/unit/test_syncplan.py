"""The pure sync decision of `fastload cp` (core.syncplan): what is copied, what skipped, and why."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from fastload.core.syncplan import (
    Check,
    Found,
    Known,
    Step,
    crc_digest,
    decide,
    index_checksums,
    multipart_parts,
    part_size_candidates,
    plain_md5,
    verdict,
)

MD5 = hashlib.md5(b"x").hexdigest()
OTHER = hashlib.md5(b"y").hexdigest()
MULTI = f"{MD5}-3"


def test_new_and_resized_objects_are_copied_without_a_check() -> None:
    assert decide("a", Found(5, MD5), None, src_remote=True, dst_remote=False) == Step("a", True, "new")
    step = decide("a", Found(5), Found(6, MD5), src_remote=False, dst_remote=True)
    assert step == Step("a", True, "size differs")


def test_s3_to_s3_compares_etags_and_asks_for_the_recorded_one_when_parts_differ() -> None:
    same = decide("a", Found(5, f'"{MD5}"'), Found(5, MD5), src_remote=True, dst_remote=True)
    assert same.copy is False and same.reason == "same MD5 (ETag)"
    assert decide("a", Found(5, MULTI), Found(5, MULTI), src_remote=True, dst_remote=True).copy is False
    differs = decide("a", Found(5, MD5), Found(5, OTHER), src_remote=True, dst_remote=True)
    assert differs.copy is True and differs.reason == "checksum differs (ETag)"
    for src, dst in ((MULTI, OTHER), (MD5, f"{OTHER}-2")):  # a multipart source, or a copy made in parts
        step = decide("a", Found(5, src), Found(5, dst), src_remote=True, dst_remote=True)
        assert step.copy is None and step.check == Check("recorded-etag", src.lower())
    nothing = decide("a", Found(5, "kms-etag"), Found(5, "kms-etag2"), src_remote=True, dst_remote=True)
    assert nothing.copy is True and nothing.reason.startswith("no checksum to compare")


def test_s3_to_local_checks_the_index_crc_first_and_a_table_by_its_content_too() -> None:
    known = Known(5, "0000abcd")
    step = decide("s.tar", Found(5, MD5), Found(5), src_remote=True, dst_remote=False, known=known)
    assert step.check == Check("crc32c", "0000abcd", local="dst")
    table = decide(
        "s.tar.fltable",
        Found(5, MD5),
        Found(5),
        src_remote=True,
        dst_remote=False,
        known=Known(5, "aa", "bb"),
    )
    assert table.check == Check("crc32c", "aa/bb", "bb", local="dst")
    # a table without content (an old index) proves nothing: the ETag decides
    old = decide(
        "s.tar.fltable", Found(5, MD5), Found(5), src_remote=True, dst_remote=False, known=Known(5, "aa")
    )
    assert old.check == Check("md5", MD5, local="dst")
    # local -> S3: the source's index says nothing of the destination's bytes
    up = decide("s.tar", Found(5), Found(5, MD5), src_remote=False, dst_remote=True, known=known)
    assert up.check == Check("md5", MD5, local="src")


def test_a_multipart_etag_is_recomputed_only_at_part_sizes_that_give_its_part_count() -> None:
    size = 12 << 20
    step = decide(
        "b", Found(size), Found(size, MULTI), src_remote=False, dst_remote=True, part_sizes=[5 << 20, 8 << 20]
    )
    assert step.check == Check("multipart", MULTI, part_sizes=(5 << 20,), local="src")
    none = decide(
        "b", Found(size), Found(size, f"{MD5}-7"), src_remote=False, dst_remote=True, part_sizes=[5 << 20]
    )
    assert none.copy is True and none.reason.startswith("no checksum")


def test_verdict_skips_only_on_an_equal_digest() -> None:
    step = decide("a", Found(5, MD5), Found(5), src_remote=True, dst_remote=False)
    assert verdict(step, MD5).copy is False and verdict(step, MD5).reason == "same MD5 (ETag)"
    assert verdict(step, OTHER).reason == "checksum differs (MD5)" and verdict(step, OTHER).copy
    assert verdict(step, None).copy is True


def test_etag_shapes() -> None:
    assert plain_md5(f'"{MD5.upper()}"') and not plain_md5(MULTI) and not plain_md5("abc")
    assert (
        multipart_parts(MULTI) == 3 and multipart_parts(MD5) is None and multipart_parts(f"{MD5}-0") is None
    )


@given(st.integers(1, 1 << 40), st.lists(st.integers(1, 1 << 30), max_size=6))
def test_candidates_cut_the_object_into_exactly_that_many_parts(size: int, sizes: list[int]) -> None:
    for parts in {-(-size // p) for p in sizes} | {1}:
        found = part_size_candidates(size, parts, sizes)
        assert all(-(-size // p) == parts for p in found) and len(set(found)) == len(found)
        assert set(found) == {p for p in sizes if -(-size // p) == parts}


def test_crc_digest_and_index_checksums() -> None:
    assert crc_digest(0xABC, None) == "00000abc"
    assert crc_digest(1, (0x01020304).to_bytes(4, "little")) == "00000001/01020304"
    raw = {
        "versions": [{"number": 1}],  # what an append adds: ignored
        "shards": [
            {
                "name": "s0.tar",
                "bytes": 10,
                "checksum": "AB",
                "table": {"name": "s0.tar.fltable", "bytes": 4, "checksum": "cd", "content": "EF"},
            },
            {"name": "bad", "bytes": "10", "checksum": "x"},
            "junk",
        ],
    }
    assert index_checksums(raw, "ds/") == {
        "ds/s0.tar": Known(10, "ab"),
        "ds/s0.tar.fltable": Known(4, "cd", "ef"),
    }
    assert index_checksums({"shards": None}, "") == {}
