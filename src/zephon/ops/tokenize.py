"""tokenize: text to token ids, a block at a time with the tokenizer's batch encoder.

Accepted tokenizers: a Hugging Face ``tokenizers.Tokenizer``, a path to a ``tokenizer.json``,
a ``transformers`` tokenizer, a ``tiktoken`` encoding, or ``"bytes"`` (UTF-8 bytes as ids
0-255, BOS 256, EOS 257). The result is stored as ``input_ids`` (int32 numpy array).
"""

from __future__ import annotations

import os
from typing import Any, Literal

import numpy as np

from zephon.errors import ConfigError

__all__ = ["SplitLong", "Tokenize", "special_flags", "tokenize_ops"]

_SPECIAL = {"bos_eos": (True, True), "bos": (True, False), "eos": (False, True),
            "none": (False, False)}  # fmt: skip


def special_flags(special_tokens: str) -> tuple[bool, bool]:
    """``(bos, eos)`` of a ``special_tokens`` name."""
    try:
        return _SPECIAL[special_tokens]
    except KeyError:
        raise ConfigError(
            f"special_tokens must be one of {sorted(_SPECIAL)}, got {special_tokens!r}"
        ) from None


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
        bos: bool | int | Literal["auto"] = "auto",
        eos: bool | int | Literal["auto"] = "auto",
        pad_to: int | None = None,
        pad_id: int = 0,
        attention_mask: bool = False,
    ) -> None:
        self.pad_to, self.pad_id, self.attention_mask = pad_to, pad_id, attention_mask
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
        self, value: bool | int | str, names: tuple[str, ...], byte_id: int, what: str
    ) -> int | None:
        """The id of the ``bos``/``eos`` token: ``"auto"`` (the default) takes the
        tokenizer's own if it has one (a GPT-2 style tokenizer has only an end-of-text token:
        no BOS then), ``True`` requires one, an int is the id itself."""
        if value is False:
            return None
        if value == "auto" and isinstance(value, str):
            try:
                return self._special(True, names, byte_id, what)
            except ConfigError:
                return None
        if isinstance(value, str) or not isinstance(value, bool | int):
            raise ConfigError(f"{what} must be 'auto', True, False or a token id, got {value!r}")
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
        if self.kind == "tokenizers":  # the fast variant skips offsets (0.20+): same ids
            batch = getattr(t, "encode_batch_fast", None) or t.encode_batch
            return [e.ids for e in batch(texts, add_special_tokens=False)]
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
            arrays = [
                np.concatenate((h, np.frombuffer(x.encode("utf-8"), np.uint8), t), dtype=np.int32)
                for x in texts
            ]
        elif head or tail:
            arrays = [np.array([*head, *ids, *tail], dtype=np.int32) for ids in self.encode(texts)]
        else:
            arrays = [np.array(ids, dtype=np.int32) for ids in self.encode(texts)]
        if self.max_length is not None:
            arrays = [a[: self.max_length] for a in arrays]
        if self.pad_to is not None or self.attention_mask:
            return [
                {**sample, **self._padded(a)} for sample, a in zip(samples, arrays, strict=True)
            ]
        out = [{**sample, "input_ids": a} for sample, a in zip(samples, arrays, strict=True)]
        return out

    def _padded(self, ids: np.ndarray) -> dict[str, Any]:
        n = len(ids)
        if self.pad_to is not None and n < self.pad_to:
            ids = np.concatenate((ids, np.full(self.pad_to - n, self.pad_id, np.int32)))
        out: dict[str, Any] = {"input_ids": ids}
        if self.attention_mask:
            mask = np.zeros(len(ids), np.int8)
            mask[:n] = 1
            out["attention_mask"] = mask
        return out


class SplitLong:
    """A stateless flat-map op: a sample whose ``input_ids`` exceed ``max_length`` becomes
    pieces of at most ``max_length`` ids, each a sample with its ``piece`` number (resumes
    exactly: on restore the document is split again and delivered pieces are skipped)."""

    __name__ = "split_long_samples"

    def __init__(self, max_length: int, attention_mask: bool = False) -> None:
        self.max_length = max_length
        self.attention_mask = attention_mask

    async def __call__(self, stream: Any) -> Any:
        n = self.max_length
        async for sample in stream:
            ids = sample["input_ids"]
            if len(ids) <= n:
                yield sample
                continue
            for piece, at in enumerate(range(0, len(ids), n)):
                out = {**sample, "input_ids": ids[at : at + n], "piece": piece}
                if self.attention_mask:
                    out["attention_mask"] = np.ones(len(out["input_ids"]), np.int8)
                yield out


def tokenize_ops(
    tokenizer: Any,
    field: str,
    max_length: int | None,
    bos: bool | int | Literal["auto"],
    eos: bool | int | Literal["auto"],
    special_tokens: str | None,
    split_long_samples: bool,
    padding: bool | str,
    pad_id: int,
    attention_mask: bool,
) -> tuple[Tokenize, SplitLong | None]:
    """The steps ``Pipeline.tokenize`` adds, its arguments checked."""
    if special_tokens is not None:
        bos, eos = special_flags(special_tokens)
    if padding not in (False, True, "max_length"):
        raise ConfigError(f"padding must be False, True or 'max_length', got {padding!r}")
    if (split_long_samples or padding) and max_length is None:
        raise ConfigError("split_long_samples and padding need max_length")
    if split_long_samples and padding:
        raise ConfigError(
            "split_long_samples=True with padding: pieces are not padded; pad "
            "with a later map, or pack()"
        )
    tok = Tokenize(
        tokenizer,
        field,
        None if split_long_samples else max_length,
        bos,
        eos,
        pad_to=max_length if padding else None,
        pad_id=pad_id,
        attention_mask=attention_mask,
    )
    split = SplitLong(max_length, attention_mask) if split_long_samples and max_length else None
    return tok, split
