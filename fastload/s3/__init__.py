"""S3: client settings (the only boto3/botocore imports), transport, ranged reader, uploads, listing,
gate, stats."""
