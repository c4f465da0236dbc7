# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The built-in agent task (trl_trapo/tasks/agent.py) and its job (trl_trapo/jobs/agent.py, examples/trapo_tools.py).

The data's shapes and held-out split, every rendered trace within 128 characters, the tool and the reward on
hand-made completions, the evaluation's counting (on hand-made rollouts, and end to end with a scripted greedy engine
in place of the model), TRL's `GRPOTrainer(tools=...)` and `SFTTrainer` built on the task with the compact template,
and the example script run end to end for two steps.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers.utils import get_json_schema

from trl_trapo.agents import Rollout
from trl_trapo.data import tokenize_sft_dataset
from trl_trapo.jobs.agent import AgentJobArguments
from trl_trapo.sources import SampledRound
from trl_trapo.tasks import build_tiny_model, make_task_suite
from trl_trapo.tasks.agent import (
    MAX_TRACE_CHARACTERS,
    GreedyEngine,
    agent_trace,
    as_conversation,
    evaluate_agent,
    final_answer_reward,
    make_agent_task,
    mixed_sft_dataset,
    multiply,
    rendered_trace,
    score_rollouts,
)


PAIR = re.compile(r"^mul (\d+) (\d+)=$")


@pytest.fixture(scope="module")
def task():
    return make_agent_task(0, num_sft=400, num_rl=200, num_eval=50)


def operands(prompt) -> tuple[int, int]:
    text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
    a, b = PAIR.match(text).groups()
    return int(a), int(b)


# ---------------------------------------------------------------------------------------------------------------------
# The data
# ---------------------------------------------------------------------------------------------------------------------
def test_the_family_has_traces_prompts_and_a_held_out_split(task):
    assert task.sft.column_names == ["messages", "tools"] and len(task.sft) == 400
    assert set(task.rl_train.column_names) == {"prompt", "answer", "task"} and len(task.rl_train) == 200
    assert set(task.eval.column_names) == {"prompt", "answer", "task", "split"} and len(task.eval) == 50
    assert task.tools == [multiply] and task.reward_funcs == [final_answer_reward]
    for row in task.sft.select(range(20)):
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["user", "assistant", "tool", "assistant"]
        a, b = operands(row["messages"][0]["content"])
        call = row["messages"][1]["tool_calls"][0]["function"]
        assert call == {"name": "multiply", "arguments": {"a": a, "b": b}}
        assert row["messages"][2]["content"] == row["messages"][3]["content"] == str(a * b)
        assert json.loads(row["tools"]) == [get_json_schema(multiply)]
    for dataset in (task.rl_train, task.eval):
        for row in dataset:
            a, b = operands(row["prompt"])
            assert row["answer"] == str(a * b) and row["task"] == "mul" and len(row["prompt"]) == 1
            assert all(len(str(x)) in (2, 3) for x in (a, b))
    held_out = {operands(p) for p in task.eval["prompt"]}
    trained = {operands(p) for p in task.rl_train["prompt"]} | {
        operands(m[0]["content"]) for m in task.sft["messages"]
    }
    assert not held_out & (trained | {(b, a) for a, b in trained})
    # products of every length are common (a fixed-offset copy would fail the shorter ones)
    lengths = [len(answer) for answer in make_agent_task(1, num_sft=0, num_rl=0, num_eval=400).eval["answer"]]
    shares = {n: lengths.count(n) / len(lengths) for n in (3, 4, 5, 6)}
    assert sum(shares.values()) == 1.0 and min(shares.values()) >= 0.03 and max(shares.values()) <= 0.5, shares


def test_the_task_is_seeded(task):
    again = make_agent_task(0, num_sft=400, num_rl=200, num_eval=50)
    assert again.sft["messages"] == task.sft["messages"] and again.eval["prompt"] == task.eval["prompt"]
    assert make_agent_task(1, num_sft=400, num_rl=200, num_eval=50).eval["prompt"] != task.eval["prompt"]


