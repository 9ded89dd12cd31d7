"""Training-side reading: the only torch imports besides ``bench``. May import ``core``, ``formats``,
``storage``, ``s3`` and the base modules.

Owns: the dataset opened once for reading (``view``: index, filters and counts, cache, full entries), held
by ``ShardDataset`` (``dataset``; its options in ``options``, its source in ``source``, its position and
state in ``position``, shard runs in ``reading`` and ``shardread``), ``fastload.DataLoader`` (``loader``,
with ``chunks``: batches made in workers), shared-memory batch slots (``shmbatch``), ordered prefetch of read
tasks (``prefetch``), decoders (``decode``), collate functions (``collate``), ``PackedSequences``
(``packed``), ``fastload.loader`` and the device prefetcher (``feed``), ``MapDataset``
(``mapview``, its open shards in ``mapshards``). Names torch does not document are used only in
``torchprivate``.

Also: ``fastload.Mix`` (``mix``, its plan ``mixplan``, a worker's reads ``mixread``, its weights
``mixweights``, its checkpoint's checks ``mixstate``), filters (``filtering``), one open shard
(``shardreader``), damaged samples skipped (``damaged``), sample tables between epochs (``tablememo``),
checkpoint checks (``statecheck``), shared-memory files (``shmfiles``), PackedSequences' documents
(``packdocs``), state (``packstate``) and equal steps (``packsync``), GPU decode (``gpudecode``) and
utilisation (``gpumon``), the device prefetcher (``device``), per-stage telemetry summed over workers
(``telemetry``), published every N steps and compared across ranks (``publish``) to its exporters
(``exporters``), ``DataLoader(autotune=True)``'s tuner (``autotune``), and ``fastload.serve``: batches
made by remote feeders, Ray actors (``serve``; what a feeder runs and how a batch travels: ``feeder``)."""
