"""S3: the only boto3/botocore imports. May import ``core`` and the base modules (``errors``, ``config``).

Owns: clients and error classification (``client``), the process's clients, connection pools, gates, part
buffers and counters with one lifetime (``runtime``), the direct SigV4 transport (``transport``), the retry
loop (``retrying``), the AIMD gate (``gate``), the parallel ranged reader (``reader``, behind
``fastload.open``), part buffers (``partbuffers``), multipart uploads (``upload``), ListObjectsV2
(``listing``), request counters (``stats``, behind ``fastload.s3_stats``).

Also: the seam between the reader and a store's transport (``objectio``: responses, aborts, the one body
loop, what is known of the object), one part's fetch (``partfetch``), the races between a GET and its hedges
and the hedges themselves (``races``), the hedging watchdog (``hedging``), the direct transport's HTTP/1.1
(``http1``), deletes (``delete``), bucket creation (``buckets``, ``fastload mb``), server-side copies
(``servercopy``: CopyObject, UploadPartCopy) and conditional PUTs (``conditional``: ``index.json``
published with If-Match / If-None-Match); plain HTTP(S) as a store (``httpstore``: the web store's
transport behind the same seam, no signing) and its errors (``urlerrors``); Google Cloud Storage as a store
(``gcsstore``: its JSON API over the same pools, the generation as the ETag; ``gcswrite``: uploads, deletes,
metadata); Azure Blob Storage as a store (``azstore``: Shared Key or SAS, the ETag honoured by If-Match;
``azwrite``: Put Blob, deletes, sizes); the one whole request with its retries that both stores' writes
send (``httpcall``)."""
