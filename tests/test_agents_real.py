# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Tools with a real ChatML model whose own template cannot express them (SmolLM2): `use_chatml_tool_template`, the
calculator through `TRAPOTrainer(tools=...)`, and `scripts/experiments/agents_real.py --quick`.

SmolLM2's tokenizer is the fixture `tests/fixtures/smollm2_tokenizer`; the model is a tiny random Llama over it. The
tiny model never calls a tool, so the tool-calling round is driven by a scripted engine (`tests/test_agents.py`): each
turn is token ids a script writes from the decoded context, through the loop the trainer runs.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from test_agents import FirstPrompts, Metrics, ScriptedEngine
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.utils import get_json_schema
from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.agents import (
    SMOLLM2_DEFAULT_SYSTEM,
    ToolRolloutSource,
    chatml_tool_chat_template,
    check_chat_template,
    tool_suffix_ids,
    use_chatml_tool_template,
)
from trl_trapo.rewards import numeric_answer_reward
from trl_trapo.tasks import build_char_tokenizer
from trl_trapo.tools import calculator


ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "smollm2_tokenizer"
sys.path.insert(0, str(ROOT / "scripts" / "experiments"))
sys.path.insert(0, str(ROOT / "scripts"))

CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "48/2"}}}
EXCHANGE = [
    {"role": "system", "content": "Solve the problem."},
    {"role": "user", "content": "Half of 48?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "name": "calculator", "content": "24"},
    {"role": "assistant", "content": "#### 24"},
]


def smollm2_tokenizer():
    return AutoTokenizer.from_pretrained(FIXTURE)


@pytest.fixture(scope="module")
def tok():
    return use_chatml_tool_template(smollm2_tokenizer())


def tiny_model(tokenizer) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=1024, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def call_text(expression: str) -> str:
    """An assistant turn calling the calculator, as the template writes it (EOS included)."""
    arguments = json.dumps({"expression": expression})
    return f'<tool_call>\n{{"name": "calculator", "arguments": {arguments}}}\n</tool_call><|im_end|>'


# ---------------------------------------------------------------------------------------------------------------------
# The template and its parser
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("generation_prompt", [False, True])
@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hi"}],  # SmolLM2's default system message is written
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"},
        ],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    ],
    ids=["default-system", "system", "multi-turn"],
)
def test_without_tools_it_renders_exactly_as_smollm2s_own_template(tok, messages, generation_prompt):
    own = smollm2_tokenizer()
    assert "tool" not in own.chat_template and not supports_tool_calling(own)  # why the helper exists
    expected = own.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt) == expected


def test_a_tool_exchange_renders_in_the_hermes_format_and_the_parser_recovers_the_call(tok):
    text = tok.apply_chat_template(EXCHANGE, tools=[calculator], tokenize=False)
    schema = json.dumps(get_json_schema(calculator), ensure_ascii=False)
    assert text.startswith("<|im_start|>system\nSolve the problem.\n\n# Tools\n\n")
    assert f"<tools>\n{schema}\n</tools>" in text
    assert text.endswith(
        "<|im_start|>user\nHalf of 48?<|im_end|>\n"
        f"<|im_start|>assistant\n{call_text('48/2')}\n"
        "<|im_start|>user\n<tool_response>\n24\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n#### 24<|im_end|>\n"
    )
    prefix = ids(tok, "<|im_start|>user\nHalf of 48?<|im_end|>\n<|im_start|>assistant\n")
    parsed = tok.parse_response(ids(tok, call_text("48/2")), prefix=prefix, tools=[calculator])
    assert parsed["tool_calls"] == [CALL] and not parsed.get("content")


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": "Let me compute.", "tool_calls": [CALL]},
        {"role": "assistant", "content": "", "tool_calls": [CALL, CALL]},
        {"role": "assistant", "content": "So 72.\n#### 72"},
    ],
    ids=["text-then-call", "two-calls", "no-call"],
)
def test_the_parser_reads_back_what_the_template_writes(tok, message):
    head = [{"role": "user", "content": "q"}]
    prefix = tok.apply_chat_template(head, tokenize=True, add_generation_prompt=True, return_dict=False)
    full = tok.apply_chat_template(head + [message], tokenize=True, return_dict=False)
    turn = full[len(prefix) :]
    assert full[: len(prefix)] == prefix
    assert tok.decode(turn[-2:]) == "<|im_end|>\n"  # the turn ends with the EOS, then the template's newline
    parsed = tok.parse_response(turn[:-1], prefix=prefix, tools=[calculator])
    assert (parsed.get("content") or "") == message["content"]
    assert parsed.get("tool_calls", []) == message.get("tool_calls", [])


