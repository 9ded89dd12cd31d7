"""WebDataset's key rule (``split_key``), grouping files into samples, partitions and member-name lint."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from webdataset.tariterators import base_plus_ext

from fastload.core.keys import (
    KeyRuleError,
    Rejected,
    Sample,
    group_samples,
    lint_member_name,
    partition_value,
    split_key,
    webdataset_would_split,
)

SETTINGS = settings(max_examples=150, deadline=None)

# Path components drawn from characters that matter to the rule (dots, slashes via joining) plus a few
# ordinary and non-ASCII ones. Empty components produce "//" and leading "/", which must be rejected.
_COMPONENT = st.text(alphabet="ab0.-_ é日", max_size=6)
_COMPONENT_NL = st.text(alphabet="ab0.-_ é日\n", max_size=6)


def _paths(component: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.lists(component, min_size=1, max_size=4).map("/".join)


# --- split_key: worked examples -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("0001.jpg", ("0001", "jpg")),
        ("a/b/0001.seg.png", ("a/b/0001", "seg.png")),
        ("x.tar.gz", ("x", "tar.gz")),
        ("a.b/c.d/0001.seg.png", ("a.b/c.d/0001", "seg.png")),  # dots in folders do not count
        ("v1.2/data/0001.jpg", ("v1.2/data/0001", "jpg")),
        ("a/b..c", ("a/b", ".c")),  # everything after the first dot is the field
        ("日本/画像.jpg", ("日本/画像", "jpg")),
        ("é/ñandú/über.jpg", ("é/ñandú/über", "jpg")),
        ("dir with space/file name.json", ("dir with space/file name", "json")),
        (".git/0001.jpg", (".git/0001", "jpg")),  # a hidden folder is fine, only the basename matters
    ],
)
def test_split_key_examples(name: str, expected: tuple[str, str]) -> None:
    assert split_key(name) == expected
    assert webdataset_would_split(name) == expected
    assert base_plus_ext(name) == expected


@pytest.mark.parametrize(
    ("name", "reason_word"),
    [
        (".hidden.jpg", "hidden"),
        ("a/b/.hidden.jpg", "hidden"),
        (".jpg", "hidden"),
        ("README", "extension"),
        ("a/b/README", "extension"),
        ("a.b/c", "extension"),  # the only dot is in a folder name
        ("0001.", "empty extension"),
        ("a/0001.", "empty extension"),
        ("\udcff.jpg", "UTF-8"),  # what os.fsdecode gives for the byte 0xff
        ("a/b\udce9c.jpg", "UTF-8"),
        ("/abs/0001.jpg", "relative"),
        ("/0001.jpg", "relative"),
        ("", "relative"),
        ("a//0001.jpg", "relative"),
        ("a/", "extension"),
    ],
)
def test_split_key_rejections(name: str, reason_word: str) -> None:
    with pytest.raises(KeyRuleError) as info:
        split_key(name)
    assert reason_word in str(info.value)
    assert isinstance(info.value, ValueError)


# --- split_key: properties ----------------------------------------------------------------------------


@SETTINGS
@given(_paths(_COMPONENT))
def test_split_key_follows_the_rule(name: str) -> None:
    """Independent statement of the rule: key = folder + basename up to the first dot, field = the rest."""
    folder, slash, base = name.rpartition("/")
    valid = (
        not name.startswith("/")
        and "//" not in name
        and not base.startswith(".")
        and "." in base
        and base[base.find(".") + 1 :] != ""
        and name != ""
    )
    if not valid:
        with pytest.raises(KeyRuleError):
            split_key(name)
        return
    key, field = split_key(name)
    stem = base[: base.index(".")]
    assert key == folder + slash + stem
    assert field == base[len(stem) + 1 :]
    assert f"{key}.{field}" == name
    assert field and "/" not in field
    assert stem and "." not in stem


@SETTINGS
@given(_paths(_COMPONENT))
@example("a.b/c.d/0001.seg.png")
@example("../0001.jpg")
def test_split_key_agrees_with_webdataset(name: str) -> None:
    """Every name we accept is split the same by WebDataset (its own function and our copy of its regex)."""
    try:
        ours = split_key(name)
    except KeyRuleError:
        return
    assert webdataset_would_split(name) == ours
    assert base_plus_ext(name) == ours


@SETTINGS
@given(_paths(_COMPONENT_NL))
@example("x.y\n/b.c")
def test_split_key_agrees_with_webdataset_for_names_with_newlines(name: str) -> None:
    """Newlines are legal in POSIX file names. WebDataset's regex uses ``.`` (which does not match a newline)
    for the folder part, so a name we accept must still split the same way or be rejected."""
    try:
        ours = split_key(name)
    except KeyRuleError:
        return
    assert base_plus_ext(name) == ours


@SETTINGS
@given(st.text(max_size=30))
def test_webdataset_would_split_matches_webdataset(name: str) -> None:
    wds = base_plus_ext(name)
    assert webdataset_would_split(name) == (None if wds == (None, None) else wds)


@SETTINGS
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\0"), max_size=30))
def test_split_key_only_raises_key_rule_error(name: str) -> None:
    try:
        key, field = split_key(name)
    except KeyRuleError:
        return
    assert f"{key}.{field}" == name


@SETTINGS
@given(st.text(alphabet="ab.", max_size=5), st.sampled_from(["\udc80", "\udcff", "\ud800"]))
def test_split_key_rejects_any_name_with_a_lone_surrogate(prefix: str, bad: str) -> None:
    with pytest.raises(KeyRuleError, match="UTF-8"):
        split_key(f"{prefix}{bad}.jpg")


# --- group_samples ------------------------------------------------------------------------------------


def test_group_samples_example() -> None:
    items = [
        ("b/0002.jpg", 1),
        ("a/0001.seg.png", 2),
        ("a/0001.jpg", 3),
        ("b/0002.cls", 4),
        ("a/0001.cls", 5),
        ("README", 6),
    ]
    samples, rejected = group_samples(items)
    assert samples == [
        Sample("a/0001", (("cls", 5), ("jpg", 3), ("seg.png", 2))),
        Sample("b/0002", (("cls", 4), ("jpg", 1))),
    ]
    assert [r.item for r in rejected] == [6]
    assert "extension" in rejected[0].reason


def test_group_samples_duplicate_rejects_whole_sample_and_names_every_input() -> None:
    """Two inputs with the same key+field: the sample is left out whole, and every one of its inputs,
    including the second duplicate, is reported (nothing dropped silently)."""
    items = [("a.jpg", 1), ("a.jpg", 2), ("a.cls", 3), ("b.jpg", 4)]
    samples, rejected = group_samples(items)
    assert samples == [Sample("b", (("jpg", 4),))]
    assert sorted(r.item for r in rejected) == [1, 2, 3]
    assert all("duplicate" in r.reason and "'a'" in r.reason for r in rejected)


def test_group_samples_bad_key_rejects_whole_sample_with_its_reason() -> None:
    items = [("k/1.jpg", "j1"), ("k/1.cls", "c1"), ("k/2.jpg", "j2")]
    samples, rejected = group_samples(items, bad_keys=[("k/1", "broken symlink k/1.txt")])
    assert samples == [Sample("k/2", (("jpg", "j2"),))]
    assert sorted(r.item for r in rejected) == ["c1", "j1"]
    assert all("broken symlink k/1.txt" in r.reason and "k/1" in r.reason for r in rejected)


def test_group_samples_empty() -> None:
    assert group_samples([]) == ([], [])
    assert group_samples([], bad_keys=[("x", "why")]) == ([], [])


_KEYS = st.sampled_from(["a/0001", "a/0002", "b.c/0001", "z", "é/日本"])
_FIELDS = st.sampled_from(["jpg", "cls", "seg.png", "json", "txt"])
_BAD_NAMES = st.sampled_from(["README", ".hidden.jpg", "a/.x.jpg", "x.", "/abs.jpg", "\udcff.jpg", "a//b.c"])
_NAMES = st.one_of(st.tuples(_KEYS, _FIELDS).map(lambda kf: f"{kf[0]}.{kf[1]}"), _BAD_NAMES)


@SETTINGS
@given(
    st.lists(_NAMES, max_size=25),
    st.lists(st.tuples(_KEYS, st.sampled_from(["broken link", "loop"])), max_size=2),
)
def test_group_samples_properties(names: list[str], bad_keys: list[tuple[str, str]]) -> None:
    items = list(zip(names, range(len(names)), strict=True))  # items are unique ints: their position
    samples, rejected = group_samples(items, bad_keys=bad_keys)

    # Nothing lost, nothing duplicated: each input is in exactly one sample or rejected exactly once.
    placed = [item for s in samples for _, item in s.members] + [r.item for r in rejected]
    assert sorted(placed) == list(range(len(items)))
    assert all(isinstance(r, Rejected) and r.reason for r in rejected)

    # Samples sorted by key (strictly: one sample per key), members by field (strictly: no duplicates).
    keys = [s.key for s in samples]
    assert keys == sorted(set(keys))
    for s in samples:
        fields = [f for f, _ in s.members]
        assert fields == sorted(set(fields))
        for field, item in s.members:
            assert split_key(names[item]) == (s.key, field)

    # Model: which keys must survive and with which items.
    by_key: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        try:
            key, _ = split_key(name)
        except KeyRuleError:
            assert i not in {item for s in samples for _, item in s.members}
            continue
        by_key.setdefault(key, []).append(i)
    bad = {k for k, _ in bad_keys}
    expected_keys = []
    for key, idx in sorted(by_key.items()):
        fields = Counter(split_key(names[i])[1] for i in idx)
        if key in bad or max(fields.values()) > 1:
            continue
        expected_keys.append(key)
        sample = samples[keys.index(key)]
        assert sorted(item for _, item in sample.members) == idx
    assert keys == expected_keys


# --- partition_value ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "level", "expected"),
    [
        ("train/cls3/0001", 0, "train"),
        ("train/cls3/0001", 1, "cls3"),
        ("split=val/x.y/0001", 1, "x.y"),
    ],
)
def test_partition_value(key: str, level: int, expected: str) -> None:
    assert partition_value(key, level) == expected


@pytest.mark.parametrize(("key", "level"), [("train/cls3/0001", 2), ("0001", 0), ("a/0001", 1)])
def test_partition_value_missing_level(key: str, level: int) -> None:
    """The basename is not a folder: asking for it (or deeper) is an error naming the level."""
    with pytest.raises(KeyRuleError, match=str(level)):
        partition_value(key, level)


@SETTINGS
@given(st.lists(st.text(alphabet="ab.=é", min_size=1, max_size=4), min_size=1, max_size=5), st.data())
def test_partition_value_is_the_folder_at_level(folders: list[str], data: st.DataObject) -> None:
    key = "/".join([*folders, "0001"])
    level = data.draw(st.integers(0, len(folders) - 1))
    assert partition_value(key, level) == folders[level]
    with pytest.raises(KeyRuleError):
        partition_value(key, len(folders))


# --- lint_member_name ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["0001.jpg", "a/b/0001.seg.png", "a.b/0001.jpg", "日本/画像.jpg"])
def test_lint_member_name_accepts_good_names(name: str) -> None:
    assert lint_member_name(name) is None


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("README", ["ignores", "extension"]),
        ("a.b/c", ["ignores"]),
        (".hidden.jpg", ["ignores", "hidden"]),
        # WebDataset keys "a/.b.c" as key "a/" field "b.c": every such member would collide on key "a/".
        ("a/.b.c", ["'a/'", "'b.c'", "hidden"]),
        ("0001.", ["empty extension"]),
    ],
)
def test_lint_member_name_explains_problems(name: str, words: list[str]) -> None:
    message = lint_member_name(name)
    assert message is not None
    for word in words:
        assert word in message


@SETTINGS
@given(_paths(_COMPONENT_NL))
def test_lint_member_name_is_none_exactly_when_both_rules_agree(name: str) -> None:
    try:
        ours: tuple[str, str] | None = split_key(name)
    except KeyRuleError:
        ours = None
    fine = ours is not None and base_plus_ext(name) == ours
    message = lint_member_name(name)
    assert (message is None) == fine
    if message is not None:
        assert message.strip()
