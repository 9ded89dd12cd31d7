"""S3: the only boto3/botocore imports. May import ``core`` and the base modules (``errors``, ``config``).

Owns: clients and error classification (``client``), the process's clients, connection pools, gates, part
buffers and counters with one lifetime (``runtime``), the direct SigV4 transport (``transport``), the retry
loop (``retrying``), the AIMD gate (``gate``), the parallel ranged reader (``reader``, behind
``fastload.open``), part buffers (``partbuffers``), multipart uploads (``upload``), ListObjectsV2
(``listing``), request counters (``stats``, behind ``fastload.s3_stats``).

Also: the direct transport's HTTP/1.1 (``http1``), hedged GETs (``hedging``), deletes (``delete``) and
bucket creation (``buckets``, ``fastload mb``)."""
