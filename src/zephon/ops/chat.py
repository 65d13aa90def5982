"""tokenize_chat: conversations rendered with a chat template, tokenized, with a loss mask.

A sample's ``messages`` (``[{"role", "content"}, ...]``, optional ``tools``) is rendered with
the chat template (a ``transformers`` tokenizer's own, the ``chat_template`` of a
``tokenizer_config.json``, or a jinja2 template string; always in jinja2's immutable sandbox)
and tokenized once, with character offsets. ``loss_mask`` is 1 exactly on the tokens of the
assistant turns, found one of two ways (``describe()`` says which):

- **generation spans**: the template marks assistant text with
  ``{% generation %}...{% endgeneration %}`` (as Hugging Face templates for training do);
- **prefix-diff**: otherwise, for each assistant turn ``i``, the rendering of the turns before
  it with the generation prompt must be a prefix of the rendering up to and including it,
  which must be a prefix of the whole conversation's; the difference is the turn's text
  (its end-of-turn token included). A template for which that does not hold is refused, with
  a :class:`~zephon.errors.FormatError` naming the sample.

A token belongs to a span when its first character does.

Generation spans are found by markers the template's ``{% generation %}`` tag writes around
them: strings drawn at random for each step (a private-use character and 32 random hex
digits), so no conversation can write one. The characters of a fixed marker in a user's
message once became part of an assistant span (``loss_mask=1`` on the user's tokens) and
vanished from the text.

Prefix-diff renders the conversation twice for each assistant turn, so its cost grows with
turns times length: a conversation whose renders would pass :data:`PREFIX_DIFF_CHARS`
characters in all (4,000 turns of a 140 KB record: 8 seconds) is a ``FormatError``, which
``on_error="skip"`` counts and skips; ``{% generation %}`` tags cost one render whatever the
length.
"""

from __future__ import annotations

import json
import os
import secrets
from datetime import datetime
from typing import Any

import numpy as np

from zephon.choices import LossOn, choices
from zephon.errors import ConfigError, FormatError
from zephon.ops.tokenize import _BOS_NAMES, _EOS_NAMES, Tokenize

__all__ = ["ChatTokenize"]

LOSS_ON: tuple[str, ...] = choices(LossOn)
PREFIX_DIFF_CHARS = 16_000_000  # characters prefix-diff may render for one conversation


def _markers() -> tuple[str, str]:
    """Start and end markers of generation spans no data can contain (module doc)."""
    nonce = secrets.token_hex(16)
    return "\ue000" + nonce, "\ue001" + nonce


def _template_source(tokenizer: Any, chat_template: str | None) -> str:
    if chat_template is None:
        own = getattr(tokenizer, "chat_template", None)
        if isinstance(own, str):
            return own
        raise ConfigError(
            "tokenize_chat() needs a chat template: this tokenizer has none; pass "
            "chat_template= (a jinja2 string or a tokenizer_config.json path)"
        )
    if chat_template.endswith(".json") and os.path.isfile(chat_template):
        with open(chat_template, encoding="utf-8") as f:
            found = json.load(f).get("chat_template")
        if isinstance(found, list):  # several named templates: the default one
            found = next((t["template"] for t in found if t.get("name") == "default"), None)
        if not isinstance(found, str):
            raise ConfigError(f"{chat_template!r} has no chat_template")
        return found
    return chat_template


