# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""A TRL `GRPOTrainer` agent script on TRAPO (only the import changed), with a per-rank record — for
tests/test_distributed_jobs.py's tool-calling tests.

    accelerate launch --num_processes 2 tests/distributed_tools_job.py --mode tools --output_dir out

The script is what a GRPO user writes: a model, the built-in agent task's `mul a b=` prompts, reward functions, and
`tools=[multiply, add, divide]` (sync, async, and one that raises on `b=0`) or `environment_factory=Calculator` (the
same three as methods, one instance per rollout, a `get_reward`). The tiny model is built from a config in-process
(no Hub, no network).

The tiny random model never writes a tool call, so the test forces its calls (as tests/test_agents.py scripts its
turns), keeping the model's own generation in every turn: [`ForcedCalls`] wraps the trainer's rollout engine, lets it
generate every turn of every rollout (the same `generate` calls, collectives included, as without the wrapper), and
replaces the turns of the script with a call:

- the first turn of every rollout calls `multiply(a, b)` with the prompt's operands, or `divide(a, 0)` (which fails)
  when `a` is odd;
- on rank 1 only, the second turn calls `add(a, b)` (async): rank 1's rollouts take 3 turns, rank 0's 2, so the ranks
  run different numbers of turns (and `generate` calls) in every round;
- every other turn is the model's own sample.

