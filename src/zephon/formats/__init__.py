"""Formats: shard indexes and codecs of fetched bytes (:mod:`.codec`). Synchronous and free
of I/O, so that decoding can run in a process pool; the codecs that read by themselves
(Vortex, Lance) go through Zephon's storage or the format's own reader, off the event loop.

| module | owns |
| --- | --- |
| ``blob`` | The fetched bytes of one read: byte ranges of one shard |
| ``codec`` | the codec protocol every format implements, and its defaults |
| ``compression`` | Decompression for shards compressed as a whole: streamed (JSONL ``.gz`` |
| ``index`` | Shard indexes: where each sample's bytes lie inside a shard |
| ``jsondata`` | JSON read from data files (records, ``index.json`` files |
| ``jsonl`` | JSON Lines: one JSON object per line |
| ``lance`` | Lance datasets: fragments are shards, read by Lance itself |
| ``litdata`` | LitData |
| ``mds`` | MosaicML Streaming |
| ``parquet`` | Parquet footers, read without pyarrow: row counts, where column chunks lie |
| ``parquet_arrow`` | Parquet row groups decoded with Arrow, on a codec's first decode |
| ``project`` | column projection for formats whose samples are whole records |
| ``records`` | helpers shared by the "header + offsets + samples" layouts (MDS, LitData) |
| ``tarblocks`` | tar headers read many at a time: the members of a run of WebDataset samples |
| ``thrift`` | A reader for the Thrift compact protocol, enough to walk a Parquet footer |
| ``vortex`` | Vortex files: a shard per file, read through Zephon's storage |
| ``webdataset`` | WebDataset: tar files where the members sharing a key |
"""
