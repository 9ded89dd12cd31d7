"""What a ``fastload.optimize`` run did: :class:`OptimizeReport`."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastload.core.index import DatasetIndex
from fastload.packing.fanout import Failure


@dataclass
class OptimizeReport:
    """What an ``optimize`` run did: ``inputs`` run (or skipped over, on resume), ``samples`` written,
    ``failures`` skipped (``on_error="skip"``: number, short repr, error), shards written and kept."""

    dst: str
    index: DatasetIndex
    inputs: int = 0
    samples: int = 0
    failures: list[Failure] = field(default_factory=list)
    shards_written: int = 0
    shards_kept: int = 0
    seconds: float = 0.0
    already_complete: bool = False

    def summary(self) -> str:
        shards = len(self.index.shards)
        if self.already_complete:
            return f"nothing to do: {self.dst} already holds this dataset ({self.index.samples:,} samples)"
        rate = f", {self.samples / self.seconds:,.0f} samples/s" if self.seconds else ""
        lines = [
            f"wrote {self.samples:,} samples from {self.inputs:,} inputs into {shards} "
            f"{self.index.shard_format} shard(s) in {self.dst} in {self.seconds:.1f}s{rate}"
        ]
        if self.shards_kept:
            lines.append(f"resumed: kept {self.shards_kept} finished shard(s), wrote {self.shards_written}")
        if self.failures:
            lines.append(f"skipped {len(self.failures)} input(s) the function raised on:")
            lines += [f"  #{f.number} {f.shown}: {f.error}" for f in self.failures[:50]]
            if len(self.failures) > 50:
                lines.append(f"  ... and {len(self.failures) - 50} more (all listed in index.json)")
        return "\n".join(lines)


__all__ = ["OptimizeReport"]