After training, `trainer.evaluate()` rolls held-out prompts out through the same loop (greedy, the ranks' turns in
lockstep), its turns forced the same way ([`force_eval_calls`]): `one` (1 row: rank 1's shard is empty, it takes part
in rank 0's turns) and `three` (3 rows: rank 0 rolls out 2, rank 1 one with an extra call).

Every rank writes `<output_dir>/ranks/rank<r>.json` (`distributed_job.RankRecorder`: logs, final-weight digest) and
`<output_dir>/ranks/tools<r>.json`: `initial_digest` (the weights before training), `rounds`, per generation
round this rank ran: `step`, `rollouts`, `calls`, `failures`, `turns`, `rolled_back` (this rank's sums, from its
rollouts) and `tool_messages` (tool name -> results; failed ones as `error`), and `eval` (the metrics `evaluate()`
returned on this rank, per eval set).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import re

import torch
from datasets import Dataset
from distributed_job import RankRecorder  # tests/ is the script's directory: on sys.path

from trl_trapo import TRAPOConfig as GRPOConfig  # was: from trl import GRPOConfig, GRPOTrainer
from trl_trapo import TRAPOTrainer as GRPOTrainer
from trl_trapo.agents import use_tool_chat_template
from trl_trapo.distributed import full_state_dict
from trl_trapo.sources import SampledRound
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model
from trl_trapo.tasks.agent import final_answer, final_answer_reward, make_agent_task


# ---- the user's tools ------------------------------------------------------------------------------------------------
def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


async def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    await asyncio.sleep(0.01)
    return a + b


def divide(a: int, b: int) -> int:
    """Divide two integers, rounding down.

    Args:
        a: The dividend.
        b: The divisor (not 0).
    """
    if b == 0:
        raise ValueError("b is 0")  # a failed call (a short error result: the budget holds it)
    return a // b


class Calculator:
    """The same tools as an environment: one instance per rollout, `reset` with its row."""

    def reset(self, **row) -> None:
        self.successes = 0

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.successes += 1
        return a * b

    async def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        await asyncio.sleep(0.01)
        self.successes += 1
        return a + b

    def divide(self, a: int, b: int) -> int:
        """Divide two integers, rounding down.

        Args:
            a: The dividend.
            b: The divisor (not 0).
        """
        result = divide(a, b)
        self.successes += 1
        return result

    def get_reward(self) -> float:
        return float(self.successes)


def answer_length(completions, **kwargs) -> list[float]:
    """A reward that differs within a group (the model's own final turn): a gradient for RL."""
    return [len(final_answer(c)) / 100 for c in completions]


# ---- the forced calls ------------------------------------------------------------------------------------------------
PROMPT = re.compile(r"u:mul (\d+) (\d+)=")


def forced_call(context: str, rank: int) -> str | None:
    """The call the script writes for this turn (module docstring), or None for the model's own turn."""
    a, b = map(int, PROMPT.search(context).groups())
    results = context.count("</s>t:")  # tool results so far: each follows the end of the turn that called
    if results == 0:
        name, arguments = ("multiply", {"a": a, "b": b}) if a % 2 == 0 else ("divide", {"a": a, "b": 0})
    elif results == 1 and rank == 1:
        name, arguments = "add", {"a": a, "b": b}
    else:
        return None
    return "<c>" + json.dumps({"name": name, "arguments": arguments}, separators=(",", ":")) + "</c></s>"


class ForcedCalls:
    """The trainer's rollout engine, generating every turn as it would, with the script's calls in place of the
    model's turns where [`forced_call`] writes one (behaviour log-prob 0: a forced token has probability 1)."""

    def __init__(self, engine, tokenizer, rank: int):
        self.engine, self.tokenizer, self.rank = engine, tokenizer, rank

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def sample(self, examples, group, step, temperature, max_new_tokens=None, **kwargs) -> SampledRound:
        sampled = self.engine.sample(examples, group, step, temperature, max_new_tokens=max_new_tokens, **kwargs)
        completions, logps = list(sampled.completion_ids), list(sampled.old_per_token_logps)
        for i, example in enumerate(examples):
            call = forced_call(self.tokenizer.decode(example["prompt_ids"]), self.rank)
            if call is not None:
                ids = self.tokenizer(call, add_special_tokens=False)["input_ids"][:max_new_tokens]
                completions[i] = torch.tensor(ids, dtype=torch.long)
                logps[i] = torch.zeros(len(ids))
        sampled.completion_ids, sampled.old_per_token_logps = completions, logps
        return sampled


def force_eval_calls(tokenizer, rank: int) -> None:
    """Evaluation's greedy turns ([`~trl_trapo.agents.GreedyTurnEngine`], built per evaluation) with the script's calls
    in place of the model's turns, as [`ForcedCalls`] does for training's."""
    from trl_trapo.agents import GreedyTurnEngine

    greedy = GreedyTurnEngine.sample

    def sample(self, examples, group, step, temperature, max_new_tokens=None, **kwargs):
        sampled = greedy(self, examples, group, step, temperature, max_new_tokens=max_new_tokens, **kwargs)
        completions = list(sampled.completion_ids)
        for i, example in enumerate(examples):
            context = tokenizer.decode(example["prompt_ids"])
            call = forced_call(context, rank) if PROMPT.search(context) else None  # not a throwaway context
            if call is not None:
                completions[i] = torch.tensor(tokenizer(call, add_special_tokens=False)["input_ids"][:max_new_tokens])
        sampled.completion_ids, sampled.old_per_token_logps = completions, [torch.zeros(len(c)) for c in completions]
        return sampled

    GreedyTurnEngine.sample = sample


def record_rounds(source, rounds: list[dict]) -> None:
    """Append this rank's sums of every round the tool-calling source runs to `rounds`."""
    run_turns = source.run_turns

    def recorded(rollouts, step):
        run_turns(rollouts, step)
        messages: dict[str, list[str]] = {}
        for rollout in rollouts:
            for message in rollout.messages:
                if message["role"] == "tool":
                    failed = message["content"].startswith("{'error'")
                    messages.setdefault(message["name"], []).append("error" if failed else message["content"])
        rounds.append(
            {
                "step": step,
                "rollouts": len(rollouts),
                "calls": sum(r.calls for r in rollouts),
                "failures": sum(r.failures for r in rollouts),
                "turns": sum(r.turns for r in rollouts),
                "rolled_back": sum(r.rolled_back for r in rollouts),
                "tool_messages": messages,
            }
        )

    source.run_turns = recorded


def digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 of a state dict, as `distributed_job.RankRecorder` computes `param_digest`."""
    sha = hashlib.sha256()
    for name in sorted(state):
        sha.update(name.encode())
        sha.update(state[name].float().numpy().tobytes())
    return sha.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["tools", "environment"], required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=4)
    options = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    tokenizer = use_tool_chat_template(build_char_tokenizer())
    model = build_tiny_model(tokenizer, seed=0)
    task = make_agent_task(seed=0, num_sft=0, num_rl=64, num_eval=1)
    dataset = Dataset.from_dict({k: task.rl_train[k] for k in ("prompt", "answer", "task")})
    # a round per step (num_ppo_epochs=1: GRPO's num_iterations=1); no KL (GRPO's beta=0: no reference model, which
    # ZeRO-3 could not deep-copy from this in-process model); turns of 8 rows in generate calls of 4, so that a rank
    # that is done sits out more than one call of the other's turn
    config = GRPOConfig(
        output_dir=options.output_dir, max_steps=options.max_steps, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=180, max_tool_calling_iterations=3, logging_steps=2,
        num_ppo_epochs=1, kl_coef=0.0, local_rollout_forward_batch_size=4,
        learning_rate=1e-3, report_to="none", save_strategy="no", eval_strategy="no",
        activation_checkpointing=False, seed=0,
    )  # fmt: skip
    agent = {"tools": [multiply, add, divide]} if options.mode == "tools" else {"environment_factory": Calculator}
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[final_answer_reward, answer_length],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        **agent,
    )
    trainer.add_callback(RankRecorder(trainer))
    # the test's scaffolding (module docstring): forced calls, and this rank's sums of every round
    rank = trainer.accelerator.process_index
    source = trainer.rollout_source
    source.engine = ForcedCalls(source.engine, tokenizer, rank)
    rounds: list[dict] = []
    record_rounds(source, rounds)
    initial = digest(full_state_dict(trainer._unwrapped_policy()))  # collective under ZeRO-3: every rank calls it
    trainer.train()
    force_eval_calls(tokenizer, rank)
    held_out = Dataset.from_dict({k: dataset[:3][k] for k in ("prompt", "answer")})
    evaluations = {name: trainer.evaluate(held_out.select(range(n))) for name, n in (("one", 1), ("three", 3))}
    path = os.path.join(options.output_dir, "ranks", f"tools{rank}.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"initial_digest": initial, "rounds": rounds, "eval": evaluations}, handle)


if __name__ == "__main__":
    main()
