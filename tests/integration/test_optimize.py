"""``fastload.optimize``: samples from a function of each input, in worker processes, written as a dataset
byte-identical whatever the workers; failures named or skipped; resume refused when something changed."""

from __future__ import annotations

import json
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload.errors import ConfigError, InputFailedError, PackError, ResumeMismatchError

from . import optimize_fns
from .helpers import run_cli, snapshot
from .optimize_fns import INPUTS, make

SHARD = 16 << 10


def run(dst: Path, fn=make, inputs=range(INPUTS), **options):  # type: ignore[no-untyped-def]
    options.setdefault("shard_size_bytes", SHARD)
    options.setdefault("progress", False)
    return fastload.optimize(fn, inputs, dst, **options)


def expected_samples(inputs=range(INPUTS)) -> list[dict[str, bytes]]:  # type: ignore[no-untyped-def]
    out = []
    for n in inputs:
        for s in make(n) or []:
            npy = np.lib.format
            import io

            buf = io.BytesIO()
            npy.write_array(buf, s["npy"], allow_pickle=False)
            out.append(
                {
                    "__key__": s["__key__"],
                    "json": json.dumps(s["json"]).encode(),
                    "npy": buf.getvalue(),
                    "txt": s["txt"].encode(),
                }
            )
    return out


def read_back(dst: Path) -> list[dict[str, bytes]]:
    index = json.loads((dst / "index.json").read_bytes())
    samples: dict[str, dict[str, bytes]] = {}
    order: list[str] = []
    for shard in index["shards"]:
        with tarfile.open(dst / shard["name"]) as tar:
            for m in tar.getmembers():
                key, _, field = m.name.partition(".")
                if key not in samples:
                    samples[key] = {"__key__": key.encode()}  # type: ignore[dict-item]
                    order.append(key)
                f = tar.extractfile(m)
                assert f is not None
                samples[key][field] = f.read()
    return [{**samples[k], "__key__": k} for k in order]  # type: ignore[dict-item]


def test_output_is_byte_identical_for_any_workers_and_start_method(tmp_path: Path) -> None:
    first = run(tmp_path / "w1", workers=1)
    assert len(first.index.shards) > 5
    assert first.samples == len(expected_samples())
    want = snapshot(tmp_path / "w1")
    for name, options in {
        "w2": {"workers": 2},
        "w3": {"workers": 3, "chunk_size": 1},
        "spawn": {"workers": 2, "start_method": "spawn", "chunk_size": 5},
    }.items():
        run(tmp_path / name, **options)
        got = snapshot(tmp_path / name)
        assert sorted(got) == sorted(want), name
        for rel in want:
            assert got[rel] == want[rel], f"{name}: {rel} differs from the workers=1 run"
    assert read_back(tmp_path / "w1") == expected_samples()
    assert fastload.verify(tmp_path / "w1").ok


def test_an_iterable_is_taken_in_chunks_and_gives_the_same_bytes(tmp_path: Path) -> None:
    taken = []

    def inputs():  # type: ignore[no-untyped-def]
        for n in range(INPUTS):
            taken.append(n)
            yield n

    run(tmp_path / "list", workers=2)
    run(tmp_path / "gen", inputs=inputs(), workers=2, chunk_size=4)
    assert snapshot(tmp_path / "gen") == snapshot(tmp_path / "list")
    assert taken == list(range(INPUTS))


def test_every_format_round_trips(tmp_path: Path) -> None:
    for fmt in ("parquet", "tfrecord"):
        report = run(tmp_path / fmt, workers=2, format=fmt, shard_size_bytes=16 << 10)
        assert report.index.shard_format == fmt
        assert fastload.verify(tmp_path / fmt).ok
        ds = fastload.ShardDataset(str(tmp_path / fmt), decode=False)
        got = {s["__key__"]: s["txt"] for s in ds}
        assert got == {s["__key__"]: s["txt"] for s in expected_samples()}


def test_an_exception_names_the_input_and_publishes_nothing(tmp_path: Path) -> None:
    with pytest.raises(InputFailedError) as info:
        run(tmp_path / "ds", fn=optimize_fns.fail_on_fives, inputs=range(1, INPUTS), workers=2)
    err = info.value
    assert (err.number, err.input) == (4, "5")  # inputs number from 0: the 5th input is 5
    assert "ValueError: 5 is a multiple of five" in str(err)
    assert "fail_on_fives" in err.traceback
    assert not (tmp_path / "ds" / "index.json").exists()
    assert pickle.loads(pickle.dumps(err)).number == 4


def test_on_error_skip_lists_the_inputs_left_out(tmp_path: Path) -> None:
    report = run(tmp_path / "ds", fn=optimize_fns.fail_on_fives, workers=2, on_error="skip")
    fives = [n for n in range(INPUTS) if n % 5 == 0]
    assert [f.number for f in report.failures] == fives
    assert "ValueError: 10 is a multiple of five" in report.summary()
    index = json.loads((tmp_path / "ds" / "index.json").read_bytes())
    assert [s["path"] for s in index["skipped"]][:2] == ["input #0: 0", "input #5: 5"]
    assert read_back(tmp_path / "ds") == expected_samples(n for n in range(INPUTS) if n % 5)


