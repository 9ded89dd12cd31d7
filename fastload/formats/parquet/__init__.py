"""Parquet shards: the writer."""
