"""A training loop over a three-source ``fastload.Mix`` (stop="never") that records what it was fed: run
by the mixture resume test until it is killed with SIGKILL; the test resumes from its last checkpoint.

    python mix_loop.py A B C OUTDIR [--num-workers N]

After every batch it appends the batch's ``(source, key)`` pairs as one JSON line to ``OUTDIR/keys.jsonl``,
then atomically writes the loader's ``state_dict()`` to ``OUTDIR/checkpoint.json``. The mixture is the one
``tests/dataset/test_mix.py`` builds.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import fastload


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("roots", nargs=3)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--num-workers", type=int, default=0)
    args = parser.parse_args()
    a, b, c = args.roots
    sources = {
        "a": fastload.ShardDataset(a, seed=1),
        "b": fastload.ShardDataset(b, seed=2, shuffle_buffer=4),
        "c": fastload.ShardDataset(c),
    }
    mix = fastload.Mix(sources, {"a": 0.5, "b": 0.3, "c": 0.2}, seed=7, stop="never")
    loader = fastload.DataLoader(
        mix, batch_size=4, num_workers=args.num_workers, timeout=60 if args.num_workers else 0
    )
    checkpoint = args.outdir / "checkpoint.json"
    with open(args.outdir / "keys.jsonl", "a", encoding="utf-8") as out:
        for batch in loader:
            out.write(json.dumps(list(zip(batch["__source__"], batch["__key__"], strict=True))) + "\n")
            out.flush()
            tmp = checkpoint.with_suffix(".tmp")
            tmp.write_text(json.dumps(loader.state_dict()), encoding="utf-8")
            os.replace(tmp, checkpoint)


if __name__ == "__main__":
    main()
