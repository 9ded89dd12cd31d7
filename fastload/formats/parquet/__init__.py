"""Parquet shards: the writer.

- ``format``: the format (planning sizes, the writer, the read path, verify); ``writer``: one shard;
- ``footer``: footers as bytes and metadata; ``arrowfile``: every Parquet file opened safely;
  ``sparse``: a projected read's bytes as a file; ``values``: column values as sample values;
- ``select`` and ``stats``: which rows a filter keeps, from statistics; ``foreign``: indexes of other
  tools' files; ``check``: verify and lint; ``payload``: its per-shard data in the index (footer, stats)."""
