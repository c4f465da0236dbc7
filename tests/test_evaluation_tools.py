# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Evaluation of a run with `tools=` / `environment_factory=` (trial 12's N42): `trainer.evaluate()` and
`generate_completions()` roll each eval prompt out greedily through the training loop — the prompt rendered with the
tool schemas (after the environment's `reset`), the calls run, their results appended, the next turn — score the
rollouts as training scores them, and report training's `tools/*` metrics under the eval prefix. A run without tools
evaluates as before: one greedy completion per prompt, rendered without schemas.

The tiny random model never calls a tool: the policy's `generate` is replaced by a scripted one that continues each
row of the batch from its decoded context, so everything around it (the evaluator, the loop, the tools, the scoring)
is the real code.
"""

from __future__ import annotations

import re
import threading

import pytest
import torch
from conftest import make_tiny_config
from datasets import Dataset
from test_agents import ThreadRanks, call, ids

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.agents import AgentSpec
from trl_trapo.evaluation import eval_metric_names
from trl_trapo.sources import SampledRound
from trl_trapo.tasks import build_tiny_model


CALLS: list[tuple[int, int]] = []  # every call of `multiply`, in order


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    CALLS.append((a, b))
    return a * b


def correct(completions, answer, **kwargs):
    """TRL's structured completion: the final assistant message must be the answer."""
    return [float(c[-1]["content"].strip() == a) for c, a in zip(completions, answer)]


def products(n: int = 6) -> Dataset:
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"{i}*7="}] for i in range(2, 2 + n)],
            "answer": [str(7 * i) for i in range(2, 2 + n)],
        }
    )


def config(tmp_path, **overrides) -> TRAPOConfig:
    """`TINY_CONFIG` for evaluating tool rounds: two calls a rollout within 96 tokens; then `overrides`."""
    settings = dict(
        max_steps=2,
        per_device_eval_batch_size=4,
        response_length=96,
        max_prompt_length=40,
        max_tool_calling_iterations=2,
        disable_tqdm=True,
    )
    return make_tiny_config(tmp_path, **{**settings, **overrides})


def scripted_generate(tok, script, contexts: list[str]):
    """The policy's `generate`: each row of the left-padded batch continues with `script(its decoded context)`, cut
    to `max_new_tokens` and padded on the right; every context is recorded in `contexts`."""

    def generate(input_ids=None, attention_mask=None, generation_config=None, **kwargs):
        turns = []
        for row, mask in zip(input_ids, attention_mask):
            context = tok.decode(row[mask.bool()])
            contexts.append(context)
            turns.append(ids(tok, script(context))[: generation_config.max_new_tokens])
        width = max(len(t) for t in turns)
        new = torch.tensor([t + [generation_config.pad_token_id] * (width - len(t)) for t in turns])
        return torch.cat([input_ids, new.to(input_ids.device)], dim=1)

    return generate


def agent(context: str) -> str:
    """A policy that has learnt its tool: shown `multiply`'s schema (`T:multiply(a,b)`), it calls it with the
    question's operands; given the result, it answers with it. Without the schema it cannot multiply (`?`)."""
    if "u:" not in context:  # a throwaway context (a rank without rows taking part in the others' turns)
        return "?</s>"
    last = context.rsplit("u:", 1)[1]
    if "t:" in last:
        return last.rsplit("t:", 1)[1].split("\n")[0] + "</s>"
    if context.startswith("T:multiply(a,b)\n"):
        a, b = re.match(r"(\d+)\*(\d+)=", last).groups()
        return call("multiply", f'{{"a":{a},"b":{b}}}') + "</s>"
    return "?</s>"


