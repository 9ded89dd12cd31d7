"""Configuration dataclasses (frozen, keyword-only, units in names), validated on construction."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastload.errors import ConfigError

PARQUET_COMPRESSIONS = ("none", "snappy", "zstd", "gzip", "lz4", "brotli")


@dataclass(frozen=True, kw_only=True)
class PackConfig:
    """Options of ``fastload pack``.

    Memory bound while packing: about ``workers x 1 MiB`` (tar: one copy buffer per writer) or
    ``workers x row_group_bytes`` (Parquet: one row group per writer), plus the listing's metadata
    (about 300 bytes per file). Neither depends on the dataset's total size.
    """

    shard_format: str = "tar"
    shard_size_bytes: int = 256 << 20
    max_samples: int | None = None
    prefix: str = "shard"
    shuffle_seed: int | None = None
    workers: int | None = None
    row_group_bytes: int = 64 << 20
    compression: str = "none"
    partition_level: int | None = None
    partition_name: str | None = None
    resume: bool = False
    allow_skip: bool = False
    fsync: bool = False
    append: bool = False  # add the shards to the dataset at the destination as a new version
    progress: bool | None = None
    include_hidden: bool = False  # pack hidden files and folders too (.DS_Store, .git/); default: left out
    exclude: tuple[str, ...] = ()  # globs of paths to leave out (see fastload.core.pathrules)
    prefix_sources: bool = False  # keys start with each source folder's name (sources with the same names)

    def __post_init__(self) -> None:
        # (shard_format is checked against the format registry where a pack starts, packing.options:
        # formats import this module, so it cannot import them)
        if not isinstance(self.shard_format, str) or not self.shard_format:
            raise ConfigError(f"shard_format={self.shard_format!r} must name a shard format, e.g. 'tar'")

        exclude = (self.exclude,) if isinstance(self.exclude, str) else tuple(self.exclude)
        if not all(isinstance(g, str) and g.strip("/") for g in exclude):
            raise ConfigError(f"exclude={self.exclude!r}: give non-empty globs such as '*.tmp' or 'cache/'")
        object.__setattr__(self, "exclude", exclude)
        if self.shard_size_bytes < 4096:
            raise ConfigError(
                f"shard_size_bytes={self.shard_size_bytes} is too small; use at least 4 KiB "
                "(a few hundred MiB is typical)"
            )
        if self.max_samples is not None and self.max_samples < 1:
            raise ConfigError(f"max_samples={self.max_samples} must be >= 1")
        if not self.prefix or "/" in self.prefix or self.prefix.startswith("."):
            raise ConfigError(
                f"prefix={self.prefix!r} must be a non-empty file name part without '/' "
                "that does not start with '.'"
            )
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"workers={self.workers} must be >= 1")
        if not 1 <= self.row_group_bytes <= 1 << 30:
            raise ConfigError(f"row_group_bytes={self.row_group_bytes} must be between 1 byte and 1 GiB")
        if self.compression not in PARQUET_COMPRESSIONS:
            raise ConfigError(
                f"compression={self.compression!r}; choose one of {', '.join(PARQUET_COMPRESSIONS)}"
            )
        if self.partition_level is not None and self.partition_level < 0:
            raise ConfigError(f"partition_level={self.partition_level} must be >= 0 (0 = top folder)")
        if self.partition_name is not None and (
            not self.partition_name or "/" in self.partition_name or "=" in self.partition_name
        ):
            raise ConfigError(f"partition_name={self.partition_name!r} must be non-empty, without '/' or '='")

    @property
    def worker_count(self) -> int:
        return self.workers or os.cpu_count() or 1

    @property
    def partition_column(self) -> str | None:
        if self.partition_level is None:
            return None
        return self.partition_name or f"level{self.partition_level}"


def parse_header_lines(text: str) -> dict[str, str]:
    """``Name: value`` lines (``--header``, ``FASTLOAD_HTTP_HEADERS``) as a dict; :class:`ConfigError` for a
    line without a name and a colon (the value is never shown: it is often a token)."""
    headers: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, colon, value = line.partition(":")
        if not colon or not name.strip() or name != name.strip():
            raise ConfigError(  # (the line is not shown: it may be a token given without its name)
                f"a header of {len(line)} characters is not 'Name: value' with no space before the colon "
                '(e.g. --header "Authorization: Bearer $TOKEN")'
            )
        headers[name] = value.strip()
    return headers


@dataclass(frozen=True, kw_only=True)
class S3Config:
    """How fastload talks to S3 (or an S3-compatible store).

    Memory bound of one reader: ``readahead_bytes + part_size_bytes`` (parts fetched ahead, plus the part
    being consumed), where ``readahead_bytes`` defaults to ``part_size_bytes x max_concurrency``
    (4 MiB x 32 = 128 MiB with the defaults). A process also keeps the buffers of parts its readers have
    finished with for reuse (a fresh buffer costs a page fault per 4 KiB), at most ``readahead_bytes +
    part_size_bytes`` of them, so a process reading one object at a time holds at most twice that bound.
    Requests in flight across all readers of a process are capped by ``process_max_concurrency`` and lowered
    automatically while the store throttles (AIMD). Uploads use the same fields: parts of
    ``max(5 MiB, part_size_bytes)``, up to ``max_concurrency`` of them at once.

    The defaults favour many connections over big parts: per-connection bandwidth is capped (S3: about
    50-90 MB/s) and every GET pays a first-byte latency, so 32 connections of 4 MiB parts outrun 16 of 8 MiB
    for the same memory (``benchmarks/RESULTS.md``, "S3 reads").

    Unset fields fall back to botocore's own chain (environment, ``~/.aws/config``, instance roles).

    ``transport`` picks how the reader's GETs travel: ``"direct"`` (default) signs them with botocore's
    SigV4 signer and the client's credentials, endpoint and region, and sends them over pooled keep-alive
    HTTP/1.1 connections (``fastload.s3.http1``; about half the CPU per GiB); ``"botocore"`` sends them
    through ``get_object``, for stores or setups the direct path does not handle (non-SigV4 signing,
    botocore plugins, region redirects).

    Tail tolerance (direct transport): a GET that lags far behind what this endpoint normally does (no
    response head, or no body bytes, for 3x this endpoint's p99, never less than ``hedge_floor_s``; or past
    3x the p95 time of its size; 10x ``hedge_floor_s`` while too few GETs are known; 3x the median first
    byte for a GET without a head that is all its reader still waits for) gets a second GET for its
    remaining bytes on a new connection (2 concurrent ranges for one without a head); the first to finish
    is kept. Time this process did not run (a loaded machine) is not counted as lag. ``hedge`` caps hedges
    at that fraction of GETs (0 turns them off); none are sent while the store throttles.
    ``read_timeout_s`` stays the hard limit of a silent connection (``fastload.core.hedge``).

    Other stores (``docs/stores.md``) read through the same reader and settings: ``unsigned`` sends S3
    requests without signing (public buckets; ``--no-sign-request``); ``headers`` are added to every
    ``http(s)://`` and ``hf://`` request (e.g. ``{"Authorization": "Bearer ..."}``; never logged or shown
    in ``repr``); ``hf_token`` (``HF_TOKEN``) authorises ``hf://`` requests to the Hub at ``hf_endpoint``
    (``HF_ENDPOINT``, default ``https://huggingface.co``).
    """

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    addressing_style: str = "auto"
    part_size_bytes: int = 4 << 20
    max_concurrency: int = 32
    readahead_bytes: int | None = None
    process_max_concurrency: int = 64
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    max_attempts: int = 20
    base_backoff_s: float = 0.05
    max_backoff_s: float = 4.0
    deadline_s: float = 120.0
    transport: str = "direct"
    hedge: float = 0.05
    hedge_floor_s: float = 0.05
    unsigned: bool = False
    headers: Mapping[str, str] | tuple[tuple[str, str], ...] = field(default=(), repr=False)
    hf_token: str | None = field(default=None, repr=False)
    hf_endpoint: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.headers, Mapping):  # kept as sorted pairs: the config stays hashable
            object.__setattr__(
                self, "headers", tuple(sorted((str(k), str(v)) for k, v in self.headers.items()))
            )
        for name, value in self.header_pairs:
            if not name or any(c in name + value for c in "\r\n") or ":" in name:
                raise ConfigError(
                    f"headers: {name!r} is not a valid HTTP header name (or its value has a newline)"
                )
        if not 0 <= self.hedge <= 1:
            raise ConfigError(f"hedge={self.hedge} must be within [0, 1] (0.05 is typical; 0: no hedging)")
        if self.hedge_floor_s <= 0:
            raise ConfigError(f"hedge_floor_s={self.hedge_floor_s} must be > 0 (0.05 s is the default)")
        if self.part_size_bytes < 1:
            raise ConfigError(f"part_size_bytes={self.part_size_bytes} must be >= 1 (8 MiB is typical)")
        if self.max_concurrency < 1:
            raise ConfigError(f"max_concurrency={self.max_concurrency} must be >= 1")
        if self.process_max_concurrency < 1:
            raise ConfigError(f"process_max_concurrency={self.process_max_concurrency} must be >= 1")
        if self.readahead_bytes is not None and self.readahead_bytes < 0:
            raise ConfigError(f"readahead_bytes={self.readahead_bytes} must be >= 0")
        if self.addressing_style not in ("auto", "path", "virtual"):
            raise ConfigError(f"addressing_style={self.addressing_style!r}; choose auto, path or virtual")
        if self.transport not in ("direct", "botocore"):
            raise ConfigError(f"transport={self.transport!r}; choose direct or botocore")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ConfigError("connect_timeout_s and read_timeout_s must be > 0")
        if self.max_attempts < 1 or self.deadline_s <= 0:
            raise ConfigError(
                f"max_attempts={self.max_attempts} must be >= 1 and deadline_s={self.deadline_s} > 0"
            )

    @property
    def header_pairs(self) -> tuple[tuple[str, str], ...]:
        """``headers`` as ``(name, value)`` pairs."""
        headers = self.headers
        return headers if isinstance(headers, tuple) else tuple(sorted(headers.items()))

    @property
    def readahead_parts(self) -> int:
        """Parts kept in flight or buffered ahead of the read position (at least 1)."""
        window = self.readahead_bytes
        if window is None:
            window = self.part_size_bytes * self.max_concurrency
        return max(1, window // self.part_size_bytes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> S3Config:
        """Settings from the standard AWS variables (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``,
        ``AWS_REGION``/``AWS_DEFAULT_REGION``, ``AWS_PROFILE``), ``FASTLOAD_S3_ADDRESSING_STYLE`` and
        ``FASTLOAD_S3_TRANSPORT``, ``FASTLOAD_S3_UNSIGNED`` (``--no-sign-request``), ``FASTLOAD_HTTP_HEADERS``
        (``--header``: ``Name: value`` lines),
        ``HF_TOKEN`` (or ``HUGGING_FACE_HUB_TOKEN``) and ``HF_ENDPOINT``; explicit ``overrides`` win."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        if endpoint:
            values["endpoint_url"] = endpoint
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        if region:
            values["region"] = region
        if env.get("AWS_PROFILE"):
            values["profile"] = env["AWS_PROFILE"]
        if env.get("FASTLOAD_S3_ADDRESSING_STYLE"):
            values["addressing_style"] = env["FASTLOAD_S3_ADDRESSING_STYLE"]
        if env.get("FASTLOAD_S3_TRANSPORT"):
            values["transport"] = env["FASTLOAD_S3_TRANSPORT"]
        if env.get("FASTLOAD_S3_UNSIGNED", "").lower() in ("1", "true", "yes"):
            values["unsigned"] = True
        if env.get("FASTLOAD_HTTP_HEADERS"):
            values["headers"] = parse_header_lines(env["FASTLOAD_HTTP_HEADERS"])
        token = env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN")
        if token:
            values["hf_token"] = token
        if env.get("HF_ENDPOINT"):
            values["hf_endpoint"] = env["HF_ENDPOINT"].rstrip("/")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