def test_every_rendered_trace_fits_128_characters(tool_tok):
    """Prompt + every turn, as the template renders it, for 2,000 traces and the longest possible one."""
    traces = make_agent_task(3, num_sft=2000, num_rl=0, num_eval=1).sft
    lengths = [len(rendered_trace(tool_tok, row["messages"], row["tools"])) for row in traces]
    longest = rendered_trace(tool_tok, agent_trace(999, 999), traces[0]["tools"])
    assert longest == (
        'T:multiply(a,b)\nu:mul 999 999=\na:<c>{"name":"multiply","arguments":{"a":999,"b":999}}</c></s>t:998001\n'
        "a:998001</s>"
    )
    assert max(lengths) <= len(longest) <= MAX_TRACE_CHARACTERS == 128
    assert len(tool_tok(longest, add_special_tokens=False)["input_ids"]) <= 128


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_eval": 0}, "`num_eval` must be >= 1"),
        ({"num_sft": -1}, "`num_sft` must be a whole number >= 0"),
        ({"operand_digits": (4,)}, "`operand_digits` must list digit counts of 1, 2 or 3"),
        ({"operand_digits": ()}, "`operand_digits`"),
        ({"operand_digits": (1,), "num_eval": 30}, "holds out too much"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_agent_task(0, **kwargs)


def test_the_chat_rows_of_the_other_families_train_next_to_the_traces(tool_tok, task):
    suite = make_task_suite(0, num_pretrain_docs=10, num_sft_per_task=4, num_rl_per_task=4, num_eval_per_task=4)
    chat = as_conversation(suite.sft)
    assert chat[0]["messages"] == [
        {"role": "user", "content": suite.sft[0]["prompt"]},
        {"role": "assistant", "content": suite.sft[0]["completion"]},
    ]
    assert as_conversation(suite.eval)[0]["prompt"] == [{"role": "user", "content": suite.eval[0]["prompt"]}]
    mixed = mixed_sft_dataset([task.sft.select(range(8)), chat])
    assert len(mixed) == 8 + len(chat)
    rows = tokenize_sft_dataset(mixed, tool_tok, 128, assistant_only_loss=True)
    trained = {tool_tok.decode([t for t, m in zip(r["input_ids"], r["completion_mask"]) if m]) for r in rows}
    assert f"{suite.sft[0]['completion']}</s>" in trained  # a demonstration: its answer and EOS
    a, b = operands(task.sft[0]["messages"][0]["content"])
    call = f'<c>{{"name":"multiply","arguments":{{"a":{a},"b":{b}}}}}</c></s>{a * b}</s>'
    assert call in trained  # a trace: both assistant turns, not the tool's result
    with pytest.raises(ValueError, match="as_conversation"):
        as_conversation(chat)


# ---------------------------------------------------------------------------------------------------------------------
# The tool and the reward
# ---------------------------------------------------------------------------------------------------------------------
def test_the_tool_multiplies_integers_and_refuses_anything_else():
    assert multiply(347, 238) == 82586
    for bad in ("3", 3.0, True, None):
        with pytest.raises(TypeError, match="must be an integer"):
            multiply(bad, 2)
    schema = get_json_schema(multiply)["function"]
    assert schema["name"] == "multiply" and schema["parameters"]["required"] == ["a", "b"]


def test_the_reward_is_exact_match_of_the_final_assistant_message():
    call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 6, "b": 7}}}
    solved = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "multiply", "content": "42"},
        {"role": "assistant", "content": " 42 "},
    ]
    wrong_final = solved[:2] + [{"role": "assistant", "content": "24"}]
    call_only = solved[:1]  # the rollout ended after the call: no final answer
    after_tool = solved[:2]  # the last assistant message is still the call
    answers = final_answer_reward([solved, wrong_final, call_only, after_tool, "42", "4 2"], ["42"] * 6)
    assert answers == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="must match one to one"):
        final_answer_reward([solved], ["42", "1"])


# ---------------------------------------------------------------------------------------------------------------------
# The evaluation
# ---------------------------------------------------------------------------------------------------------------------
def rollout(messages, calls=0, failures=0, turns=1, answer="42"):
    return Rollout({"answer": answer}, [], {}, [], messages=messages, calls=calls, failures=failures, turns=turns)


def test_scores_count_accuracy_and_valid_calls_by_hand():
    right = [
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "42"},
    ]
    wrong = [{"role": "assistant", "content": "41"}]
    rollouts = [
        rollout(right, calls=1, turns=2),
        rollout(right, calls=2, failures=1, turns=3),  # a failed call, then a good one
        rollout(wrong),
        rollout(right, calls=1, failures=1, turns=2, answer="7"),
    ]
    assert score_rollouts(rollouts) == {
        "accuracy": 2 / 4,
        "tool_call_validity": (4 - 2) / 4,  # calls 1 + 2 + 0 + 1, failures 0 + 1 + 0 + 1
        "tool_calls_per_prompt": 4 / 4,
        "turns_per_prompt": 8 / 4,
    }
    assert score_rollouts([rollout(wrong)])["tool_call_validity"] == 0.0  # no call: nothing valid
    with pytest.raises(ValueError, match="no rollouts"):
        score_rollouts([])


