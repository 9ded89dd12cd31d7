"""What killed runs leave behind is removed by the next run, on Ceph RGW, with real SIGKILLs: a pack to S3
leaves its local staging folder (``$TMPDIR/fastload-pack-*``, removed by ``--resume`` or any later pack,
never one a live pack holds); ``cp -r`` to S3 leaves open multipart uploads (aborted by the next ``cp`` of
those files); a download leaves ``.NAME.XXXXXXXX.part`` (left out of a later upload of the folder, removed
by the next download of NAME)."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from s3util import KIB, MIB, fastload_argv, keys_under, open_uploads, run_cli, s3_env, snapshot
from test_s3_rgw_pack import small_files_tree, start_pack, wait_then_kill, write_tree

from fastload.packing import staging
from fastload.testing.faultproxy import Fault, Rule


def staging_folders(tmp: Path) -> list[str]:
    return sorted(n for n in os.listdir(tmp) if n.startswith(staging.PREFIXES))


def test_a_killed_pack_s_staging_folder_is_removed_by_resume_but_a_live_one_is_kept(
    rgw: Any, rgw_client: Any, rgw_proxy: Callable[..., Any], bucket: Callable[..., str], tmp_path: Path
) -> None:
    src = small_files_tree(tmp_path / "src", 300, seed=3)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    name = bucket(rgw)
    dst = f"s3://{name}/ds"
    options = ["--workers", "2", "--shard-size", "64KiB", "--quiet"]
    proxy = rgw_proxy()
    proxy.add(Rule(Fault.latency(delay_s=0.3), method="PUT", key="/ds/shard-"))
    argv = fastload_argv("pack", src, dst, *options)
    with (tmp_path / "killed.stderr").open("wb") as stderr:
        proc = start_pack(argv, s3_env(rgw, endpoint_url=proxy.endpoint_url), tmp, stderr)
        wait_then_kill(proc, lambda: len(keys_under(rgw_client, name, "ds/shard-")) >= 2)
    left = staging_folders(tmp)
    assert len(left) == 1 and left[0].startswith("fastload-pack-"), left

    live = staging.StagingFolder(root=str(tmp))  # another pack's, running (this process holds it)
    old = tmp / "fastload-pack-olderversion"  # an older fastload's (no lock file), untouched for 2 hours
    (old / "000001.part").parent.mkdir()
    (old / "000001.part").write_bytes(b"x" * 1000)
    two_hours_ago = time.time() - 7200
    os.utime(old / "000001.part", (two_hours_ago, two_hours_ago))
    os.utime(old, (two_hours_ago, two_hours_ago))
    try:
        run_cli("pack", src, dst, *options, "--resume", env=s3_env(rgw), tmp_dir=tmp)
        assert staging_folders(tmp) == [os.path.basename(live.path)]
    finally:
        live.close()
    assert staging_folders(tmp) == []
    run_cli("verify", dst, env=s3_env(rgw))


def test_a_killed_cp_r_upload_s_multipart_uploads_are_aborted_by_the_next_cp(
    rgw: Any, rgw_client: Any, rgw_proxy: Callable[..., Any], bucket: Callable[..., str], tmp_path: Path
) -> None:
    rng = random.Random(4)
    src = write_tree(
        tmp_path / "src",
        {"big/a.bin": rng.randbytes(9 * MIB), "big/b.bin": rng.randbytes(9 * MIB), "s.txt": b"small"},
    )
    name = bucket(rgw)
    other = rgw_client.create_multipart_upload(Bucket=name, Key="up/not-ours.bin")  # a key cp does not write
    proxy = rgw_proxy()
    hang = proxy.add(
        Rule(Fault.hang(duration_s=30), method="PUT", where=lambda r: "partNumber=2" in r.target)
    )
    argv = fastload_argv("cp", "-r", f"{src}/", f"s3://{name}/up/", "--quiet")
    with (tmp_path / "killed.stderr").open("wb") as stderr:
        proc = start_pack(argv, s3_env(rgw, endpoint_url=proxy.endpoint_url), tmp_path, stderr)
        wait_then_kill(proc, lambda: hang.fired >= 2 and len(open_uploads(rgw_client, name, "up/big")) == 2)
    assert len(open_uploads(rgw_client, name, "up/")) == 3

    run_cli("cp", "-r", f"{src}/", f"s3://{name}/up/", "--quiet", env=s3_env(rgw))
    assert [u["UploadId"] for u in open_uploads(rgw_client, name, "up/")] == [other["UploadId"]]
    run_cli("cp", "-r", f"s3://{name}/up/", tmp_path / "back", "--quiet", env=s3_env(rgw))
    assert snapshot(tmp_path / "back") == snapshot(src)


def range_start(header: str | None) -> int:
    return int(header.split("=")[1].split("-")[0]) if header else 0


def test_a_killed_download_s_part_file_is_never_uploaded_and_the_next_download_removes_it(
    rgw: Any, rgw_client: Any, rgw_proxy: Callable[..., Any], bucket: Callable[..., str], tmp_path: Path
) -> None:
    data = random.Random(6).randbytes(12 * MIB)
    name = bucket(rgw)
    rgw_client.put_object(Bucket=name, Key="obj/big.bin", Body=data)
    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.txt").write_bytes(b"kept")
    proxy = rgw_proxy()
    later = Rule(  # the first 8 MiB arrive (and are written: a piece of the download), the rest stall
        Fault.stall_mid_body(after_bytes=256 * KIB, duration_s=30),
        method="GET",
        where=lambda r: range_start(r.range) >= 8 * MIB,
    )
    proxy.add(later)

    def parts() -> list[str]:
        return sorted(n for n in os.listdir(out) if n.startswith(".big.bin.") and n.endswith(".part"))

    argv = fastload_argv("cp", f"s3://{name}/obj/big.bin", out / "big.bin", "--quiet")
    with (tmp_path / "killed.stderr").open("wb") as stderr:
        proc = start_pack(argv, s3_env(rgw, endpoint_url=proxy.endpoint_url), tmp_path, stderr)
        wait_then_kill(proc, lambda: bool(parts()) and (out / parts()[0]).stat().st_size > 0)
    assert len(parts()) == 1 and not (out / "big.bin").exists()

    up = run_cli("cp", "-r", f"{out}/", f"s3://{name}/up/", env=s3_env(rgw))
    assert keys_under(rgw_client, name, "up/") == ["up/kept.txt"], "the unfinished download is not data"
    assert "skipped 1 unfinished download(s)" in up.stdout and parts()[0] in up.stdout, up.stdout

    run_cli("cp", f"s3://{name}/obj/big.bin", out / "big.bin", env=s3_env(rgw))
    assert parts() == [] and (out / "big.bin").read_bytes() == data
