"""Tar shards (WebDataset convention): headers, writer, header scan, in-memory index."""
