"""Helpers for fastload's tests and its users' tests: a fault-injecting S3 proxy (``faultproxy``, with
``faultplan``, ``proxyconn``, ``httpwire``, ``sigv4``) and an embedded read-only S3 endpoint over a folder
(``s3serve``, which ``fastload bench`` runs; it answers GCS's and Azure's read APIs too: ``storedialects``),
and a web server over a folder with Range and the Hub's routes
(``httpserve``), both served on a thread (``serving``). Imports nothing else of fastload but ``errors``.
"""
