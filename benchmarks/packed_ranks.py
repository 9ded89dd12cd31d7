"""Equal steps for packed sequences on several ranks: what each ``even`` policy of ``PackedSequences`` costs.

Every rank gets the same number of documents but not of tokens, so each packs a different number of blocks;
DDP needs equal steps. From the blocks each rank's documents make (``PackedSequences(..., even="none")``,
one rank at a time in this process), the plan of each policy (:func:`fastload.core.packranks.equal_steps`,
what the ranks settle on at the end of a pass) gives its waste:

- ``balance`` (default): surplus blocks move to ranks with fewer; empty blocks only for the remainder;
- ``pad``: empty blocks up to the largest count (compute spent on padding);
- ``drop``: every rank stops at the smallest count (tokens not trained on this epoch).

Corpora (fixed seeds): ``random``: log-normal lengths (median 150, up to 2,500 tokens) dealt to ranks at
random (the imbalance of chance); ``skewed``: the same, but the first half of the documents (rank 0's with
two ranks, without a seed) are 4x longer (sources of different length read in order).

    python benchmarks/packed_ranks.py [--docs 10000] [--seq-len 2048]
"""

from __future__ import annotations

import argparse

import numpy as np

import fastload
from fastload.core.packranks import equal_steps


def corpus(kind: str, docs: int, seed: int = 7) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(np.log(150), 0.9, docs)), 1, 2500).astype(int)
    if kind == "skewed":
        lengths[: docs // 2] = np.minimum(lengths[: docs // 2] * 4, 2500)
    else:
        rng.shuffle(lengths)
    return [np.ones(n, dtype=np.uint16) for n in lengths]


def blocks_per_rank(docs: list[np.ndarray], world: int, seq_len: int) -> list[int]:
    per = len(docs) // world
    out = []
    for rank in range(world):
        mine = docs[rank * per : (rank + 1) * per]  # contiguous shares, as ShardDataset without a seed
        packer = fastload.PackedSequences(mine, seq_len=seq_len, window=1000, even="none")
        out.append(sum(1 for _ in packer))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--seq-len", type=int, default=2048)
    args = parser.parse_args()
    print(
        f"{'corpus':8} {'ranks':>5} {'blocks per rank':>22} {'policy':>8} {'steps':>6} {'empty':>7} "
        f"{'dropped':>8} {'moved':>6}"
    )
    for kind in ("random", "skewed"):
        docs = corpus(kind, args.docs)
        for world in (2, 3, 8):
            avail = blocks_per_rank(docs, world, args.seq_len)
            total = sum(avail)
            shown = str(avail) if world < 8 else f"{min(avail)}..{max(avail)}"
            for even in ("balance", "pad", "drop"):
                plan = equal_steps(avail, even)
                empty = sum(plan.empty) / (plan.steps * world)
                dropped = sum(plan.dropped) / total
                moved = sum(n for _, _, n in plan.moves)
                print(
                    f"{kind:8} {world:5} {shown:>22} {even:>8} {plan.steps:6} {empty:7.2%} {dropped:8.2%} "
                    f"{moved:6}"
                )


if __name__ == "__main__":
    main()