def test_the_greedy_engine_decodes_as_generate_does(tool_tok):
    model = build_tiny_model(tool_tok, seed=1).eval()
    prompts = [
        tool_tok("u:mul 12 34=\na:", add_special_tokens=False)["input_ids"],
        tool_tok("x", add_special_tokens=False)["input_ids"],
    ]
    sampled = GreedyEngine(model, tool_tok).sample([{"prompt_ids": p} for p in prompts], 1, 0, 1.0, max_new_tokens=12)
    for prompt, completion in zip(prompts, sampled.completion_ids):
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=tool_tok.eos_token_id,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
        if tool_tok.eos_token_id in out:
            out = out[: out.index(tool_tok.eos_token_id) + 1]
        assert completion.tolist() == out


def scripted_sample(self, examples, group, step, temperature, max_new_tokens=None):
    """A perfect agent in place of the model's greedy decoding: it calls `multiply` with the prompt's operands (with
    or without a tool list in the prompt, as a trained model does), then copies the tool's result, or answers `?`
    after an error."""
    turns = []
    for example in examples:
        context = self.tokenizer.decode(example["prompt_ids"])
        result = re.search(r"t:(.*)\na:$", context)
        if result:
            text = (result.group(1) if result.group(1).isdigit() else "?") + "</s>"
        else:
            a, b = re.search(r"u:mul (\d+) (\d+)=\na:$", context).groups()
            text = f'<c>{{"name":"multiply","arguments":{{"a":{a},"b":{b}}}}}</c></s>'
        turns.append(self.tokenizer(text, add_special_tokens=False)["input_ids"][:max_new_tokens])
    logps = [torch.zeros(len(t)) for t in turns]
    return SampledRound(
        examples, turns, version=step, old_per_token_logps=logps, prompt_ids=[e["prompt_ids"] for e in examples]
    )


def test_evaluation_runs_the_tool_loop_with_and_without_the_tool(tool_tok, task, monkeypatch):
    monkeypatch.setattr(GreedyEngine, "sample", scripted_sample)
    model = build_tiny_model(tool_tok, seed=0)
    rows = task.eval.select(range(6))
    assert evaluate_agent(model, tool_tok, rows) == {
        "accuracy": 1.0,
        "tool_call_validity": 1.0,
        "tool_calls_per_prompt": 1.0,
        "turns_per_prompt": 2.0,
    }
    # the tool withheld: the call fails as an unknown tool, the answer after the error is wrong (a budget with room
    # for the error message: at 96 tokens a rollout with 3-digit operands ends after its call)
    assert evaluate_agent(model, tool_tok, rows, tools=(), response_length=128) == {
        "accuracy": 0.0,
        "tool_call_validity": 0.0,
        "tool_calls_per_prompt": 1.0,
        "turns_per_prompt": 2.0,
    }
    # a budget with room for the call but not for the tool's result: the rollout ends after the (valid) call
    short = evaluate_agent(model, tool_tok, rows, response_length=60)
    assert short["accuracy"] == 0.0 and short["tool_call_validity"] == 1.0 and short["turns_per_prompt"] == 1.0
    with pytest.raises(ValueError, match="needs a `answer` column"):
        evaluate_agent(model, tool_tok, rows.remove_columns("answer"))


def test_evaluation_of_the_untrained_model(tool_tok, task):
    """The real loop on the random model: it never solves a product, and its mode is restored."""
    model = build_tiny_model(tool_tok, seed=0).train()
    metrics = evaluate_agent(model, tool_tok, task.eval.select(range(4)), response_length=24)
    assert metrics["accuracy"] == 0.0 and 1.0 <= metrics["turns_per_prompt"] <= 3.0
    assert model.training


