"""Indexes across the payload split (issue 29 item 2): what fastload writes for tar is byte for byte what the
release before it wrote (so older fastload reads it), and indexes of that release read here, tar and
Parquet (whose shard objects and tables then carried an empty ``fields``, and ``stats`` after ``table``)."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import crc32c

import fastload
from fastload import formats
from fastload.core.table import decode_table, encode_table
from fastload.formats.parquet.payload import footer_of, stats_of
from fastload.formats.tar.layout import layout_of
from fastload.storage.tables import table_ref

# written by fastload at 78d9cb3 (before the split) for the tree of _tree(): `fastload.pack(src, out)`
OLD_TAR_INDEX = (
    '{"format":"fastload-index","version":2,"shard_format":"tar","checksum":"crc32c","fields":["cls","txt"],'
    '"totals":{"shards":1,"samples":3,"bytes":7168,"payload_bytes":144},"options":{"shard_format":"tar",'
    '"shard_size_bytes":268435456,"max_samples":null,"prefix":"shard","shuffle_seed":null,'
    '"partition_level":null,"partition_name":null,'
    '"layout":"a4bf8bc23e0459b2c5c02c5c2c3365736e81b227092f52bc58043781f9a3485e"},"skipped":[],'
    '"shards":[{"name":"shard-000000.tar","format":"tar","bytes":7168,"samples":3,"checksum":"6488fcc0",'
    '"partition":null,"fields":["cls","txt"],"table":{"name":"shard-000000.tar.fltable","bytes":380,'
    '"checksum":"48674bc7","content":"e5b8c289"}}]}'
)
OLD_TAR_TABLE = base64.b64decode(
    "RkxTVAEAAADYAAAAeyJzYW1wbGVzIjozLCJmaWVsZHMiOlsiY2xzIiwidHh0Il0sImNvbHVtbnMiOnsib2Zmc2V0cyI6WyJ1OCIs"
    "WzNdLDAsMjRdLCJzaXplcyI6WyJ1OCIsWzNdLDI0LDI0XSwiY3JjcyI6WyJ1NCIsWzNdLDQ4LDEyXSwibWVtYmVyX3NpemVzIjpb"
    "InU4IixbMywyXSw2NCw0OF0sImtleV9lbmRzIjpbInU4IixbM10sMTEyLDI0XSwia2V5X2Jsb2IiOlsidTEiLFsxMl0sMTM2LDEy"
    "XX19AAAAAAAAAAAACAAAAAAAAAAQAAAAAAAAAAgAAAAAAAAACAAAAAAAAAAIAAAAAAAAZUKOq3ilY3G9xO3aAAAAAAEAAAAAAAAA"
    "KAAAAAAAAAABAAAAAAAAAC8AAAAAAAAAAQAAAAAAAAA2AAAAAAAAAAQAAAAAAAAACAAAAAAAAAAMAAAAAAAAAGQvczBkL3MxZC9z"
    "MonCuOU="
)


def _tree(root: Path) -> Path:
    src = root / "src"
    (src / "d").mkdir(parents=True)
    for i in range(3):
        (src / "d" / f"s{i}.cls").write_text(str(i))
        (src / "d" / f"s{i}.txt").write_bytes(bytes(range(40 + i * 7)))
    return src


def _read(root: Path) -> list[tuple[str, bytes, bytes]]:
    samples = fastload.ShardDataset(root, decode=False)
    return sorted((s["__key__"], bytes(s["cls"]), bytes(s["txt"])) for s in samples)


EXPECTED = [(f"d/s{i}", str(i).encode(), bytes(range(40 + i * 7))) for i in range(3)]


def test_a_tar_index_is_written_as_the_release_before_wrote_it(tmp_path: Path) -> None:
    """Tar's payload (fields, member sizes) goes where it always went: older fastload reads new indexes."""
    out = tmp_path / "out"
    fastload.pack(_tree(tmp_path), out, progress=False, workers=1)
    assert (out / "index.json").read_text() == OLD_TAR_INDEX
    assert (out / "shard-000000.tar.fltable").read_bytes() == OLD_TAR_TABLE
    assert _read(out) == EXPECTED


def test_an_old_tar_index_reads_with_its_layout(tmp_path: Path) -> None:
    out = tmp_path / "out"
    fastload.pack(_tree(tmp_path), out, progress=False, workers=1)
    (out / "index.json").write_text(OLD_TAR_INDEX)
    (out / "shard-000000.tar.fltable").write_bytes(OLD_TAR_TABLE)
    full = formats.load_index(out, tables=True).shards[0]
    layout = layout_of(full)
    assert layout is not None and layout.fields == ["cls", "txt"]
    assert layout.sizes == [(1, 40), (1, 47), (1, 54)]
    assert _read(out) == EXPECTED and fastload.verify(out).ok


def test_an_old_parquet_index_reads_with_its_footer_and_stats(tmp_path: Path) -> None:
    """The shape the release before wrote: ``"fields": []`` in the shard object and the table's header,
    ``stats`` after ``table``; read, filtered by its stats and verified."""
    out = tmp_path / "out"
    fastload.pack(_tree(tmp_path), out, shard_format="parquet", progress=False, workers=1)
    sidecar = out / "_fastload"
    index = json.loads((sidecar / "index.json").read_text())
    (shard,) = index["shards"]
    table = decode_table((sidecar / "shard-000000.parquet.fltable").read_bytes(), where="t")
    footer = table.columns["footer"].tobytes()
    table.header = {"fields": []}
    old = encode_table(table, crc=crc32c.crc32c)
    assert b'{"samples":3,"fields":[],"columns"' in old
    (sidecar / "shard-000000.parquet.fltable").write_bytes(old)
    stats = shard.pop("stats")
    table_obj = table_ref(shard["table"]["name"], old).to_dict()
    shard.pop("table")
    index["shards"] = [{**shard, "fields": [], "table": table_obj, "stats": stats}]
    (sidecar / "index.json").write_text(json.dumps(index))

    full = formats.load_index(out, tables=True).shards[0]
    assert footer and footer_of(full) == footer and stats_of(full) == stats
    assert _read(out) == EXPECTED and fastload.verify(out).ok
    kept = fastload.ShardDataset(out, decode=False, filters=[("cls", "=", "1")])
    assert [s["__key__"] for s in kept] == ["d/s1"]
    shutil.rmtree(out)