def test_evaluating_a_tools_run_renders_the_schemas_runs_the_calls_and_scores_the_tools_results(tmp_path, tool_tok):
    """Before the fix the eval prompt was rendered without the schemas (`u:2*7=\\na:` where training renders
    `T:multiply(a,b)\\nu:2*7=\\na:`), one turn was generated and no call ever ran: eval_reward 0.0, no tools
    metric, although the policy solves every prompt with its tool."""
    dataset = products()
    trainer = TRAPOTrainer(
        build_tiny_model(tool_tok, seed=0),
        reward_funcs=correct,
        args=config(tmp_path),
        train_dataset=dataset,
        eval_dataset=dataset,
        processing_class=tool_tok,
        tools=[multiply],
    )
    contexts: list[str] = []
    trainer.model.generate = scripted_generate(tool_tok, agent, contexts)
    CALLS.clear()
    metrics = trainer.evaluate()
    # each prompt rendered as training renders it, with the tool's schema, then continued after the tool's result
    first_turns = [c for c in contexts if "t:" not in c]
    assert sorted(first_turns) == sorted(
        tool_tok.apply_chat_template(p, tools=[multiply], add_generation_prompt=True, tokenize=False)
        for p in dataset["prompt"]
    )
    assert sorted(CALLS) == [(i, 7) for i in range(2, 8)]  # every rollout's call ran, once
    assert metrics["eval_reward"] == 1.0 and metrics["eval_rewards/correct"] == 1.0  # the answers are the results
    assert metrics["eval_tools/call_frequency"] == 1.0
    assert metrics["eval_tools/failure_frequency"] == 0.0
    assert metrics["eval_tools/turns_mean"] == 2.0
    assert metrics["eval_tools/rollback_frequency"] == metrics["eval_tools/truncated_frequency"] == 0.0
    # the completion is the whole rollout: the call, the template's tool suffix with the result, the answer
    lengths = [
        len(ids(tool_tok, call("multiply", f'{{"a":{i},"b":7}}') + f"</s>t:{7 * i}\na:{7 * i}</s>"))
        for i in range(2, 8)
    ]
    assert metrics["eval_completion_length"] == pytest.approx(sum(lengths) / len(lengths))
    # TRL's `completions/*` count the policy's tokens only (its tool mask): the call and the answer, not the result
    policy = [
        len(ids(tool_tok, call("multiply", f'{{"a":{i},"b":7}}') + "</s>")) + len(ids(tool_tok, f"{7 * i}</s>"))
        for i in range(2, 8)
    ]
    assert metrics["eval_completions/mean_length"] == pytest.approx(sum(policy) / len(policy))
    assert (metrics["eval_completions/min_length"], metrics["eval_completions/max_length"]) == (
        min(policy),
        max(policy),
    )
    assert metrics["eval_completions/clipped_ratio"] == 0.0  # every last turn ended with the stop token
    assert metrics["eval_completions/mean_terminated_length"] == pytest.approx(sum(policy) / len(policy))
    assert metrics["eval_rewards/correct/mean"] == 1.0 and metrics["eval_rewards/correct/std"] == 0.0
    # every key the evaluator's table lists for a tools run (the one `metric_for_best_model` is checked against)
    assert set(metrics) - {"epoch"} == set(eval_metric_names(dataset, ["correct"], tools=True))
    # the sample table goes through the same loop
    table = trainer.generate_completions()
    assert [row["score"] for row in table] == [1.0] * len(dataset)
    for row, answer in zip(table, dataset["answer"]):
        assert row["completion"].endswith(f"t:{answer}\na:{answer}"), row


class Abacus:
    """An environment: `reset` records the row's answer and appends ` (abacus)` to the prompt; its `multiply` is the
    tool; `get_reward` is the number of calls the rollout made."""

    resets: list[dict] = []

    def reset(self, **row) -> str:
        Abacus.resets.append(row)
        self.used = 0
        return " (abacus)"

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.used += 1
        return a * b

    def get_reward(self) -> float:
        return float(self.used)


