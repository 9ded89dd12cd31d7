"""Packing datasets. May import ``core``, ``formats``, ``storage``, ``s3`` and the base modules.

- ``driver``: the one pack driver every pack runs through: a plan (what to write, its jobs, its index and
  report) in; destination and journal, "already complete", engine, progress bar, ``index.json`` last out;
- its plans: files (``plan``: list, group, order, cut: :class:`~fastload.packing.plan.PackPlan` ->
  ``write``: :class:`~fastload.packing.write.FileShard` jobs -> ``pack``: ``fastload.pack``, ``FilesPlan``)
  -> ``report``; token documents (``token_inputs`` -> ``token_docs`` -> ``token_shards`` -> ``tokens``:
  ``pack_tokens``, ``TokensPlan``; ``token_report``: its report); rows of tables (Parquet/CSV/JSONL:
  ``tabular``: plan, ``RowsPlan``, ``pack_table`` -> ``table_shards``:
  :class:`~fastload.packing.table_shards.TableShard` jobs; which sources are tables: ``tablenames``, by
  name, without importing pyarrow); samples from
  Python (``encode``: values to bytes, checked -> ``samplewriter``: :class:`SampleWriter`, cut on the fly
  into ``memshard`` jobs -> ``shardwriter``: ``fastload.ShardWriter``; ``parts``: several writers, one
  dataset, and their merge);
- all run on ``engine`` (the public engine interface and the local threads engine) or ``ray_engine``, write
  into a ``dest`` (local folder, ``s3dest``, or ``storedest``: ``gs://`` and ``az://``) and keep a
  ``journal`` for resume;
- ``append`` (``pack --append``: any plan of files or rows appended as a new version; ``append_samples``:
  a sample writer's plan appended, for ``ShardWriter(mode="append")`` and ``optimize(mode="append")``);
- ``ray_sink`` (``fastload.from_ray``), ``indexing`` (``fastload index``), ``verify``, ``progress``.

Also: ``options`` (what of a PackConfig decides the bytes), ``staging`` (local staging folders of packs to
S3), ``tokenizer_hook`` (``--tokenizer``), ``upgrade`` (``fastload index --upgrade``), ``guarded`` (its
rewrite of ``index.json`` refused when an append published meanwhile).

``optimize`` (``fastload.optimize``: a function of each input run in worker processes, ``fanout``: the
ordered chunked map, its samples written in input order; ``optimize_journal``: where each shard ends in the
inputs, for resume; ``optimize_report``: its report; ``input_lines``: the inputs of ``fastload optimize
--inputs FILE``)."""