def test_a_bad_sample_is_a_failure_of_its_input(tmp_path: Path) -> None:
    with pytest.raises(InputFailedError, match=r"input #2 \(2\).*__key__"):
        run(tmp_path / "ds", fn=lambda n: {"txt": "no key"} if n == 2 else make(n), workers=1)


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    for bad in (
        {"on_error": "ignore"},
        {"workers": 0},
        {"chunk_size": 0},
        {"engine": "threads"},
        {"format": "zip"},
        {"inputs": "abc"},
    ):
        with pytest.raises(ConfigError):
            run(tmp_path / "ds", **bad)  # type: ignore[arg-type]
    assert not (tmp_path / "ds").exists()


def test_resume_after_an_error_finishes_to_the_bytes_of_one_run(tmp_path: Path, monkeypatch) -> None:
    run(tmp_path / "whole", fn=optimize_fns.fail_on_env, workers=2)
    monkeypatch.setenv("OPTIMIZE_FAIL_AT", "41")
    with pytest.raises(InputFailedError):
        run(tmp_path / "ds", fn=optimize_fns.fail_on_env, workers=2)
    monkeypatch.delenv("OPTIMIZE_FAIL_AT")
    kept = sorted((tmp_path / "ds").glob("shard-*.tar"))
    assert len(kept) > 3
    report = run(tmp_path / "ds", fn=optimize_fns.fail_on_env, workers=3, resume=True)
    assert report.shards_kept >= len(kept) - 1
    assert snapshot(tmp_path / "ds") == snapshot(tmp_path / "whole")
    again = run(tmp_path / "ds", fn=optimize_fns.fail_on_env, resume=True)
    assert again.already_complete


def interrupted(dst: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OPTIMIZE_FAIL_AT", "41")
    with pytest.raises(InputFailedError):
        run(dst, fn=optimize_fns.fail_on_env, workers=2)
    monkeypatch.delenv("OPTIMIZE_FAIL_AT")


def test_resume_refuses_another_function(tmp_path: Path, monkeypatch) -> None:
    interrupted(tmp_path / "ds", monkeypatch)
    with pytest.raises(ResumeMismatchError, match="function differs") as info:
        run(tmp_path / "ds", fn=make, resume=True)
    assert info.value.what == "function"


def test_resume_refuses_other_inputs_or_options(tmp_path: Path, monkeypatch) -> None:
    interrupted(tmp_path / "ds", monkeypatch)
    other = [*range(10), 99, *range(11, INPUTS)]
    with pytest.raises(ResumeMismatchError, match="inputs differ") as info:
        run(tmp_path / "ds", fn=optimize_fns.fail_on_env, inputs=other, resume=True)
    assert info.value.what == "inputs"
    with pytest.raises(ResumeMismatchError, match="inputs differ"):
        run(tmp_path / "ds", fn=optimize_fns.fail_on_env, inputs=range(INPUTS + 1), resume=True)
    with pytest.raises(ResumeMismatchError, match="options") as info:
        run(tmp_path / "ds", fn=optimize_fns.fail_on_env, resume=True, shard_size_bytes=2 * SHARD)
    assert info.value.what == "options"
    gen = iter(range(20))  # an iterable (no length) that ends before the resume point
    with pytest.raises(ResumeMismatchError):
        run(tmp_path / "ds", fn=optimize_fns.fail_on_env, inputs=gen, resume=True)


def test_a_fresh_run_into_an_interrupted_one_says_to_resume(tmp_path: Path, monkeypatch) -> None:
    interrupted(tmp_path / "ds", monkeypatch)
    with pytest.raises(PackError, match="--resume"):
        run(tmp_path / "ds", fn=optimize_fns.fail_on_env)


def test_the_command_gives_the_bytes_of_the_function(tmp_path: Path) -> None:
    lines = tmp_path / "inputs.txt"
    lines.write_text("".join(f"{n}\n" for n in range(INPUTS)) + "\n")  # (an empty line: left out)
    run(tmp_path / "api", fn=optimize_fns.make_from_text, inputs=[str(n) for n in range(INPUTS)], workers=2)
    spec = "tests.integration.optimize_fns:make_from_text"
    proc = run_cli("optimize", spec, "--inputs", lines, tmp_path / "cli", "--shard-size", "16KiB", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert f"from {INPUTS} inputs" in proc.stdout
    assert snapshot(tmp_path / "cli") == snapshot(tmp_path / "api")


def test_the_command_names_a_failing_input_with_its_traceback(tmp_path: Path) -> None:
    script = tmp_path / "fns.py"
    script.write_text("def make(line):\n    raise OSError(f'cannot fetch {line}')\n")
    lines = tmp_path / "inputs.txt"
    lines.write_text("http://127.0.0.1:9/a.jpg\n")
    proc = run_cli("optimize", f"{script}:make", "--inputs", lines, tmp_path / "ds", "--workers", "2")
    assert proc.returncode == 1
    assert 'fns.py", line 2, in make' in proc.stderr
    assert "input #0 ('http://127.0.0.1:9/a.jpg'): OSError: cannot fetch" in proc.stderr
    proc = run_cli("optimize", "nosuchmodule:make", "--inputs", lines, tmp_path / "ds2")
    assert proc.returncode == 2 and "cannot import 'nosuchmodule'" in proc.stderr


def test_the_progress_bar_counts_inputs_toward_their_number(tmp_path: Path, capfd) -> None:  # type: ignore[no-untyped-def]
    run(tmp_path / "bar", workers=2, progress=True)
    err = capfd.readouterr().err
    assert f"{INPUTS}/{INPUTS}" in err and "input/s" in err
    run(tmp_path / "quiet", workers=2, progress=None)  # not a terminal here, so no bar
    assert "input/s" not in capfd.readouterr().err