# ---------------------------------------------------------------------------------------------------------------------
# TRL's trainers accept the task, the template and the tool (the serial relay's stages)
# ---------------------------------------------------------------------------------------------------------------------
def test_trl_grpo_trainer_builds_with_the_task_and_parses_its_calls(tmp_path, tool_tok, task):
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import parse_response

    trainer = GRPOTrainer(
        build_tiny_model(tool_tok, seed=0),
        reward_funcs=task.reward_funcs,
        args=GRPOConfig(
            output_dir=str(tmp_path),
            per_device_train_batch_size=8,
            num_generations=8,
            max_completion_length=80,
            max_tool_calling_iterations=2,
            report_to="none",
            use_cpu=True,
            bf16=False,
        ),
        train_dataset=task.rl_train,
        processing_class=tool_tok,
        tools=task.tools,
    )
    assert trainer.tools == [multiply] and trainer.max_tool_calling_iterations == 2
    prompt = tool_tok.apply_chat_template(
        task.rl_train[0]["prompt"], tools=trainer.tools, add_generation_prompt=True, tokenize=False
    )
    assert prompt.startswith("T:multiply(a,b)\nu:mul ") and prompt.endswith("=\na:")
    a, b = operands(task.rl_train[0]["prompt"])
    turn = tool_tok(f'<c>{{"name":"multiply","arguments":{{"a":{a},"b":{b}}}}}</c></s>', add_special_tokens=False)
    parsed = parse_response(
        tool_tok, turn["input_ids"], prefix=tool_tok("a:", add_special_tokens=False)["input_ids"], tools=trainer.tools
    )
    assert parsed["tool_calls"] == [
        {"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}
    ]


# ---------------------------------------------------------------------------------------------------------------------
# The example script
# ---------------------------------------------------------------------------------------------------------------------
def test_the_job_arguments_refuse_bad_values():
    with pytest.raises(ValueError, match="--num_eval=0"):
        AgentJobArguments(num_eval=0)
    with pytest.raises(ValueError, match="--heldout_docs=-1"):
        AgentJobArguments(heldout_docs=-1)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num_traces", "0"], "--num_traces=0: must be a whole number >= 1"),
        (["--heldout_docs", "5000"], "--heldout_docs=5000 holds out every one of the 3000 pretraining documents"),
        (["--max_tool_calling_iterations", "-1"], "max_tool_calling_iterations"),
    ],
)
def test_a_user_error_is_one_message_and_exit_status_2(argv, message, capsys, tmp_path):
    from trl_trapo.jobs.agent import run

    assert run([*argv, "--output_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "TRAPO_DEBUG=1" in err and "Traceback" not in err


@pytest.mark.slow
def test_the_documented_example_runs_two_steps_and_writes_its_results(tmp_path):
    """docs/agents.md's command, as written, shortened to two steps on small data; it writes
    `trapo-tools-output/eval_results.json` with every metric before and after, the model and a summary."""
    from test_doc_commands import logical_lines, registered_block, run_shell, sandbox, with_flags

    commands = logical_lines(registered_block("docs/agents.md: python examples/trapo_tools.py").text)
    short = [
        "--max_steps", "2", "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1",
        "--num_generations", "4", "--response_length", "48", "--num_traces", "32", "--num_rl_prompts", "16",
        "--num_eval", "4", "--other_sft_per_task", "8", "--heldout_docs", "10",
    ]  # fmt: skip
    work = sandbox(tmp_path)
    output = run_shell(with_flags(commands, "python examples/trapo_tools.py", short), work)
    out = work / "trapo-tools-output"
    results = json.loads((out / "eval_results.json").read_text())
    metrics = (
        "agent_accuracy_with_tool", "agent_accuracy_without_tool", "agent_tool_call_validity",
        "agent_tool_calls_per_prompt", "agent_tool_calls_per_prompt_without_tool", "other_accuracy",
        "other_accuracy_rev", "other_accuracy_nxt", "other_accuracy_min", "heldout_loss",
    )  # fmt: skip
    expected = {f"eval_{m}{suffix}" for m in metrics for suffix in ("", "_initial")} | {
        "train_loss",
        "train_runtime_s",
    }
    assert set(results) == expected
    assert all(0.0 <= results[f"eval_{m}"] <= 1.0 for m in metrics if "accuracy" in m or "validity" in m)
    assert results["eval_heldout_loss"] != results["eval_heldout_loss_initial"]  # two steps moved the weights
    assert (out / "model.safetensors").exists()
    assert "agent_accuracy_with_tool" in output  # the summary