def _compile(source: str, markers: tuple[str, str]) -> Any:
    try:
        from jinja2 import nodes
        from jinja2.ext import Extension
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ConfigError("tokenize_chat() needs jinja2: pip install 'zephon[chat]'") from None

    class Generation(Extension):
        tags = {"generation"}  # noqa: RUF012 - jinja2 declares it a set

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

        def _mark(self, caller: Any) -> str:
            return markers[0] + str(caller()) + markers[1]

    def raise_exception(message: str) -> None:
        raise FormatError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation]
    )
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class ChatTokenize:
    """A picklable tokenize step for conversations (see the module doc).

    Args:
        tokenizer: a ``tokenizers.Tokenizer``, a ``tokenizer.json`` path or a fast
            ``transformers`` tokenizer (the ones that report character offsets).
        field: the conversation field.
        chat_template: jinja2 source or a ``tokenizer_config.json`` path; ``None``: the
            tokenizer's own.
        max_length: truncate ``input_ids`` and ``loss_mask`` to this many tokens.
        loss_on: ``"assistant"`` (every assistant turn), ``"last"`` (the last one only) or
            ``"all"`` (every token).
    """

    releases_gil = False  # rendering is Python: in process it runs on the loop

    def __init__(
        self,
        tokenizer: Any,
        field: str = "messages",
        chat_template: str | None = None,
        max_length: int | None = None,
        loss_on: LossOn = "assistant",
    ) -> None:
        self.encoder = Tokenize(tokenizer, bos=False, eos=False)
        if self.encoder.kind not in ("tokenizers", "transformers"):
            raise ConfigError(
                "tokenize_chat() needs a tokenizers or fast transformers tokenizer (they "
                f"report offsets), got {self.encoder.kind}"
            )
        if loss_on not in LOSS_ON:
            raise ConfigError(f"loss_on must be one of {LOSS_ON}, got {loss_on!r}")
        if max_length is not None and max_length < 1:
            raise ConfigError(f"max_length must be >= 1 or None, got {max_length}")
        self.source = _template_source(self.encoder.tokenizer, chat_template)
        self.field, self.max_length, self.loss_on = field, max_length, loss_on
        self.spans = "generation" in self.source and "endgeneration" in self.source
        self.specials = {
            "bos_token": self._special_text(_BOS_NAMES, "bos"),
            "eos_token": self._special_text(_EOS_NAMES, "eos"),
        }
        self._markers = _markers()
        self._template: Any = _compile(self.source, self._markers)  # fails early if broken

    def _special_text(self, names: tuple[str, ...], what: str) -> str:
        own = getattr(self.encoder.tokenizer, f"{what}_token", None)
        if isinstance(own, str):
            return own
        return next((n for n in names if self.encoder._token_id(n) is not None), "")

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_template", "_markers")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._markers = _markers()
        self._template = _compile(self.source, self._markers)

    def describe(self) -> str:
        how = "{% generation %} spans" if self.spans else "verified prefix-diff"
        return (
            f"tokenize_chat({self.encoder.kind}, field={self.field!r}, max_length="
            f"{self.max_length}, loss_on={self.loss_on}; loss_mask from {how})"
        )

    def _render(self, sample: dict[str, Any], messages: list[Any], prompt: bool) -> str:
        tools = sample.get("tools")
        out = self._template.render(
            messages=messages, tools=tools, add_generation_prompt=prompt, **self.specials
        )
        return str(out)

    def render(self, sample: dict[str, Any]) -> tuple[str, list[tuple[int, int]]]:
        """The conversation's text and the character spans of its assistant turns."""
        try:
            messages = sample[self.field]
            roles = [m["role"] for m in messages]
        except (KeyError, TypeError):
            raise FormatError(
                f"tokenize_chat(): {self.field!r} must be a list of {{'role', 'content'}} dicts"
            ) from None
        if self.spans:
            start, end = self._markers
            marked = self._render(sample, messages, False)
            text, spans, at = [], [], 0
            for i, piece in enumerate(marked.split(start)):
                if i:
                    inside, _, piece = piece.partition(end)
                    spans.append((at, at + len(inside)))
                    text.append(inside)
                    at += len(inside)
                text.append(piece)
                at += len(piece)
            return "".join(text), spans
        full = self._render(sample, messages, False)
        turns = [i for i, role in enumerate(roles) if role == "assistant"]
        if len(full) * len(turns) > PREFIX_DIFF_CHARS:
            raise FormatError(
                f"tokenize_chat(): {len(turns)} assistant turns in {len(full):,} characters "
                f"would render over {PREFIX_DIFF_CHARS:,} characters by prefix-diff (twice "
                "per turn); mark assistant text with {% generation %}...{% endgeneration %} "
                "in the template (one render), or skip such samples with on_error='skip'"
            )
        spans = []
        for i in turns:
            before = self._render(sample, messages[:i], True)
            upto = self._render(sample, messages[: i + 1], False)
            if not (upto.startswith(before) and full.startswith(upto)):
                raise FormatError(
                    f"tokenize_chat(): the chat template does not render turn {i} as a prefix "
                    "of the conversation, so assistant tokens cannot be found by prefix-diff; "
                    "mark them with {% generation %}...{% endgeneration %} in the template"
                )
            spans.append((len(before), len(upto)))
        return full, spans

    def batch(self, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rendered = []
        for i, sample in enumerate(samples):
            try:
                rendered.append(self.render(sample))
            except Exception as exc:
                exc.zephon_index = i  # type: ignore[attr-defined]  # which sample: for the note
                raise
        texts = [text for text, _ in rendered]
        t = self.encoder.tokenizer
        if self.encoder.kind == "tokenizers":
            encoded = [(e.ids, e.offsets) for e in t.encode_batch(texts, add_special_tokens=False)]
        else:
            out = t(texts, add_special_tokens=False, return_offsets_mapping=True)
            encoded = list(zip(out["input_ids"], out["offset_mapping"], strict=True))
        results = []
        for sample, (_, spans), (ids, offsets) in zip(samples, rendered, encoded, strict=True):
            starts = np.fromiter((o[0] for o in offsets), np.int64, len(offsets))
            mask = np.zeros(len(ids), np.int8)
            chosen = spans[-1:] if self.loss_on == "last" else spans
            for a, b in chosen:
                mask[(starts >= a) & (starts < b)] = 1
            if self.loss_on == "all":
                mask[:] = 1
            ids_ = np.asarray(ids, np.int32)
            if self.max_length is not None:
                ids_, mask = ids_[: self.max_length], mask[: self.max_length]
            results.append({**sample, "input_ids": ids_, "loss_mask": mask})
        return results

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return self.batch([sample])[0]
