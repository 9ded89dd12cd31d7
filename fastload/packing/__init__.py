"""Packing datasets: listing, grouping, planning, writing shards through formats, journal and resume;
the local and Ray engines; index and verify."""
