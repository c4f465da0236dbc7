# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""SFT on agent traces: `TRAPOConfig.assistant_only_loss=True` trains every assistant turn of a `messages` row (its
tool calls and `</s>` included) and no system, user or tool token, from the chat template's `{% generation %}` mask.

The expected masks are computed from the rendered text (each assistant turn is the text between its `a:` and its
`</s>`), independently of transformers' mask; the trained loss is checked against the tiny model's own negative
log-likelihood of exactly those tokens.
"""

from __future__ import annotations

import copy
import json
import logging
import re

import pytest
import torch
from conftest import add, make_tiny_config
from datasets import Dataset
from transformers.utils import get_json_schema

from trl_trapo import TRAPOTrainer
from trl_trapo.agents import TOOL_CHAT_TEMPLATE
from trl_trapo.data import tokenize_sft_dataset
from trl_trapo.tasks import build_tiny_model


def trace(a: int = 2, b: int = 3, result: str = "5", answer: str = "5", system: bool = True) -> list[dict]:
    """[system?, user, assistant with a tool call, tool result, assistant final answer]."""
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
    return [
        *([{"role": "system", "content": "be brief"}] if system else []),
        {"role": "user", "content": f"add {a} {b}="},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "add", "content": result},
        {"role": "assistant", "content": answer},
    ]


def traces(n: int = 8, **kwargs) -> Dataset:
    """`n` identical trace rows with a `tools` column (TRL's conversational format with tools)."""
    return Dataset.from_list([{"messages": trace(**kwargs), "tools": [get_json_schema(add)]} for _ in range(n)])


def expected_row(tok, messages: list[dict], tools=None) -> tuple[list[int], list[int]]:
    """`(input_ids, mask)` built from the rendered text: every span after an `a:` up to and including its `</s>` is
    trained, the rest is not; each span is tokenized on its own (one token per character, `</s>` one token)."""
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    ids, mask, at = [], [], 0
    for match in re.finditer(r"a:(.*?</s>)", text, flags=re.S):
        for segment, trained in ((text[at : match.start(1)], 0), (match.group(1), 1)):
            seg_ids = tok(segment, add_special_tokens=False)["input_ids"]
            ids += seg_ids
            mask += [trained] * len(seg_ids)
        at = match.end(1)
    tail = tok(text[at:], add_special_tokens=False)["input_ids"]
    return ids + tail, mask + [0] * len(tail)


@pytest.mark.parametrize("system", [True, False])
def test_mask_is_exactly_both_assistant_turns(tool_tok, system):
    """The tool call `<c>...</c></s>` and the final `5</s>` are trained; system, user, tool and `a:` prompts are not."""
    rows = traces(1, system=system)
    out = tokenize_sft_dataset(rows, tool_tok, 256, assistant_only_loss=True)
    ids, mask = out[0]["input_ids"], out[0]["completion_mask"]
    exp_ids, exp_mask = expected_row(tool_tok, trace(system=system), [get_json_schema(add)])
    assert ids == exp_ids and mask == exp_mask
    trained = tool_tok.decode([t for t, m in zip(ids, mask) if m])
    assert trained == '<c>{"name":"add","arguments":{"a":2,"b":3}}</c></s>5</s>'
    untrained = tool_tok.decode([t for t, m in zip(ids, mask) if not m])
    assert untrained == "T:add(a,b)\n" + ("s:be brief\n" if system else "") + "u:add 2 3=\na:t:5\na:"


def test_tools_column_as_json_string_and_truncation(tool_tok, caplog):
    """A `tools` cell may be a JSON string (as TRL takes it); rows past sft_max_length are cut from the right with the
    existing warning, and a cut that leaves no assistant token refuses with the existing error."""
    full = tokenize_sft_dataset(traces(1), tool_tok, 256, assistant_only_loss=True)[0]
    as_json = Dataset.from_list([{"messages": trace(), "tools": json.dumps([get_json_schema(add)])}])
    assert tokenize_sft_dataset(as_json, tool_tok, 256, assistant_only_loss=True)[0] == full
    first = full["completion_mask"].index(1)
    with caplog.at_level(logging.WARNING, logger="trl_trapo.data"):
        cut = tokenize_sft_dataset(traces(1), tool_tok, first + 3, assistant_only_loss=True)[0]
    assert cut["input_ids"] == full["input_ids"][: first + 3] and cut["completion_mask"] == [0] * first + [1] * 3
    assert "truncated" in caplog.text
    with pytest.raises(ValueError, match="sft_max_length"):
        tokenize_sft_dataset(traces(1), tool_tok, first, assistant_only_loss=True)


def make_trainer(tok, tmp_path, sft_dataset, **overrides) -> TRAPOTrainer:
    """SFT alone on `sft_dataset` (assistant tokens only, up to 128 tokens a row), 2 steps of `TINY_CONFIG`."""
    args = make_tiny_config(
        tmp_path,
        **{
            "max_steps": 2,
            "sft_max_length": 128,
            "rl_weight": 0.0,
            "pretrain_weight": 0.0,
            "assistant_only_loss": True,
            **overrides,
        },
    )
    return TRAPOTrainer(build_tiny_model(tok), args=args, sft_dataset=sft_dataset, processing_class=tok)


def masked_nll(model, ids: list[int], mask: list[int]) -> float:
    """Mean negative log-likelihood of the tokens where `mask` is 1 (predicted from the tokens before them)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="none")
    target = torch.tensor(mask[1:], dtype=torch.float32)
    return float((nll * target).sum() / target.sum())


def test_trainer_trains_on_traces_and_counts_only_assistant_tokens(tool_tok, tmp_path):
    """Two steps on traces; step 1's `loss/sft` (the initial weights) is the mean NLL of the assistant tokens alone:
    not of a mask that adds the tool result, and it changes when an assistant token changes."""
    trainer = make_trainer(tool_tok, tmp_path / "a", traces())
    initial = copy.deepcopy(trainer.model).eval()
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    logged = trainer.state.log_history[0]["loss/sft"]
    ids, mask = expected_row(tool_tok, trace(), [get_json_schema(add)])
    assert logged == pytest.approx(masked_nll(initial, ids, mask), abs=1e-4)
    text = tool_tok.decode(ids)
    tool_at = len(tool_tok(text[: text.index("t:5\n")], add_special_tokens=False)["input_ids"])
    with_tool = [1 if tool_at <= i < tool_at + 4 else m for i, m in enumerate(mask)]  # + the 4 tokens of "t:5\n"
    assert masked_nll(initial, ids, with_tool) != pytest.approx(logged, abs=1e-4)

    other = make_trainer(tool_tok, tmp_path / "b", traces(answer="6"))
    other.train()
    assert other.state.log_history[0]["loss/sft"] != pytest.approx(logged, abs=1e-6)
    ids6, mask6 = expected_row(tool_tok, trace(answer="6"), [get_json_schema(add)])
    assert other.state.log_history[0]["loss/sft"] == pytest.approx(masked_nll(initial, ids6, mask6), abs=1e-4)


def without_generation_tags(tok):
    bare = copy.deepcopy(tok)
    bare.chat_template = TOOL_CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    return bare


NO_TOOL_CALLS = (  # has {% generation %} markers but never renders `tool_calls`
    "{%- for m in messages %}{%- if m.role == 'assistant' %}a:{% generation %}{{ m.content or '' }}</s>"
    "{% endgeneration %}{%- else %}{{ m.role[0] }}:{{ m.content }}{{ '\\n' }}{% endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}a:{% endif %}"
)


def test_refused_without_generation_markers(tool_tok, tmp_path):
    with pytest.raises(ValueError, match=r"assistant_only_loss=True.*\{% generation %\}\.\.\.\{% endgeneration %\}"):
        make_trainer(without_generation_tags(tool_tok), tmp_path, traces())


def test_refused_for_prompt_completion_text(tool_tok, tmp_path):
    rows = Dataset.from_dict({"prompt": ["add 2 3="], "completion": ["5"]})
    with pytest.raises(ValueError, match="assistant_only_loss=True.*completion-only loss"):
        make_trainer(tool_tok, tmp_path, rows)


def test_refused_when_the_template_cannot_render_tool_calls(tool_tok, tmp_path):
    plain = copy.deepcopy(tool_tok)
    plain.chat_template = NO_TOOL_CALLS
    with pytest.raises(ValueError, match="row 0 has tool calls.*cannot render them"):
        make_trainer(plain, tmp_path, traces())
    # without the flag too: the last turn's context would silently lose the calls and results
    with pytest.raises(ValueError, match="row 0 has tool calls.*cannot render them"):
        make_trainer(plain, tmp_path, traces(), assistant_only_loss=False)
    # without tool calls the same template is fine: two plain turns are both trained
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}] * 2
    out = tokenize_sft_dataset(Dataset.from_list([{"messages": chat}]), plain, 64, assistant_only_loss=True)[0]
    assert tool_tok.decode([t for t, m in zip(out["input_ids"], out["completion_mask"]) if m]) == "yo</s>yo</s>"


def test_traces_without_the_flag_train_every_token_and_warn_about_tool_results(tool_tok, tmp_path, caplog):
    """Without assistant_only_loss a `messages` row trains every token, as TRL's SFTTrainer does: the user turns and
    the tool results too (TRAPO used to train the last assistant turn only); rows with tool messages get one
    warning naming the flag that trains the assistant turns only."""
    with caplog.at_level(logging.WARNING, logger="trl_trapo.data"):
        trainer = make_trainer(tool_tok, tmp_path, traces(), assistant_only_loss=False, max_steps=1)
    warnings = [r.getMessage() for r in caplog.records if "assistant_only_loss=True" in r.getMessage()]
    assert len(warnings) == 1 and "8 of 8 `sft_dataset` rows have tool messages" in warnings[0]
    assert "learns to write tool results" in warnings[0]
    trainer.train()
    out = tokenize_sft_dataset(traces(1), tool_tok, 128)[0]
    assert all(out["completion_mask"])
    assert tool_tok.decode(out["input_ids"]) == tool_tok.apply_chat_template(
        traces(1)[0]["messages"], tools=traces(1)[0]["tools"], tokenize=False
    )

    caplog.clear()
    plain = Dataset.from_list(
        [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    )
    with caplog.at_level(logging.WARNING, logger="trl_trapo.data"):
        make_trainer(tool_tok, tmp_path / "p", plain, assistant_only_loss=False, max_steps=1)
    assert not [r for r in caplog.records if "assistant_only_loss=True" in r.getMessage()]


def test_trl_sft_trainer_accepts_the_template(tool_tok, tmp_path):
    """TRL's own SFTTrainer with assistant_only_loss=True takes the tokenizer (no error, no fallback template) and
    trains the same tokens."""
    from trl import SFTConfig, SFTTrainer

    rows = traces(2)
    trainer = SFTTrainer(
        model=build_tiny_model(tool_tok),
        args=SFTConfig(
            output_dir=str(tmp_path), assistant_only_loss=True, report_to="none", max_length=128, bf16=False
        ),
        train_dataset=rows,
        processing_class=tool_tok,
    )
    assert getattr(trainer, "chat_template", None) is None  # its own markers: no training template swapped in
    first = trainer.train_dataset[0]
    ours = tokenize_sft_dataset(rows, tool_tok, 128, assistant_only_loss=True)[0]
    assert first["input_ids"] == ours["input_ids"]
    # TRL folds the assistant mask into `labels` (-100: not trained)
    assert [label != -100 for label in first["labels"]] == [bool(m) for m in ours["completion_mask"]]


def test_the_documented_trace_example_trains(tmp_path, monkeypatch):
    """docs/agents.md's SFT-on-traces block, as written: two SFT steps on every assistant turn of the traces."""
    from test_doc_commands import registered_block

    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    block = registered_block("docs/agents.md: # run: SFT on tool-calling traces")
    exec(compile(block.text, block.where(), "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 2 and "loss/sft" in trainer.state.log_history[0]
    row, tok = trainer._sft_dataset[0], namespace["tokenizer"]
    trained = tok.decode([t for t, m in zip(row["input_ids"], row["completion_mask"]) if m])
    assert trained == '<c>{"name":"add","arguments":{"a":0,"b":7}}</c></s>7</s>'


def test_evaluation_of_traces_uses_the_same_mask(tool_tok, tmp_path):
    """An eval set of traces is scored on the assistant tokens alone, as the SFT objective trains them."""
    trainer = make_trainer(tool_tok, tmp_path, traces(), eval_strategy="no")
    metrics = trainer.evaluate(eval_dataset=traces(2))
    ids, mask = expected_row(tool_tok, trace(), [get_json_schema(add)])
    assert metrics["eval_sft_loss"] == pytest.approx(
        masked_nll(copy.deepcopy(trainer.model).eval(), ids, mask), abs=1e-4
    )


def test_a_mask_without_the_end_of_turn_token_warns(tool_tok, tmp_path, caplog):
    """`</s>` outside `{% endgeneration %}`: trained tokens lack it, and construction warns once (TRL's check)."""
    late = copy.deepcopy(tool_tok)
    late.chat_template = TOOL_CHAT_TEMPLATE.replace("</s>{% endgeneration %}", "{% endgeneration %}</s>")
    with caplog.at_level(logging.WARNING, logger="trl_trapo.data"):
        make_trainer(late, tmp_path, traces(), max_steps=1)
    assert sum("not trained to stop" in r.getMessage() for r in caplog.records) == 1
    out = tokenize_sft_dataset(traces(1), late, 128, assistant_only_loss=True)[0]
    assert tool_tok.decode([t for t, m in zip(out["input_ids"], out["completion_mask"]) if m]).endswith("</c>5")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo.data"):
        make_trainer(tool_tok, tmp_path / "ok", traces(), max_steps=1)
    assert not [r for r in caplog.records if "not trained to stop" in r.getMessage()]
