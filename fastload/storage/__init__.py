"""Local paths and s3:// URLs behind one face: open, read, list, publish; the cache of remote shards."""
