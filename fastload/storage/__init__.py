"""Local paths, ``s3://`` and web (``http(s)://``, ``hf://``) URLs behind one face. May import ``core``,
``s3`` and the base modules.

Owns: open/read/size/list of a URL (``access``), ``fastload.open`` (``opener``), the dataset manifest
(``manifest``: ``index.json`` from a folder or prefix), the local cache of remote shards (``cache``), local
and S3 listing of pack sources (``listing``, ``s3source``), a sample's input files with read-ahead
(``inputs``), atomic local writes (``localfs``).

Also: a file served by byte ranges (``rangedfile``), per-shard sample tables (``tables``), URL
checks (``urls``), lock files between processes (``locks``), what ``fastload cp`` finds at both ends and
which objects are already the same (``syncscan``); ``http(s)://`` and ``hf://`` objects and the Hub's
listing (``web``); ``fastload cp`` from local files to ``gs://`` and ``az://`` (``gcsupload``); an
append-only log of lines as segment objects in a store, written by a thread (``objectlog``: loader
telemetry to ``s3://``, ``gs://``, ``az://``)."""
