"""Shard formats: the only place that knows a format's bytes (tar, Parquet, TFRecord)."""