def test_evaluating_an_environment_run_resets_fresh_environments_and_scores_them(tmp_path, tool_tok):
    """environment_factory: each eval rollout gets an environment `reset` with its row (the row's own columns, not
    `prompt_ids`), the reset text in its prompt, the environment's methods as tools, and the environment's
    `get_reward` and the reward functions' `environments=` as in training."""

    def env_agent(context):  # calls only when the environment's reset text and its tool are in the prompt
        if "t:" not in context and not context.rstrip("a:\n").endswith("(abacus)"):
            return "?</s>"
        return agent(context)

    dataset = products(4)
    trainer = TRAPOTrainer(
        build_tiny_model(tool_tok, seed=0),
        reward_funcs=correct,
        args=config(tmp_path),
        train_dataset=dataset,
        processing_class=tool_tok,
        environment_factory=Abacus,
    )
    contexts: list[str] = []
    trainer.model.generate = scripted_generate(tool_tok, env_agent, contexts)
    Abacus.resets = []
    metrics = trainer.evaluate(dataset)
    assert [set(row) for row in Abacus.resets] == [{"prompt", "answer"}] * 4
    assert sorted(row["answer"] for row in Abacus.resets) == sorted(dataset["answer"])
    assert metrics["eval_rewards/Abacus"] == 1.0  # get_reward: one call per rollout
    assert metrics["eval_rewards/correct"] == 1.0
    assert metrics["eval_tools/call_frequency"] == 1.0 and metrics["eval_tools/turns_mean"] == 2.0


def test_a_run_without_tools_evaluates_as_before(tmp_path, tool_tok):
    """No tools: one greedy completion per prompt, rendered without schemas, no `tools/*` metric; the numbers are
    those of transformers' greedy `generate` on each prompt (one prompt per batch: no padding)."""
    tokenizer = tool_tok
    dataset = products(4)
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=correct,
        args=config(tmp_path, per_device_eval_batch_size=1, response_length=12),
        train_dataset=dataset,
        eval_dataset=dataset,
        processing_class=tokenizer,
    )
    metrics = trainer.evaluate()
    assert not any(key.startswith("eval_tools/") for key in metrics), metrics
    table = trainer.generate_completions()
    model, eos = trainer.model.eval(), tokenizer.eos_token_id
    lengths, rewards, texts = [], [], []
    for prompt, answer in zip(dataset["prompt"], dataset["answer"]):
        prompt_ids = tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        out = model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=eos
        )[0, len(prompt_ids) :].tolist()
        out = out[: out.index(eos) + 1] if eos in out else out
        lengths.append(len(out))
        texts.append(tokenizer.decode(out, skip_special_tokens=True))
        rewards.append(float(texts[-1].strip() == answer))
    assert [row["completion"] for row in table] == texts
    assert metrics["eval_completion_length"] == pytest.approx(sum(lengths) / len(lengths))
    assert metrics["eval_reward"] == pytest.approx(sum(rewards) / len(rewards))
    # one turn per prompt, rendered without schemas: the scripted policy sees no tool and cannot multiply
    contexts: list[str] = []
    trainer.model.generate = scripted_generate(tokenizer, agent, contexts)
    metrics = trainer.evaluate(dataset)
    assert contexts == [f"u:{i}*7=\na:" for i in range(2, 6)]
    assert metrics["eval_reward"] == 0.0 and metrics["eval_completion_length"] == 2.0  # `?</s>`


def test_prompts_the_tool_loop_cannot_render_are_refused_before_anything_runs(tmp_path, tool_tok):
    """A tools run evaluates through the chat template's tool rendering: plain-text (or tokenized) eval prompts are
    refused at construction, naming the eval set and the fix, and so is such a set given to `evaluate()`."""
    text_prompts = Dataset.from_dict({"prompt": ["2*7="], "answer": ["14"]})
    common = dict(reward_funcs=correct, train_dataset=products(), processing_class=tool_tok, tools=[multiply])
    with pytest.raises(ValueError, match=r"`eval_dataset\['plain'\]` holds prompts the tool loop cannot render"):
        TRAPOTrainer(
            build_tiny_model(tool_tok, seed=0),
            args=config(tmp_path),
            eval_dataset={"chat": products(2), "plain": text_prompts},
            **common,
        )
    trainer = TRAPOTrainer(build_tiny_model(tool_tok, seed=0), args=config(tmp_path), **common)
    with pytest.raises(ValueError, match="as_conversation"):
        trainer.evaluate(text_prompts)
    # a dict of environments routes eval rows by their `environment` column, as training's
    with pytest.raises(ValueError, match="`eval_dataset` has no `environment` column"):
        TRAPOTrainer(
            build_tiny_model(tool_tok, seed=0),
            args=config(tmp_path),
            reward_funcs=correct,
            train_dataset=products().add_column("environment", ["abacus"] * 6),
            eval_dataset=products(2),
            processing_class=tool_tok,
            environment_factory={"abacus": Abacus},
        )


