"""The sample rules of fastload.ShardWriter (packing.encode), as pure functions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastload.core.keys import KeyRuleError, split_key, webdataset_would_split
from fastload.errors import SampleError
from fastload.packing.encode import KeyRule, check_key, encode_sample


@given(st.text(alphabet="ab./_-0", min_size=0, max_size=12))
def test_a_key_is_taken_exactly_when_both_key_rules_read_it_back_whole(key: str) -> None:
    try:
        check_key(key)
    except SampleError:
        taken = False
    else:
        taken = True
    try:
        ours = split_key(f"{key}.jpg")
    except KeyRuleError:
        ours = None
    whole = ours == (key, "jpg") and webdataset_would_split(f"{key}.jpg") == (key, "jpg")
    assert taken == (bool(key) and whole)


def test_members_are_sorted_by_field_and_encoded_by_type() -> None:
    assert encode_sample({"__key__": "k", "txt": "é", "cls": 3, "a": b"x"}) == (
        "k",
        (("a", b"x"), ("cls", b"3"), ("txt", "é".encode())),
    )


def test_key_rules() -> None:
    ordered = KeyRule("ordered")
    ordered.check("a")
    ordered.add("a")
    with pytest.raises(SampleError, match="does not come after"):
        ordered.check("a")
    seen = KeyRule("check")
    seen.add("b")
    seen.check("a")
    with pytest.raises(SampleError, match="written already"):
        seen.check("b")
    with pytest.raises(SampleError, match="choose"):
        KeyRule("sometimes")
