"""The paths a pack leaves out (core.pathrules), and the field extensions decoders know (core.keys)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fastload.core.keys import DECODED_EXTENSIONS
from fastload.core.pathrules import EXCLUDED, HIDDEN, PathRules


def test_path_rules():
    rules = PathRules(exclude=("*.tmp", "raw/*.wav", "cache/"))
    assert rules.left_out(".git", folder=True) == HIDDEN
    assert rules.left_out("a/.DS_Store", folder=False) == HIDDEN
    assert rules.left_out("a/b.tmp", folder=False) == EXCLUDED
    assert rules.left_out("raw/x.wav", folder=False) == EXCLUDED
    assert rules.left_out("b/raw/x.wav", folder=False) is None
    assert rules.left_out("cache", folder=True) == EXCLUDED
    assert rules.left_out("cache", folder=False) is None
    assert rules.left_out_key(".git/objects/ab") == HIDDEN
    assert rules.left_out_key("cache/x/0102.jpg") == EXCLUDED
    assert PathRules(include_hidden=True).left_out(".git", folder=True) is None


names = st.sampled_from(["a", ".git", "cache", "raw", "x.tmp", "0001.wav", ".DS_Store", "b.jpg"])
rule_sets = st.builds(
    PathRules,
    include_hidden=st.booleans(),
    exclude=st.lists(st.sampled_from(["*.tmp", "raw/*.wav", "cache/", "a", "*/b.jpg"]), max_size=3).map(
        tuple
    ),
)


@given(rule_sets, st.lists(names, min_size=1, max_size=4))
def test_an_object_key_is_left_out_exactly_when_a_folder_walk_would_leave_it_out(rules, parts):
    """S3 lists keys, a local walk folders: the same path is kept by both or by neither."""
    relpath = "/".join(parts)
    walked = None
    for i in range(1, len(parts) + 1):  # the walk stops at the first folder left out
        walked = rules.left_out("/".join(parts[:i]), folder=i < len(parts))
        if walked is not None:
            break
    assert rules.left_out_key(relpath) == walked


def test_decoded_extensions_are_the_decoders():
    from fastload.train import decode

    known = decode.IMAGE_EXTENSIONS | decode.PICKLE_EXTENSIONS | set(decode._DECODERS)
    assert known == DECODED_EXTENSIONS
