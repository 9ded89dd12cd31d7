"""A training loop that records what it was fed: run by the resume tests, killed with SIGKILL mid-epoch.

    python train_loop.py DATASET OUTDIR [--resume] [--num-workers N] [--step-s S]

After every batch it appends the batch's keys as one JSON line to ``OUTDIR/keys.jsonl`` (``resumed.jsonl``
with ``--resume``), then "trains" for ``--step-s`` seconds, then atomically writes the loader's
``state_dict()`` to ``OUTDIR/checkpoint.json``. Keys recorded after the last checkpoint were therefore seen
by a step whose checkpoint never landed: a resumed job is expected to see them again. With ``--resume`` it
starts from ``checkpoint.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import fastload

SEED, EPOCH, BATCH, SHUFFLE_BUFFER = 17, 1, 4, 16


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--step-s", type=float, default=0.0)
    args = parser.parse_args()

    dataset = fastload.ShardDataset(args.dataset, seed=SEED, shuffle_buffer=SHUFFLE_BUFFER)
    loader = fastload.DataLoader(
        dataset, batch_size=BATCH, num_workers=args.num_workers, timeout=60 if args.num_workers else 0
    )
    dataset.set_epoch(EPOCH)
    checkpoint = args.outdir / "checkpoint.json"
    if args.resume:
        loader.load_state_dict(json.loads(checkpoint.read_bytes()))
    log = args.outdir / ("resumed.jsonl" if args.resume else "keys.jsonl")
    with open(log, "a", encoding="utf-8") as out:
        for batch in loader:
            out.write(json.dumps(list(batch["__key__"])) + "\n")
            out.flush()
            os.fsync(out.fileno())
            time.sleep(args.step_s)
            write_atomic(checkpoint, json.dumps(loader.state_dict()).encode())
    (args.outdir / ("resumed.done" if args.resume else "done")).touch()


if __name__ == "__main__":
    main()
