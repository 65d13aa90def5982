"""The text and token steps of :class:`~zephon.pipeline.builder.Pipeline`: tokenize,
tokenize_chat, pack and to_training (a mixin, so the builder stays about the pipeline)."""

from __future__ import annotations

from typing import Any, Literal, Self

from zephon.choices import LossOn, PackAlgorithm, Padding, PositionIds, SpecialTokens
from zephon.ops.itemops import Map, Tokenize
from zephon.ops.operator import Operator
from zephon.ops.pack import Packing
from zephon.ops.transform import Apply
from zephon.pipeline.placement import placement

__all__ = ["TextSteps"]


class TextSteps:
    """Steps from text to training rows; each returns a new pipeline."""

    def _with(self, op: Operator | None = None, **changes: Any) -> Self:
        raise NotImplementedError

    def _check_before_batch(self, what: str) -> None:
        raise NotImplementedError

    def tokenize(
        self,
        tokenizer: Any,
        field: str = "text",
        max_length: int | None = None,
        bos: bool | int | Literal["auto"] = "auto",
        eos: bool | int | Literal["auto"] = "auto",
        processes: int = 0,
        *,
        special_tokens: SpecialTokens | None = None,
        split_long_samples: bool = False,
        padding: Padding = False,
        pad_id: int = 0,
        attention_mask: bool = False,
        executor: Any = None,
    ) -> Self:
        """Add ``input_ids`` (int32) from ``sample[field]``, batch-encoding each block; see
        :class:`~zephon.ops.tokenize.Tokenize` for the accepted tokenizers.

        ``bos``/``eos``: ``"auto"`` (default) adds the tokenizer's own begin/end token where
        it has one (a GPT-2 style tokenizer: only the end of text), ``True`` requires it,
        ``False`` leaves it out, an int is the id to add. ``special_tokens``: ``"bos_eos"``,
        ``"bos"``, ``"eos"`` or ``"none"`` (instead of ``bos``/``eos``).
        ``split_long_samples=True``: a document longer than ``max_length``
        becomes several samples of at most ``max_length`` ids (``piece`` 0, 1, ...; each
        resumes exactly) instead of being truncated. ``padding="max_length"`` (or ``True``)
        pads to ``max_length`` with ``pad_id``; ``attention_mask=True`` adds the 1/0 mask.
        """
        from zephon.ops.tokenize import tokenize_ops

        self._check_before_batch("tokenize")
        inflight, remote = placement(processes, executor, None, "tokenizer")
        tok, split = tokenize_ops(
            tokenizer,
            field,
            max_length,
            bos,
            eos,
            special_tokens,
            split_long_samples,
            padding,
            pad_id,
            attention_mask,
        )
        out = self._with(Tokenize(tok, inflight, remote))
        return out._with(Apply(split)) if split is not None else out

    def tokenize_chat(
        self,
        tokenizer: Any,
        field: str = "messages",
        chat_template: str | None = None,
        max_length: int | None = None,
        loss_on: LossOn = "assistant",
        processes: int = 0,
        executor: Any = None,
    ) -> Self:
        """Render ``sample[field]`` (a conversation) with the chat template, tokenize it and
        add ``input_ids`` and ``loss_mask`` (1 exactly on assistant tokens; ``loss_on="last"``:
        the last assistant turn only); see :mod:`zephon.ops.chat`. ``explain()`` says how the
        assistant tokens are found (the template's generation spans, or prefix-diff)."""
        from zephon.ops.chat import ChatTokenize

        self._check_before_batch("tokenize_chat")
        inflight, remote = placement(processes, executor, None, "tokenizer")
        tok = ChatTokenize(tokenizer, field, chat_template, max_length, loss_on)
        return self._with(Tokenize(tok, inflight, remote))

    def to_training(
        self,
        ignore_index: int = -100,
        dtype: str = "int64",
        attention_mask: bool = False,
        shift: bool = True,
        rename_fields: dict[str, str] | None = None,
        field: str = "input_ids",
        position_ids: PositionIds = "row",
    ) -> Self:
        """Labels, position ids, ``cu_seqlens``/``max_seqlen`` and ``num_valid_tokens`` for a
        causal LM loss, on rows (before ``batch``) or batches of packed rows (after it); see
        :mod:`zephon.ops.training`. ``position_ids``: ``"row"`` (default) restarts a
        document split across packed rows at 0 in each row, so ids stay below the row
        length; ``"document"`` continues its positions from row to row."""
        from zephon.ops.training import ToTraining

        fn = ToTraining(
            ignore_index, dtype, attention_mask, shift, rename_fields, field, position_ids
        )
        return self._with(Map(fn))

    def pack(
        self,
        seq_len: int,
        algorithm: PackAlgorithm = "concat",
        pad_id: int = 0,
        field: str = "input_ids",
        window: int = 1024,
    ) -> Self:
        """Rows of exactly ``seq_len`` tokens with ``input_ids``, ``positions`` and
        ``segment_ids``; ``algorithm`` is ``concat`` (no token lost), ``first_fit`` or
        ``best_fit`` (over windows of ``window`` documents, padded with ``pad_id``). Other
        fields are dropped: :meth:`pack_sequences` carries per-token ones."""
        return self._pack(Packing(seq_len, algorithm, pad_id, field, window, fields=()))

    def pack_sequences(
        self,
        max_length: int,
        algorithm: PackAlgorithm = "best_fit",
        pad_id: int = 0,
        field: str = "input_ids",
        window: int = 1024,
        fields: tuple[str, ...] | list[str] | None = None,
        min_sequence_length: int = 1,
        max_sequences_per_bin: int | None = None,
    ) -> Self:
        """Pack documents into rows of ``max_length`` tokens, keeping each as a segment and
        carrying its per-token fields (``loss_mask``, ...; ``fields=None``: every field as
        long as the ids) aligned and padded with 0. ``algorithm``: ``concat``,
        ``first_fit``, ``best_fit`` or ``best_fit_wrap`` (see :mod:`zephon.ops.pack`);
        documents shorter than ``min_sequence_length`` are dropped; fit algorithms put at
        most ``max_sequences_per_bin`` documents in a row. ``to_training()`` after it gives
        labels that never cross documents, ``position_ids`` and ``cu_seqlens``."""
        chosen = None if fields is None else tuple(fields)
        return self._pack(
            Packing(
                max_length,
                algorithm,
                pad_id,
                field,
                window,
                chosen,
                min_sequence_length,
                max_sequences_per_bin,
            )
        )

    def _pack(self, packing: Packing) -> Self:
        self._check_before_batch("pack")
        return self._with(packing)