class LockstepEngine:
    """A scripted engine whose every `sample` is a collective between thread ranks (as generation under ZeRO-3 /
    FSDP is); records each call's contexts."""

    def __init__(self, tok, script, ranks: ThreadRanks, rank: int):
        self.tok, self.script, self.ranks, self.rank, self.calls = tok, script, ranks, rank, []

    def sample(self, examples, group, step, temperature, max_new_tokens=None, lockstep=False):
        assert lockstep
        self.ranks.collective(self.rank, "generate")
        contexts = [list(e["prompt_ids"]) for e in examples]
        self.calls.append([self.tok.decode(c) for c in contexts])
        turns = [ids(self.tok, self.script(self.tok.decode(c)))[:max_new_tokens] for c in contexts]
        return SampledRound(examples, turns, version=step, prompt_ids=contexts)


def test_a_rank_without_eval_rows_takes_part_in_the_other_ranks_turns(tool_tok):
    """Several processes: the eval rows are sharded by rank, and a small eval set leaves a rank none. The loop's
    turns are collectives (the ranks generate in lockstep, as in training): the rank without rows still makes every
    `generate` call, with a throwaway one-token context, and returns no rollout."""
    from trl_trapo.agents import greedy_tool_rollouts

    ranks, dataset = ThreadRanks(2), products(2)
    shards = [dataset.select([]), dataset]
    spec = AgentSpec.build([multiply], None)
    engines = [LockstepEngine(tool_tok, agent, ranks, rank) for rank in (0, 1)]
    results, errors = [None, None], []

    def run(rank):
        try:
            results[rank] = greedy_tool_rollouts(
                engines[rank],
                shards[rank],
                spec,
                tool_tok,
                response_length=96,
                context=256,
                max_iterations=2,
                sum_over_ranks=lambda tensor: ranks.collective(rank, "sum", tensor),
            )
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)
            ranks.barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert results[0] == [] and [r.calls for r in results[1]] == [1, 1]
    assert [r.messages[-1]["content"] for r in results[1]] == ["14", "21"]
    assert len(engines[0].calls) == len(engines[1].calls) == 2  # the call turn, the answer turn
    assert engines[0].calls == [["</s>"], ["</s>"]]  # throwaway contexts: the EOS alone


def test_a_tools_runs_reward_functions_are_tried_on_its_eval_prompts_at_construction(tmp_path, tool_tok):
    """Evaluation scores a tools run's eval rollouts with the reward functions (and the environments): they are
    called on the eval set's first rows at construction, as for any run, so a column they read that the eval set
    lacks is refused now, not at the first evaluation after training steps (tools runs used to skip this check)."""
    from trl_trapo.rewards import RewardFunctionError

    no_answers = products(2).remove_columns("answer")
    with pytest.raises(
        RewardFunctionError, match=r"(?s)first 2 row\(s\) of `eval_dataset`.*needs the argument\(s\) 'answer'"
    ):
        TRAPOTrainer(
            build_tiny_model(tool_tok, seed=0),
            reward_funcs=correct,
            args=config(tmp_path),
            train_dataset=products(),
            eval_dataset=no_answers,
            processing_class=tool_tok,
            environment_factory=Abacus,
        )