def test_every_message_renders_the_same_whatever_follows(tok):
    # text: each conversation's rendering starts with the rendering of every shorter one
    renders = [tok.apply_chat_template(EXCHANGE[:k], tools=[calculator], tokenize=False) for k in range(2, 6)]
    assert all(longer.startswith(shorter) for shorter, longer in zip(renders, renders[1:]))
    two_results = [*EXCHANGE[:3], EXCHANGE[3], {"role": "tool", "name": "calculator", "content": "25"}]
    assert tok.apply_chat_template(two_results, tokenize=False).startswith(
        tok.apply_chat_template(two_results[:4], tokenize=False)
    )
    # tokens: what the trainer and TRL check (an assistant call, then a tool message and the next generation prompt)
    check_chat_template(tok)
    assert is_chat_template_prefix_preserving(tok)
    suffix = tool_suffix_ids(tok, [{"role": "tool", "name": "calculator", "content": "24"}])
    assert tok.decode(suffix) == (
        "\n<|im_start|>user\n<tool_response>\n24\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_assistant_mask_covers_assistant_text_calls_and_eos_but_no_tool_result(tok):
    out = tok.apply_chat_template(
        EXCHANGE, tools=[calculator], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    input_ids, mask = out["input_ids"], out["assistant_masks"]
    trained = tok.decode([t for t, m in zip(input_ids, mask) if m])
    assert trained == call_text("48/2") + "#### 24<|im_end|>"  # both turns, calls and EOS; nothing else
    untrained = tok.decode([t for t, m in zip(input_ids, mask) if not m])
    assert "<tool_response>\n24\n</tool_response>" in untrained and "Half of 48?" in untrained


def test_default_system_message_can_be_changed_or_left_out():
    messages = [{"role": "user", "content": "hi"}]
    plain = smollm2_tokenizer()
    plain.chat_template = chatml_tool_chat_template(None)
    assert plain.apply_chat_template(messages, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n"
    quoted = smollm2_tokenizer()
    quoted.chat_template = chatml_tool_chat_template('Say "hi".\nTwice.')
    assert quoted.apply_chat_template(messages, tokenize=False).startswith('<|im_start|>system\nSay "hi".\nTwice.<|')
    assert SMOLLM2_DEFAULT_SYSTEM in use_chatml_tool_template(smollm2_tokenizer()).apply_chat_template(
        messages, tokenize=False
    )


def test_a_tokenizer_without_chatml_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"'<\|im_start\|>' is not one token of this tokenizer.*ChatML model"):
        use_chatml_tool_template(build_char_tokenizer())
    other_eos = smollm2_tokenizer()
    other_eos.eos_token = "<|endoftext|>"
    with pytest.raises(ValueError, match=r"EOS token is '<\|endoftext\|>'.*tokenizer.eos_token = '<\|im_end\|>'"):
        use_chatml_tool_template(other_eos)


def test_smollm2s_own_tokenizer_is_refused_at_construction_naming_the_helper(tmp_path):
    with pytest.raises(ValueError, match=r"cannot express tool calls.*use_chatml_tool_template\(tokenizer\)"):
        TRAPOTrainer(
            tiny_model(smollm2_tokenizer()),
            reward_funcs=numeric_answer_reward,
            args=TRAPOConfig(
                output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, report_to="none"
            ),
            train_dataset=gsm8k_like(4),
            processing_class=smollm2_tokenizer(),
            tools=[calculator],
        )


def test_trl_grpo_trainer_accepts_it_and_keeps_it(tmp_path, tok):
    from trl import GRPOConfig, GRPOTrainer

    trainer = GRPOTrainer(
        tiny_model(tok),
        reward_funcs=numeric_answer_reward,
        args=GRPOConfig(
            output_dir=str(tmp_path),
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=16,
            report_to="none",
            use_cpu=True,
            bf16=False,
        ),
        train_dataset=Dataset.from_list([{"prompt": EXCHANGE[:2], "answer": "#### 24"}] * 4),
        processing_class=tok,
        tools=[calculator],
    )
    assert trainer.tools == [calculator]
    assert trainer.chat_template is None  # prefix preserving: TRL renders with it rather than swapping in its own
    assert trainer.processing_class.response_template["start_anchor"] == "<|im_start|>assistant\n"


# ---------------------------------------------------------------------------------------------------------------------
# The trainer: tiny model, SmolLM2's tokenizer, the calculator
# ---------------------------------------------------------------------------------------------------------------------
def gsm8k_like(n: int) -> Dataset:
    system = {"role": "system", "content": "Solve the problem. You may call the calculator tool."}
    return Dataset.from_list(
        [{"prompt": [system, {"role": "user", "content": f"Half of {48 + 2 * i}?"}], "answer": f"#### {24 + i}"}
         for i in range(n)]
    )  # fmt: skip


def test_trapo_trainer_runs_a_tool_calling_round_with_the_calculator(tmp_path, tok):
    trainer = TRAPOTrainer(
        tiny_model(tok),
        reward_funcs=numeric_answer_reward,
        args=TRAPOConfig(
            output_dir=str(tmp_path),
            max_steps=1,
            per_device_train_batch_size=4,
            num_generations=2,
            response_length=128,
            max_tool_calling_iterations=2,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            activation_checkpointing=False,
            learning_rate=1e-3,
        ),
        train_dataset=gsm8k_like(4),
        processing_class=tok,
        tools=[calculator],
    )
    source = trainer.rollout_source
    assert isinstance(source, ToolRolloutSource)
    metrics, trainer_metrics = Metrics(), source.log_metric
    source.log_metric, source.prompts = metrics.log, FirstPrompts()
    # the first completion of each prompt calls the calculator well, the second with code: an error result, then a
    # wrong answer (rewards that differ within each group: a gradient)
    calls = itertools.cycle(["good", "code"])

    def script(context: str) -> str:
        if "<tool_response>" in context:
            result = context.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]
            return f"#### {result}<|im_end|>" if "error" not in result else "#### 0<|im_end|>"
        number = int(context.rsplit("Half of ", 1)[1].split("?")[0])
        return call_text(f"{number}/2" if next(calls) == "good" else "__import__('os')")

    source.engine = ScriptedEngine(tok, script)
    round_ = source.sample(4, step=0)
    texts = [tok.decode(c) for c in round_.completion_ids]
    suffix = tool_suffix_ids(tok, [{"role": "tool", "name": "calculator", "content": "24"}])
    first, answer = ids(tok, call_text("48/2")), ids(tok, "#### 24<|im_end|>")
    assert round_.completion_ids[0].tolist() == first + suffix + answer  # joined as token ids
    assert round_.completion_mask[0].tolist() == [1] * len(first) + [0] * len(suffix) + [1] * len(answer)
    assert texts[2].startswith(call_text("50/2")) and texts[2].endswith("#### 25<|im_end|>")
    assert "<tool_response>\n{'error': 'a function call is not allowed: write numbers," in texts[1]
    assert round_.scores.tolist() == [1.0, 0.0, 1.0, 0.0]  # the reward reads the last turn's `#### N`
    assert metrics["tools/call_frequency"] == [1.0] and metrics["tools/turns_mean"] == [2.0]
    assert metrics["tools/failure_frequency"] == [0.5]  # the two `__import__` calls of four
    assert metrics["tools/rollback_frequency"] == [0.0]  # every result fitted in response_length
    assert '"name": "calculator"' in tok.decode(round_.prompt_ids[0])  # the schema is in the prompt

    # and the trainer trains on such rounds (the scripted engine stays in place)
    source.log_metric = trainer_metrics
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    logged = trainer.state.log_history[0]
    assert trainer.state.global_step == 1 and logged["tools/call_frequency"] == 1.0
    assert logged["tools/failure_frequency"] == 0.5 and logged["rewards/numeric_answer_reward/mean"] == 0.5
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


# ---------------------------------------------------------------------------------------------------------------------
# The measurement script
# ---------------------------------------------------------------------------------------------------------------------
def test_gsm8k_solutions_become_tool_calling_traces():
    import agents_real

    answer = (
        "She sold 48/2 = <<48/2=24>>24 in May.\nSo 48+24 = <<48+24=72>>72 in all.\nThen 72*2 = <<72*2=144>>144.\n"
        "#### 144"
    )
    trace = agents_real.gsm8k_tool_trace("How many?", answer, "Solve.", max_calls=2)
    calls = [m["tool_calls"][0]["function"]["arguments"]["expression"] for m in trace if m.get("tool_calls")]
    assert calls == ["48/2", "48+24"]  # the first two annotations are calls; the third stays text
    assert [m["role"] for m in trace] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert trace[2]["content"] == "She sold 48/2 =" and trace[3]["content"] == "24"  # the calculator's result
    assert trace[4]["content"] == "24 in May.\nSo 48+24 ="
    assert trace[-1]["content"] == "72 in all.\nThen 72*2 = 144.\n#### 144"  # annotations removed
    plain = agents_real.gsm8k_tool_trace("How many?", "Just 3.\n#### 3", "Solve.")
    assert plain[2:] == [{"role": "assistant", "content": "Just 3.\n#### 3"}]


@pytest.mark.ci  # > 10 CPU-s; `.ci/run` runs it (`pytest -m ci`)
def test_the_measurement_scripts_quick_run_writes_its_results(tmp_path, capsys):
    import agents_real

    argv = ["--quick", "--work_dir", str(tmp_path), "--train_rows", "8", "--sft_traces", "4"]
    results = agents_real.main(argv)
    written = json.loads((tmp_path / "results.json").read_text())
    assert written == json.loads(json.dumps(results))
    assert results["settings"]["rl_rows_per_step"] == 8 and results["settings"]["max_tool_calling_iterations"] == 2
    assert results["settings"]["sft_trace_rows_per_step"] == 4
    assert results["settings"]["system_hint"].endswith(agents_real.TOOL_HINT)
    assert [s["step"] for s in results["steps"]] == [1, 2]
    for step in results["steps"]:
        assert set(agents_real.TOOL_METRICS) <= set(step) and step["wall_s"] > 0 and step["rollout_wall_s"] > 0
        assert step["loss/sft"] > 0  # the traces trained next to the RL rows
    # each step's round is 4 prompts x 2 completions: the 4 SFT rows came on top of the RL rows
    assert results["totals"]["rollouts"] == 16 and results["totals"]["peak_rss_mb"] > 0
    assert {s["step"] for s in results["samples"]} == {1, 2}  # the rounds of steps 1 and 2, by the log's numbering
    assert all(s["text"] and s["messages"][0]["role"] == "assistant" and s["question"] for s in results["samples"])
    printed = capsys.readouterr().out
    assert "calls/rollout" in printed and f"written: {tmp_path / 'results.json'}" in printed


def test_the_documented_chatml_example_trains(tmp_path, monkeypatch):
    """docs/agents.md's block, with the model folder replaced by a tiny random Llama over SmolLM2's tokenizer."""
    import compare_real
    from test_doc_commands import registered_block

    block = registered_block("docs/agents.md: # run: tools with a ChatML model whose template has none")
    tiny = compare_real.make_tiny_model(tmp_path / "tiny-smollm2")
    text = block.text.replace('"models/SmolLM2-135M-Instruct"', repr(str(tiny)))
    assert text != block.text
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(text, block.where(), "exec"), namespace)
    trainer = namespace["trainer"]
    assert isinstance(trainer.rollout_source, ToolRolloutSource) and trainer.state.global_step == 1
    assert {"tools/call_frequency", "tools/turns_mean"} <= set(trainer.state.log_history[0])
    prompt = trainer.processing_class.apply_chat_template(
        namespace["dataset"][0]["prompt"], tools=[calculator], tokenize=False, add_generation_prompt=True
    )
    assert '"name": "calculator"' in prompt and prompt.endswith("<|im_start|>assistant\n")
