"""TFRecord shards: framing, CRC32C, the tf.train.Example codec, writer and reader.

Modules: ``codec`` (framing and ``tf.train.Example``), ``writer``, ``reader``, ``index`` (files of other
tools) and ``format`` (the :class:`ShardFormat` adapter)."""
