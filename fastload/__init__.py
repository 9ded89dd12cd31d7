"""fastload: keep GPUs fed. Pack small files into shards and read them fast."""

from fastload import errors
from fastload.config import PackConfig
from fastload.core.index import DatasetIndex, ShardEntry
from fastload.pack import PackReport, pack
from fastload.verify import VerifyReport, verify

__version__ = "0.1.0"

__all__ = [
    "DatasetIndex",
    "PackConfig",
    "PackReport",
    "ShardEntry",
    "VerifyReport",
    "__version__",
    "errors",
    "pack",
    "verify",
]
