"""Fuzz targets: every parser Zephon runs on untrusted bytes, each a function of one byte string.

A target returns normally or raises one of the errors its parser documents (``FormatError``
from a codec, ``ValueError`` from an index parser, ``NotImplementedError`` for a JPEG kind the
region decoder leaves to others); anything else, a crash or a hang is a bug. Used by
``tests/fuzz/run.py`` (atheris, coverage-guided) and by ``tests/fuzz/test_corpus.py`` (every
corpus file, in the suite).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from zephon.errors import FormatError
from zephon.formats import jsonl, mds, parquet, records, webdataset
from zephon.formats import litdata as litdata_format
from zephon.formats.blob import Blob
from zephon.formats.index import RecordIndex
from zephon.refs import ShardInfo

FIXTURES = Path(__file__).parents[1] / "fixtures" / "data"
MAX_SAMPLES = 4096  # a fuzzed header may declare more: decoded, but not all of them


def _shard(name: str, n: int, data: bytes) -> ShardInfo:
    return ShardInfo(f"fuzz/{name}", n, len(data), "1")


def _samples(n: int) -> range:
    return range(min(n, MAX_SAMPLES))


def _decode(codec: Any, name: str, index: Any, data: bytes) -> None:
    """Every sample (up to :data:`MAX_SAMPLES`) of a shard of ``data`` decoded by ``codec``;
    a ``FormatError`` is what a codec may raise."""
    shard = _shard(name, index.num_samples, data)
    with contextlib.suppress(FormatError):
        codec.decode(shard, index, Blob([(0, data)]), _samples(index.num_samples))


def _scan(indexer: Any, data: bytes) -> None:
    for at in range(0, len(data), 4096):  # fed in pieces, as a discovery scan does
        indexer.feed(data[at : at + 4096])


def jsonl_lines(data: bytes) -> None:
    """Line indexing and decoding of a JSONL shard."""
    indexer = jsonl.LineIndexer()
    _scan(indexer, data)
    _decode(jsonl.JsonlCodec("fuzz"), "a.jsonl", RecordIndex(indexer.finish()), data)


def parquet_footer(data: bytes) -> None:
    """The footer of a Parquet file: its length field and its Thrift."""
    try:
        need = parquet.footer_length(data[-8:], len(data))
        parquet.index_from_footer(data[len(data) - need :], len(data), None)
    except ValueError:
        pass


def parquet_file(data: bytes) -> None:
    """A whole Parquet file: the footer, then every row group's pages through pyarrow."""
    try:
        need = parquet.footer_length(data[-8:], len(data))
        index = parquet.index_from_footer(data[len(data) - need :], len(data), None)
    except ValueError:
        return
    _decode(parquet.ParquetCodec("fuzz"), "a.parquet", index, data)


def tar_headers(data: bytes) -> None:
    """A WebDataset tar: the header scan, then every sample's members."""
    indexer = webdataset.TarIndexer()
    try:
        _scan(indexer, data)
        indexer.finish()
    except ValueError:
        return
    index = RecordIndex(webdataset.sample_offsets(indexer.members, len(data)))
    if index.offsets[-1] > len(data):
        return  # discovery refuses such a tar (a member past the end): "tar stream ends"
    _decode(webdataset.WebDatasetCodec("fuzz"), "a.tar", index, data)


def mds_index(data: bytes) -> None:
    """An MDS ``index.json`` (and the codec it configures)."""
    try:
        specs = mds.parse_mds_index(data)
        columns = {s.basename: (s.column_names, s.column_encodings, s.column_sizes) for s in specs}
        mds.MdsCodec("fuzz", columns, allow_pickle=False)
    except (ValueError, FormatError):
        pass


def litdata_index(data: bytes) -> None:
    """A LitData ``index.json`` (and the codec it configures)."""
    try:
        _, config = litdata_format.parse_litdata_index(data)
        litdata_format.LitDataCodec("fuzz", config, allow_pickle=False)
    except (ValueError, FormatError):
        pass


@cache
def _mds_codec() -> tuple[Any, int]:
    specs = mds.parse_mds_index((FIXTURES / "mds" / "index.json").read_bytes())
    s = specs[0]
    codec = mds.MdsCodec(
        "fuzz",
        {"fuzz/shard.mds": (s.column_names, s.column_encodings, s.column_sizes)},
        allow_pickle=False,
    )
    return codec, s.num_samples


def mds_samples(data: bytes) -> None:
    """An MDS shard: its offsets header, then every sample's columns."""
    codec, n = _mds_codec()
    _records(codec, "shard.mds", n, data)


@cache
def _litdata_codec() -> tuple[Any, int]:
    chunks, config = litdata_format.parse_litdata_index(
        (FIXTURES / "litdata" / "index.json").read_bytes()
    )
    return litdata_format.LitDataCodec("fuzz", config, allow_pickle=False), chunks[0][1]


def litdata_samples(data: bytes) -> None:
    """A LitData chunk: its offsets header, then every item's leaves."""
    codec, n = _litdata_codec()
    _records(codec, "chunk.bin", n, data)


def _records(codec: Any, name: str, n: int, data: bytes) -> None:
    try:
        index = records.parse_offsets_header(data, n, len(data))
    except ValueError:
        return
    _decode(codec, name, index, data)


def jpeg(data: bytes) -> None:
    """A JPEG through the C binding (header, whole and region decodes) and the decode step."""
    from zephon.ops import jpeg as binding
    from zephon.ops.imagedecode import DecodeImage

    if binding.available():
        try:
            height, width, _ = binding.header(data)
        except ValueError:
            height = width = 0
        if 0 < height * width <= 4_000_000:
            for gray, scale in ((False, 1), (True, 2), (False, 8)):
                h, w = -(-height // scale), -(-width // scale)
                for box in ((0, 0, h, w), (h // 3, w // 4, max(1, h // 2), max(1, w // 2))):
                    with contextlib.suppress(ValueError, NotImplementedError):
                        binding.decode_region(data, gray, scale, box)
    with contextlib.suppress(FormatError):
        DecodeImage("jpg", max_pixels=4_000_000)({"jpg": data})


@cache
def _chat() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from zephon.ops.chat import ChatTokenize

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        ["user assistant system hello"] * 10,
        trainers.BpeTrainer(
            vocab_size=280,
            special_tokens=["<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
        "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>' }}"
        "{% endgeneration %}{% else %}{{ m['content'] + '<|im_end|>' }}{% endif %}"
        "{{ '\\n' }}{% endfor %}"
    )
    return ChatTokenize(tok, chat_template=template)


def chat_messages(data: bytes) -> None:
    """A conversation record (JSON) through the chat template, the markers and the mask."""
    try:
        sample = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return
    try:
        (out,) = _chat().batch([sample if isinstance(sample, dict) else {"messages": sample}])
    except FormatError:
        return
    assert len(out["loss_mask"]) == len(out["input_ids"])
    assert set(np.unique(out["loss_mask"]).tolist()) <= {0, 1}


TARGETS: dict[str, Callable[[bytes], None]] = {
    "jsonl": jsonl_lines,
    "parquet-footer": parquet_footer,
    "parquet-file": parquet_file,
    "tar": tar_headers,
    "mds-index": mds_index,
    "mds-samples": mds_samples,
    "litdata-index": litdata_index,
    "litdata-samples": litdata_samples,
    "jpeg": jpeg,
    "chat": chat_messages,
}
