"""Options of ``fastload bench``: one frozen dataclass, three size profiles, validation with the fix named."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from fastload.errors import ConfigError

COMPARE_CHOICES = ("naive", "webdataset")
STEP_MODES = ("sleep", "busy")


@dataclass(frozen=True)
class Profile:
    """Sizes of one run: generated images (or samples taken from a SOURCE), the ``num_workers`` sweep,
    interleaved repetitions, seconds of steady state per measurement and of the training simulation."""

    images: int
    workers: tuple[int, ...]
    reps: int
    budget_s: float
    train_s: float
    stage_samples: int


PROFILES: dict[str, Profile] = {
    "quick": Profile(images=600, workers=(0, 2), reps=1, budget_s=0.25, train_s=1.0, stage_samples=96),
    "default": Profile(images=3000, workers=(0, 2, 4), reps=3, budget_s=0.5, train_s=1.5, stage_samples=256),
    "full": Profile(
        images=20000, workers=(0, 1, 2, 4, 8), reps=5, budget_s=2.0, train_s=8.0, stage_samples=1024
    ),
}


def default_cache_dir(environ: dict[str, str] | None = None) -> str:
    """``$XDG_CACHE_HOME/fastload/bench``, else ``~/.cache/fastload/bench``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastload", "bench")


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    """Everything a run needs; None means "the profile's value" (see :data:`PROFILES`).

    ``latency_ms``/``conn_mbps`` configure the embedded endpoint (MB/s = 10^6 bytes/s per connection);
    ``step_ms`` is the simulated compute per batch (``step_mode`` sleep: the CPU is free, as while a GPU
    computes; busy: it is not), ``model=True`` runs a small real torch model instead.
    """

    source: str | None = None
    endpoint_url: str | None = None
    profile: str = "default"
    images: int | None = None
    workers: tuple[int, ...] | None = None
    reps: int | None = None
    budget_s: float | None = None
    train_s: float | None = None
    stage_samples: int | None = None
    num_workers: int | None = None
    batch_size: int = 32
    image_px: int = 64
    step_ms: float = 25.0
    step_mode: str = "sleep"
    model: bool = False
    device: str | None = None
    latency_ms: float = 20.0
    conn_mbps: float = 50.0
    compare: tuple[str, ...] = ("naive",)
    cache_dir: str | None = None
    seed: int = 0
    json_path: str | None = None
    plot_path: str | None = None
    progress: bool | None = None

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ConfigError(f"profile={self.profile!r}; choose one of {', '.join(PROFILES)}")
        for name in ("images", "reps", "stage_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name}={value} must be >= 1")
        if self.workers is not None and (not self.workers or min(self.workers) < 0):
            raise ConfigError(f"workers={self.workers}: give one or more num_workers values >= 0, e.g. 0,2,4")
        if self.num_workers is not None and self.num_workers < 0:
            raise ConfigError(f"num_workers={self.num_workers} must be >= 0")
        if self.batch_size < 1 or self.image_px < 8:
            raise ConfigError(f"batch_size={self.batch_size} must be >= 1 and image_px={self.image_px} >= 8")
        if self.step_ms < 0 or self.latency_ms < 0 or self.conn_mbps < 0:
            raise ConfigError("step_ms, latency_ms and conn_mbps must be >= 0 (conn_mbps 0 = no cap)")
        for name in ("budget_s", "train_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name}={value} must be > 0 seconds")
        if self.step_mode not in STEP_MODES:
            raise ConfigError(f"step_mode={self.step_mode!r}; choose one of {', '.join(STEP_MODES)}")
        unknown = [c for c in self.compare if c not in COMPARE_CHOICES]
        if unknown:
            raise ConfigError(
                f"compare={unknown}: choose from {', '.join(COMPARE_CHOICES)} (comma-separated)"
            )
        if self.device is not None and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ConfigError(f"device={self.device!r}; use cpu or cuda[:N]")
        if self.endpoint_url is not None and not (self.source or "").startswith("s3://"):
            raise ConfigError(
                "--endpoint applies to an s3:// SOURCE; without SOURCE the embedded endpoint is used"
            )

    def resolved(self) -> BenchOptions:
        """A copy with every None filled from the profile (and ``num_workers`` from the machine)."""
        p = PROFILES[self.profile]
        cores = os.cpu_count() or 1
        return replace(
            self,
            images=self.images or p.images,
            workers=self.workers or p.workers,
            reps=self.reps or p.reps,
            budget_s=self.budget_s or p.budget_s,
            train_s=self.train_s or p.train_s,
            stage_samples=self.stage_samples or p.stage_samples,
            num_workers=self.num_workers if self.num_workers is not None else min(cores, 8),
            cache_dir=self.cache_dir or default_cache_dir(),
        )

    @property
    def latency_s(self) -> float:
        return self.latency_ms / 1000

    @property
    def conn_bytes_per_s(self) -> float | None:
        return self.conn_mbps * 1e6 if self.conn_mbps > 0 else None
