"""Test helpers for fastload and its users: a fault-injecting HTTP proxy for S3 (``faultproxy``)."""
