"""fastload.ShardWriter into Ceph RGW: two parts written at once (threads of one process, each its own
writer), shards large enough for multipart uploads (RGW checks each part's Content-MD5), merged, read back
byte for byte and verified; no multipart upload left open."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

from s3util import MIB, open_uploads

import fastload


def test_parts_written_at_once_into_rgw_merge_and_read_back(
    rgw: Any, rgw_client: Any, rgw_env: dict[str, str], bucket: Callable[..., str]
) -> None:
    name = bucket(rgw)
    dst = f"s3://{name}/written/"
    rng = random.Random(5)
    given = {f"{i:05d}": rng.randbytes(rng.randrange(100_000, 400_000)) for i in range(120)}
    keys = sorted(given)
    errors: list[BaseException] = []

    def part(p: int) -> None:
        try:
            with fastload.ShardWriter(dst, part=p, parts=2, shard_size_bytes=12 * MIB, workers=2) as w:
                for k in keys[p::2]:
                    w.write({"__key__": k, "bin": given[k], "json": {"k": k}})
        except BaseException as exc:  # (re-raised below, in the test's thread)
            errors.append(exc)

    threads = [threading.Thread(target=part, args=(p,)) for p in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    report = fastload.ShardWriter.merge(dst)
    assert report.samples == 120 and report.shards >= 2
    got = {s["__key__"]: s["bin"] for s in fastload.ShardDataset(dst, decode=False)}
    assert got == given
    assert fastload.verify(dst).ok
    assert open_uploads(rgw_client, name) == []
