"""Training-side reading: ShardDataset, DataLoader, batch transport, prefetch, decode, collate,
PackedSequences, device feed. The only torch imports besides bench."""
