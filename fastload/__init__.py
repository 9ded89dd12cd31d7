"""fastload: keep GPUs fed. Pack small files into shards and read them fast, locally or from S3.

Heavy dependencies (pyarrow, boto3) are imported where first needed, so ``fastload`` starts quickly.
"""

from fastload import errors
from fastload.config import PackConfig, S3Config
from fastload.copy import copy
from fastload.core.index import DatasetIndex, ShardEntry
from fastload.opener import open
from fastload.pack import PackReport, pack
from fastload.stats import s3_stats
from fastload.verify import VerifyReport, verify

__version__ = "0.1.0"

__all__ = [
    "DatasetIndex",
    "PackConfig",
    "PackReport",
    "S3Config",
    "ShardEntry",
    "VerifyReport",
    "__version__",
    "copy",
    "errors",
    "open",
    "pack",
    "s3_stats",
    "verify",
]
