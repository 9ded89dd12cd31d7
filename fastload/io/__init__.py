"""All I/O: local files, (later) S3, shard writers, threads. Decisions come from ``fastload.core``."""
