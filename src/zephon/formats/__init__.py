"""Formats: shard indexes and decoders of fetched bytes. Synchronous and free of I/O, so that
decoding can run in a process pool."""
