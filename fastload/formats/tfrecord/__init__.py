"""TFRecord shards: framing, CRC32C, the tf.train.Example codec, writer and reader."""
