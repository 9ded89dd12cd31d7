"""The CLI as people expect it (issue 19): every argument of every command explains itself in --help, and
every command that talks to S3 takes --endpoint-url as the aws CLI spells it."""

from __future__ import annotations

import argparse
from pathlib import Path

import boto3
import pytest

from fastload.cli import build_parser, main
from fastload.s3 import runtime


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # (argparse has no public walk over subcommands)
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_argument_of_every_command_has_help() -> None:
    missing = []
    for name, sub in _subparsers(build_parser()).items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"fastload {name} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, "arguments without help text: " + ", ".join(missing)


@pytest.mark.parametrize(
    "command", ["pack", "verify", "index", "inspect", "cp", "ls", "mb", "pack-tokens", "bench"]
)
def test_s3_commands_take_endpoint_url(command: str) -> None:
    sub = _subparsers(build_parser())[command]
    assert any("--endpoint-url" in a.option_strings for a in sub._actions), command


def test_endpoint_url_reaches_the_client(
    moto_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    s3.create_bucket(Bucket="cli-endpoint")
    s3.put_object(Bucket="cli-endpoint", Key="a/one.txt", Body=b"1")
    runtime.reset()
    try:
        assert main(["ls", "--endpoint-url", moto_url, "-r", "s3://cli-endpoint/a/"]) == 0
        assert "a/one.txt" in capsys.readouterr().out
    finally:
        runtime.reset()


def test_verify_shows_progress_on_a_terminal_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import fastload
    from fastload.packing.verify import verify

    src = tmp_path / "src"
    src.mkdir()
    for i in range(20):
        (src / f"{i:02d}.txt").write_text(f"sample {i}")
    fastload.pack(str(src), str(tmp_path / "ds"), progress=False, max_samples=5)
    assert main(["verify", str(tmp_path / "ds")]) == 0  # stderr is not a terminal here: no bar
    assert "verifying" not in capsys.readouterr().err
    assert verify(tmp_path / "ds", progress=True).ok
    assert "verifying 4 shards" in capsys.readouterr().err
