"""Packing datasets. May import ``core``, ``formats``, ``storage``, ``s3`` and the base modules.

- ``driver``: the one pack driver every pack runs through: a plan (what to write, its jobs, its index and
  report) in; destination and journal, "already complete", engine, progress bar, ``index.json`` last out;
- its plans: files (``plan``: list, group, order, cut: :class:`~fastload.packing.plan.PackPlan` ->
  ``write``: :class:`~fastload.packing.write.FileShard` jobs -> ``pack``: ``fastload.pack``, ``FilesPlan``)
  -> ``report``; token documents (``token_inputs`` -> ``token_docs`` -> ``token_shards`` -> ``tokens``:
  ``pack_tokens``, ``TokensPlan``); rows of tables (Parquet/CSV/JSONL: ``tabular``: plan, ``RowsPlan``,
  ``pack_table`` -> ``table_shards``: :class:`~fastload.packing.table_shards.TableShard` jobs);
- all run on ``engine`` (the public engine interface and the local threads engine) or ``ray_engine``, write
  into a ``dest`` (local folder, ``s3dest``, ``gcsdest`` or ``azdest``) and keep a ``journal`` for resume;
- ``ray_sink`` (``fastload.from_ray``), ``indexing`` (``fastload index``), ``verify``, ``progress``.

Also: ``options`` (what of a PackConfig decides the bytes), ``staging`` (local staging folders of packs to
S3), ``tokenizer_hook`` (``--tokenizer``), ``upgrade`` (``fastload index --upgrade``)."""
