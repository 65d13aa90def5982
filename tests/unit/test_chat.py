"""tokenize_chat: chat templates rendered in a sandbox, loss masks exactly on assistant tokens
(generation spans or verified prefix-diff), through the pipeline in process and in workers.
The tokenizer is a small BPE trained here, offline."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError, FormatError
from zephon.ops.chat import ChatTokenize

tokenizers = pytest.importorskip("tokenizers")

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
           "<|end_header_id|>", "<|eot_id|>"]  # fmt: skip
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_GENERATION = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}{% else %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
# Renders the last message differently: not prefix-stable, so prefix-diff must refuse it.
UNSTABLE = "{% for m in messages %}{{ m['content'] }}{% if loop.last %}<END>{% endif %}{% endfor %}"

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is two plus two?"},
    {"role": "assistant", "content": "Four."},
    {"role": "user", "content": "And three plus three?"},
    {"role": "assistant", "content": "Six, of course."},
]


@pytest.fixture(scope="module")
def tok() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    corpus = [m["content"] for m in CONVERSATION] * 20 + ["system user assistant"] * 20
    t.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=SPECIAL,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    return t


def masked_text(tok: Any, out: dict[str, Any]) -> str:
    ids = out["input_ids"][out["loss_mask"] == 1].tolist()
    return str(tok.decode(ids, skip_special_tokens=False))


@pytest.mark.parametrize(
    ("template", "method", "expected"),
    [
        (CHATML, "prefix-diff", "Four.<|im_end|>\nSix, of course.<|im_end|>\n"),
        (CHATML_GENERATION, "generation", "Four.<|im_end|>Six, of course.<|im_end|>"),
        (LLAMA3, "prefix-diff", "Four.<|eot_id|>Six, of course.<|eot_id|>"),
    ],
)
def test_loss_mask_is_one_exactly_on_assistant_tokens(
    tok: Any, template: str, method: str, expected: str
) -> None:
    chat = ChatTokenize(tok, chat_template=template)
    assert method in chat.describe()
    (out,) = chat.batch([{"messages": CONVERSATION}])
    text, _ = chat.render({"messages": CONVERSATION})
    assert tok.decode(out["input_ids"].tolist(), skip_special_tokens=False) == text
    assert masked_text(tok, out) == expected
    assert out["input_ids"].dtype == np.int32 and out["loss_mask"].dtype == np.int8
    if template == LLAMA3:
        assert text.startswith("<|begin_of_text|>")  # bos_token found by its usual name


def test_loss_on_last_and_all_and_max_length(tok: Any) -> None:
    last = ChatTokenize(tok, chat_template=CHATML, loss_on="last").batch(
        [{"messages": CONVERSATION}]
    )
    assert masked_text(tok, last[0]) == "Six, of course.<|im_end|>\n"
    every = ChatTokenize(tok, chat_template=CHATML, loss_on="all")({"messages": CONVERSATION})
    assert every["loss_mask"].all()
    short = ChatTokenize(tok, chat_template=CHATML, max_length=7)({"messages": CONVERSATION})
    assert len(short["input_ids"]) == len(short["loss_mask"]) == 7


def test_templates_from_a_tokenizer_config_or_a_transformers_tokenizer(
    tok: Any, tmp_path: Path
) -> None:
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": CHATML_GENERATION}))
    want = ChatTokenize(tok, chat_template=CHATML_GENERATION)({"messages": CONVERSATION})
    from_file = ChatTokenize(tok, chat_template=str(config))({"messages": CONVERSATION})
    assert from_file["loss_mask"].tolist() == want["loss_mask"].tolist()
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, chat_template=CHATML_GENERATION
    )
    via_hf = ChatTokenize(fast)({"messages": CONVERSATION})
    assert via_hf["input_ids"].tolist() == want["input_ids"].tolist()
    assert via_hf["loss_mask"].tolist() == want["loss_mask"].tolist()


def test_bad_templates_and_inputs_are_refused(tok: Any) -> None:
    with pytest.raises(ConfigError, match="chat template"):
        ChatTokenize(tok)  # a tokenizers.Tokenizer has no template of its own
    with pytest.raises(ConfigError, match="loss_on"):
        ChatTokenize(tok, chat_template=CHATML, loss_on="user")
    with pytest.raises(FormatError, match="prefix"):
        ChatTokenize(tok, chat_template=UNSTABLE)({"messages": CONVERSATION})
    with pytest.raises(FormatError, match="'messages' must be a list"):
        ChatTokenize(tok, chat_template=CHATML)({"messages": "hello"})
    from jinja2.exceptions import SecurityError

    escape = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(SecurityError):  # sandboxed: no reaching into Python objects
        ChatTokenize(tok, chat_template=escape)({"messages": CONVERSATION})


def conversations(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        turns = [
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": f"answer {i} " * (i % 4 + 1)},
        ]
        out.append({"id": i, "messages": turns * (1 + i % 2)})
    return out


def test_in_the_pipeline_processes_resume_and_errors(tok: Any, tmp_path: Path) -> None:
    path = tmp_path / "tok.json"
    tok.save(str(path))
    ds = [Dataset.from_records("chat", conversations(120), samples_per_shard=25)]

    def pipe(processes: int) -> Pipeline:
        ws = StaticMixtureWorkSource(ds, seed=2, shuffle="global")
        return (
            Pipeline(ws, rank=0, world_size=1, lanes=2)
            .tokenize_chat(str(path), chat_template=CHATML, processes=processes)
            .to_training()
        )

    def rows(p: Pipeline, limit: int | None = None) -> list[tuple[int, list[int]]]:
        async def go() -> list[tuple[int, list[int]]]:
            got = []
            async for row in p:
                got.append((row["id"], row["labels"].tolist()))
                if limit is not None and len(got) == limit:
                    break
            return got

        return asyncio.run(go())

    want = rows(pipe(0))
    assert len(want) == 120 and rows(pipe(2)) == want
    assert "loss_mask from verified prefix-diff" in pipe(0).explain()
    first = pipe(2)
    head = rows(first, 37)
    again = pipe(0)
    again.restore(first.checkpoint())
    assert head + rows(again) == want

    bad = [Dataset.from_records("bad", [{"messages": "oops"}], samples_per_shard=1)]
    broken = Pipeline(StaticMixtureWorkSource(bad)).tokenize_chat(tok, chat_template=CHATML)
    with pytest.raises(FormatError) as info:
        list(broken)
    assert "sample 0" in "\n".join(info.value.__notes__)


@pytest.mark.parametrize("template", [CHATML_GENERATION, CHATML])
def test_a_user_message_cannot_forge_the_loss_mask(tok: Any, template: str) -> None:
    """Generation spans are marked by strings no data can write: characters that look like
    a marker stay text of the user's, never masked in, never dropped."""
    forged = "\ue000\ue001Say \ue000yes\ue001 please \ue000"
    conversation = [
        *CONVERSATION[:3],
        {"role": "user", "content": forged},
        {"role": "assistant", "content": "No."},
    ]
    chat = ChatTokenize(tok, chat_template=template)
    (out,) = chat.batch([{"messages": conversation}])
    text, _ = chat.render({"messages": conversation})
    assert forged in text
    assert "\ue000yes\ue001" not in masked_text(tok, out)
    assert masked_text(tok, out).replace("\n", "") == "Four.<|im_end|>No.<|im_end|>"


def test_a_long_conversation_costs_one_render_with_generation_tags_or_is_refused(
    tok: Any,
) -> None:
    turns = [
        {"role": r, "content": f"turn {i} " + "x" * 30}
        for i in range(4000)
        for r in ("user", "assistant")
    ]
    spans = ChatTokenize(tok, chat_template=CHATML_GENERATION)
    (out,) = spans.batch([{"messages": turns}])
    assert out["loss_mask"].sum() > 0
    prefix_diff = ChatTokenize(tok, chat_template=CHATML)
    with pytest.raises(FormatError, match=r"4000 assistant turns .* generation"):
        prefix_diff.batch([{"messages": turns}])
