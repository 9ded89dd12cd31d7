"""Tar shards (WebDataset convention), the only place that knows tar's bytes.

- ``header``: member headers built (deterministic pax/ustar) and parsed (every dialect), one block at a time;
- ``scan``: the one member walker (extended headers, directories skipped, links and devices refused) over a
  stream or bytes in memory, used by read, index and verify alike;
- ``reader``: a run of samples of an indexed shard (:func:`reader.read_run`), with the C reader behind it;
- ``writer``: shards written from samples; ``index``: an index built for tars written by other tools.

Imports ``fastload.core``, ``fastload.storage``, ``fastload.formats.native`` and ``fastload.errors``.

Also ``format`` (the :class:`ShardFormat` adapter), ``check`` (verify), ``crcs`` (each sample's CRC32C)
and ``layout`` (the member layout: tar's per-shard payload in the index)."""
