"""Pure logic: plans and decisions. May import only itself and ``fastload.errors``: no files, sockets,
threads, clocks, env, torch or cloud SDKs here; callers pass ``now``, ``rng``, ``rank``, ``worker``.

Owns: sample keys and grouping (``keys``), shard planning (``plan``), the manifest schema (``index``), byte
ranges and the 206 contract (``ranges``), fault classes and backoff (``retry``), the AIMD limit
(``throttle``), the S3 latency model, deadlines and hedge budget (``hedge``), who reads which sample per
epoch, rank and worker (``sharding``; a rank's order as spans: ``refs``; the bounded sample shuffle:
``shuffle``), read tasks (``readplan``), sequence packing (``seqpack``), bench advice (``advice``), sizes
with units (``units``), random access arithmetic (``randomaccess``) and a bounded LRU (``lru``).

Also: row filters in pyarrow's DNF (``filters``), kept rows as runs (``selection``), the byte ranges of a
projected read (``projection``), sample tables (``table``), a format's per-shard data as core carries it
(``payload``), a
mixture's schedule (``mix``), packed blocks across ranks (``packranks``), which listed paths a pack leaves
out (``pathrules``), SigV4 headers (``sigv4``), GPU utilisation readings (``gpuutil``), what a
``fastload cp`` copies or skips (``syncplan``), web store URLs (``weburls``: brace patterns, ``hf://``
to the Hub's routes), a growing dataset's versions and appended shard names (``versions``), stable
digests of functions and input values (``fingerprint``, for ``optimize``'s resume check), loader
telemetry: counters, latency sketches and straggler causes (``telemetry``), the rules of a loader that
tunes itself, shared with the bench advice (``autotune``), its first search from above (``autoleap``:
a leap to the limits, trimmed back), and the ledger of
``fastload.serve``'s remote feeders (``serveplan``)."""
