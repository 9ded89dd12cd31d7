"""Every ```python block of README.md and docs/*.md runs as written (issue 19), so the examples cannot rot.

How (docs/contributing.md says the same to writers): the blocks of one page run in order, in one namespace
(like a notebook), in a fresh temporary folder of their own holding the example data under the names the
docs use:

- ``images/``: 48 small JPEGs in ten class folders (``class_03/000123.jpg``), as ``fastload bench`` makes;
- ``packed/``: ``images/`` packed into tar shards by ``fastload.pack``;
- ``tokens/``: a small token dataset written by ``fastload.pack_tokens``;
- ``s3://my-bucket/packed/``: ``packed/`` on a local S3 endpoint (moto, via ``AWS_ENDPOINT_URL``, with
  dummy credentials), so ``s3://`` examples run unchanged.

An HTML comment ``<!-- example: MARKER -->`` on the line before a fence (then a blank line) marks a block
that is not run here: ``norun`` (a fragment that is never run),
``gpu`` (run only where CUDA is available), ``cluster`` (needs several machines or a Ray cluster: skipped,
with the reason) or ``torchrun`` (a whole script, run by :func:`test_torchrun_recipes` as two processes under
``torchrun``). A block identical to one already run runs once. Warnings from third-party libraries are let
through (shown in the test's output); a warning raised by fastload fails the example.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# an optional marker comment, a blank line, then the fenced block
FENCE = re.compile(
    r"(?:^<!-- example: (?P<marker>\S+) -->\n\n)?^```python[ \t]*\n(?P<code>.*?)^```[ \t]*$", re.M | re.S
)
MARKERS = {None, "norun", "gpu", "cluster", "torchrun"}
# The recipes' frameworks: .ci/run installs them; where they are missing, their blocks are skipped, saying so.
OPTIONAL = {"lightning", "accelerate", "torchdata"}
FASTLOAD_DIR = str(ROOT / "fastload")
BUCKET = "my-bucket"


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    marker: str | None
    code: str


def blocks_of(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    return [
        Block(path.relative_to(ROOT).as_posix(), text.count("\n", 0, m.start("code")), m["marker"], m["code"])
        for m in FENCE.finditer(text)
    ]


ALL_BLOCKS = [b for page in PAGES for b in blocks_of(page)]


def test_markers_are_known_and_counted() -> None:
    unknown = [f"{b.page}:{b.line} ({b.marker})" for b in ALL_BLOCKS if b.marker not in MARKERS]
    # A word after ``python`` in the fence breaks it on the site (and every fence after it)
    unknown += [
        f"{page.relative_to(ROOT)}: {m[0]}"
        for page in PAGES
        for m in re.finditer(r"^```python[ \t]+\S.*$", page.read_text(encoding="utf-8"), re.M)
    ]
    assert not unknown, f"unknown markers (use {sorted(m for m in MARKERS if m)}): {unknown}"
    counts = {m or "run": sum(b.marker == m for b in ALL_BLOCKS) for m in MARKERS}
    print("python blocks:", counts)
    # Most examples must run: a page of fragments is a page nobody checks.
    assert counts["run"] + counts["torchrun"] >= 2 * (counts["norun"] + counts["cluster"]), counts


def test_no_indented_code_blocks_are_left() -> None:
    """Indented code blocks are not run (and not highlighted): every example is a fenced block."""
    found = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").split("\n")
        fenced = False
        for i, line in enumerate(lines):
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced and line.startswith("    ") and i and not lines[i - 1].strip():
                before = next((x for x in reversed(lines[:i]) if x.strip()), "")
                if not before.lstrip().startswith(("-", "|", "*")) and not before.startswith("  "):
                    found.append(f"{page.relative_to(ROOT)}:{i + 1}")
    assert not found, f"indented code blocks (fence them): {found}"


@pytest.fixture(scope="module")
def example_data(tmp_path_factory: pytest.TempPathFactory, moto_url: str) -> Path:
    """The data the examples name, built once for every page (about a second)."""
    import fastload
    from fastload.bench.synth import image_bytes, relpath

    root = tmp_path_factory.mktemp("docs-data")
    for i in range(48):
        path = root / "images" / relpath(i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(image_bytes(i, 0))
    fastload.pack(str(root / "images"), str(root / "packed"), max_samples=16, progress=False)
    docs = root / "docs.jsonl"
    docs.write_text("".join(json.dumps({"input_ids": list(range(i % 50 + 5))}) + "\n" for i in range(64)))
    fastload.pack_tokens([str(docs)], str(root / "tokens"), vocab_size=50257)
    code = root / "code.jsonl"  # a second source of longer documents (docs/tokens.md's mixture)
    code.write_text(
        "".join(json.dumps({"input_ids": list(range(100, 120 + i % 120))}) + "\n" for i in range(40))
    )
    fastload.pack_tokens([str(code)], str(root / "tokens-code"), vocab_size=50257)
    s3 = boto3.client(
        "s3",
        endpoint_url=moto_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    s3.create_bucket(Bucket=BUCKET)
    for path in sorted((root / "packed").rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), BUCKET, f"packed/{path.relative_to(root / 'packed').as_posix()}")
    return root


@pytest.fixture
def page_folder(
    example_data: Path, moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    from fastload.s3 import runtime

    for name in ("images", "packed", "tokens"):
        (tmp_path / name).symlink_to(example_data / name, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    for var, value in {
        "AWS_ENDPOINT_URL": moto_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    runtime.reset()
    try:
        yield tmp_path
    finally:
        runtime.reset()
        shutil.rmtree(tmp_path / "fastload-cache", ignore_errors=True)


_already_run: set[str] = set()
RUNNABLE_PAGES = sorted({b.page for b in ALL_BLOCKS})


@pytest.mark.parametrize("page", RUNNABLE_PAGES)
# torchdata 0.11 on torch 2.13 warns that 'set_vital' is deprecated (as in tests/dataset/test_torch_loader.py)
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
def test_page_examples_run(page: str, page_folder: Path) -> None:
    import torch

    namespace: dict[str, object] = {"__name__": "__main__"}
    ran = 0
    skipped: list[str] = []
    for block in (b for b in ALL_BLOCKS if b.page == page):
        if block.marker == "norun":
            continue
        if block.marker == "cluster":
            skipped.append(f"line {block.line}: needs several machines or a Ray cluster")
            continue
        if block.marker == "torchrun":
            continue  # test_torchrun_recipes
        if block.marker == "gpu" and not torch.cuda.is_available():
            skipped.append(f"line {block.line}: needs CUDA")
            continue
        if block.code in _already_run:
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", "'set_vital' is deprecated", UserWarning)  # as the mark above
            try:
                # padded so that a failure's traceback names the page and the line in it
                exec(compile("\n" * block.line + block.code, page, "exec"), namespace)
            except ModuleNotFoundError as exc:
                if (exc.name or "").split(".")[0] not in OPTIONAL:
                    raise
                skipped.append(f"line {block.line}: {exc.name} is not installed (.ci/run installs it)")
                continue
        ours = [w for w in caught if w.filename.startswith(FASTLOAD_DIR)]
        assert not ours, f"{page}:{block.line} makes fastload warn: {[str(w.message) for w in ours]}"
        for w in caught:
            print(f"{page}:{block.line}: {w.category.__name__}: {w.message}")
        _already_run.add(block.code)
        ran += 1
    # Loaders left behind (a loop left with break) shut their workers down here, not in a later test's thread
    del namespace
    gc.collect()
    if any("not installed" in why for why in skipped) or (skipped and not ran):
        pytest.skip(f"ran {ran} block(s); skipped " + "; ".join(skipped))
    assert os.getcwd() == str(page_folder)


def test_torchrun_recipes(example_data: Path, tmp_path: Path) -> None:
    """Each ``torchrun`` block (docs/recipes.md: torchrun and Accelerate) as two processes under torchrun;
    each script asserts that its ranks together saw every sample exactly once. One launch per script (a
    process group cannot be made again in the same processes under torchrun's store); the launches run at
    the same time."""
    import importlib.util

    import torch

    scripts = [b for b in ALL_BLOCKS if b.marker == "torchrun"]
    assert scripts, "no torchrun recipes found"
    for name in OPTIONAL:
        used = any(f"import {name}" in b.code or f"from {name}" in b.code for b in scripts)
        if used and importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed (.ci/run installs it)")
    for name in ("packed", "tokens", "tokens-code"):
        (tmp_path / name).symlink_to(example_data / name, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONWARNINGS", "COVERAGE"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(name, None)
    env.update(MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    if not torch.cuda.is_available():
        env["ACCELERATE_USE_CPU"] = "1"  # what `accelerate launch --cpu` sets (the recipe says so)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    launches = []
    for i, block in enumerate(scripts):
        path = tmp_path / f"recipe{i}.py"
        path.write_text("\n" * block.line + block.code)  # tracebacks give the line in the page
        pipe, merged = subprocess.PIPE, subprocess.STDOUT
        proc = subprocess.Popen([*launch, path.name], cwd=tmp_path, env=env, stdout=pipe, stderr=merged)
        launches.append((block, proc))
    failures = []
    for block, proc in launches:
        try:
            out, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if proc.returncode != 0:
            failures.append(f"{block.page}:{block.line} (exit {proc.returncode}):\n{out.decode()[-5000:]}")
    assert not failures, "\n\n".join(failures)


def test_api_page_documents_every_public_name() -> None:
    """docs/api.md renders each name of ``fastload.__all__`` from where it is defined (mkdocstrings reads the
    source statically, so the lazily loaded names must be given by their own module)."""
    import inspect

    import fastload

    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^::: (\S+)$", page, re.M))
    missing = []
    for name in fastload.__all__:
        if name == "__version__":
            continue
        obj = getattr(fastload, name)
        path = obj.__name__ if inspect.ismodule(obj) else f"{obj.__module__}.{obj.__qualname__}"
        if path not in listed:
            missing.append(f"{name} ({path})")
    assert not missing, f"docs/api.md lacks: {missing}"


def test_readme_links_resolve() -> None:
    """mkdocs --strict checks the links between pages of docs/; README.md is outside the site."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    broken = [link for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text) if not (ROOT / link).exists()]
    assert not broken, f"README.md links to missing files: {broken}"
