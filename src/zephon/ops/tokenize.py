"""tokenize: text to token ids, a block at a time with the tokenizer's batch encoder.

Accepted tokenizers: a Hugging Face ``tokenizers.Tokenizer``, a path to a ``tokenizer.json``,
a ``transformers`` tokenizer, a ``tiktoken`` encoding, or ``"bytes"`` (UTF-8 bytes as ids
0-255, BOS 256, EOS 257). The result is stored as ``input_ids`` (int32 numpy array).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from zephon.errors import ConfigError

__all__ = ["Tokenize"]

_BOS_NAMES = ("<s>", "<bos>", "[BOS]", "<|begin_of_text|>", "<|startoftext|>", "[CLS]")
_EOS_NAMES = ("</s>", "<eos>", "[EOS]", "<|end_of_text|>", "<|endoftext|>", "[SEP]")


class Tokenize:
    """A picklable ``map`` step: ``sample[field]`` -> ``sample["input_ids"]``.

    Args:
        tokenizer: see the module docstring.
        field: the text field.
        max_length: truncate to this many ids (BOS/EOS included); ``None``: no limit.
        bos, eos: ``True`` to add the tokenizer's own BOS/EOS (found by its usual names),
            ``False`` for none, or an explicit id.

    Raises:
        ConfigError: an unknown tokenizer, or BOS/EOS requested but not found.
    """

    def __init__(
        self,
        tokenizer: Any,
        field: str = "text",
        max_length: int | None = None,
        bos: bool | int = True,
        eos: bool | int = True,
    ) -> None:
        if isinstance(tokenizer, str | os.PathLike) and tokenizer != "bytes":
            tokenizer = self._from_file(os.fspath(tokenizer))
        self.tokenizer = tokenizer
        self.kind = self._kind(tokenizer)
        # Rust encoders (tokenizers, tiktoken, fast transformers tokenizers) release the GIL:
        # in process, the pipeline runs them on a thread of its own.
        self.releases_gil = self.kind != "bytes"
        self.field = field
        if max_length is not None and max_length < 1:
            raise ConfigError(f"max_length must be >= 1 or None, got {max_length}")
        self.max_length = max_length
        self.bos = self._special(bos, _BOS_NAMES, 256, "bos")
        self.eos = self._special(eos, _EOS_NAMES, 257, "eos")

    @staticmethod
    def _from_file(path: str) -> Any:
        """A ``tokenizer.json`` file; anything else (a hub name, a missing path) is refused
        with what ``tokenize()`` accepts: Zephon never downloads a tokenizer itself."""
        if not os.path.isfile(path):
            raise ConfigError(
                f"tokenize() got {path!r}, which is not a tokenizer.json file: pass a "
                "tokenizers.Tokenizer, a path to a tokenizer.json, a transformers tokenizer "
                "(e.g. AutoTokenizer.from_pretrained(...)), a tiktoken encoding or 'bytes'"
            )
        from tokenizers import Tokenizer

        try:
            return Tokenizer.from_file(path)
        except Exception as exc:
            raise ConfigError(f"tokenize(): {path!r} is not a tokenizer.json ({exc})") from None

    @staticmethod
    def _kind(tokenizer: Any) -> str:
        if tokenizer == "bytes":
            return "bytes"
        if hasattr(tokenizer, "encode_ordinary_batch"):
            return "tiktoken"
        if hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "token_to_id"):
            return "tokenizers"
        if callable(tokenizer) and hasattr(tokenizer, "convert_tokens_to_ids"):
            return "transformers"
        raise ConfigError(
            f"unsupported tokenizer {type(tokenizer).__name__}: pass a tokenizers.Tokenizer, a "
            "tokenizer.json path, a transformers tokenizer, a tiktoken encoding or 'bytes'"
        )

    def _special(
        self, value: bool | int, names: tuple[str, ...], byte_id: int, what: str
    ) -> int | None:
        if value is False:
            return None
        if not isinstance(value, bool):
            return int(value)
        if self.kind == "bytes":
            return byte_id
        if self.kind == "transformers":  # a transformers tokenizer names its own
            own = getattr(self.tokenizer, f"{what}_token_id", None)
            if own is not None:
                return int(own)
        for name in names:
            found = self._token_id(name)
            if found is not None:
                return found
        raise ConfigError(f"{what}=True but the tokenizer has none of {list(names)}; pass an id")

    def _token_id(self, name: str) -> int | None:
        t = self.tokenizer
        if self.kind == "tokenizers":
            found = t.token_to_id(name)
            return int(found) if found is not None else None
        if self.kind == "transformers":
            found = t.convert_tokens_to_ids(name)
            return int(found) if found is not None and found != t.unk_token_id else None
        if self.kind == "tiktoken":
            return int(t.encode_single_token(name)) if name in t.special_tokens_set else None
        return None

    def encode(self, texts: list[str]) -> list[list[int]]:
        t = self.tokenizer
        if self.kind == "bytes":
            return [list(s.encode("utf-8")) for s in texts]
        if self.kind == "tokenizers":
            return [e.ids for e in t.encode_batch(texts, add_special_tokens=False)]
        if self.kind == "tiktoken":
            return [list(x) for x in t.encode_ordinary_batch(texts)]
        return [list(x) for x in t(texts, add_special_tokens=False)["input_ids"]]

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return self.batch([sample])[0]

    def batch(self, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        try:
            texts = [s[self.field] for s in samples]
        except (KeyError, TypeError):
            raise ConfigError(f"tokenize(): samples have no {self.field!r} text field") from None
        bos, eos = self.bos, self.eos
        head = [bos] if bos is not None else []
        tail = [eos] if eos is not None else []
        if self.kind == "bytes":  # straight from the UTF-8 buffer, no list of ints
            h, t = np.array(head, np.int32), np.array(tail, np.int32)
            arrays = [np.concatenate((h, np.frombuffer(x.encode("utf-8"), np.uint8), t),
                                     dtype=np.int32) for x in texts]  # fmt: skip
        elif head or tail:
            arrays = [np.array([*head, *ids, *tail], dtype=np.int32) for ids in self.encode(texts)]
        else:
            arrays = [np.array(ids, dtype=np.int32) for ids in self.encode(texts)]
        if self.max_length is not None:
            arrays = [a[: self.max_length] for a in arrays]
        out = [{**sample, "input_ids": a} for sample, a in zip(samples, arrays, strict=True)]
        return out
