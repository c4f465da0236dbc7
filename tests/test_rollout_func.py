# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""TRL's `rollout_func=` (`trl_trapo.sources.RolloutFuncSource`): a thin adapter onto the rollout-source seam.

- It gets what TRL 1.16's `GRPOTrainer` gives it, and TRL's contract is its code's: each prompt `num_generations`
  times in a row (a copy each; text as text, messages as messages), one completion back per entry. The same script
  trains under TRL's `GRPOTrainer` and under `TRAPOTrainer`, both calling it with such lists; a function written to
  TRL's docstring (`num_generations` completions per entry) is refused naming both readings.
- A `rollout_func` in TRL's style (it generates with the trainer's model, then a tool answers: `env_mask` 0) trains
  for a few steps; its extra keys reach the reward functions as columns.
- `response_length` sizes the default source's completions only: RL prompts that leave fewer positions of the context
  are accepted with a `rollout_func` (or a `rollout_source`) whose completions fit; each round is still checked
  against the context.
- Its `logprobs` have TRL's meaning, the *sampler's* log-probs: PPO's behaviour log-probs are the trainer's own
  recompute (first ratio exactly 1 on every model token whatever the function returned), and the sampler's weight the
  policy loss by pi_trainer / pi_sampler (`vllm_importance_sampling_*`, `sampling/*` metrics): weights 1 when they
  are the trainer's, the gap when they are off (a constant, another temperature), 1 over top-p's kept support when
  they are vLLM-style renormalised ones (TRL #6789); the environment's tokens carry no weight.
- What it returns wrong is refused: a missing key with TRL's message, wrong counts and lengths naming the key, the
  row and the fix; so are `rollout_func` with `rollout_source`, with `exploration=True`, without RL prompts, and
  something not callable.
"""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset
from test_doc_commands import registered_block

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.data import tokenize_prompt
from trl_trapo.models import completion_logps, completion_logps_and_kept_support
from trl_trapo.rollout import generate
from trl_trapo.sources import RolloutFuncSource, rollout_func_round
from trl_trapo.tasks import build_tiny_model


DOCUMENTED = "docs/writing_a_rollout_source.md: # run: a rollout_func with a tool"
TOOL = "=7;"  # what the "tool" answers after the model's first turn


def agent(calls: list, logprobs: str = "own", outputs: list | None = None, env_logprob: float = 0.0):
    """A `rollout_func` in TRL's style: render each prompt entry (TRL passes each prompt `num_generations` times),
    sample one turn for each with the trainer's model (log-probs recorded while sampling), then the tool's answer (env_mask 0, log-prob `env_logprob`); `tool_calls` is
    an extra key. `logprobs` says what it returns as the sampler's log-probs: "own" (recorded while sampling at
    `temperature`: the trainer's), "constant" (-1.0 everywhere: deliberately off), "temperature" (it samples at 0.5
    and returns those, while the round is trained at `temperature`), "top_p" (renormalised over what `top_p` keeps,
    as vLLM's `processed_logprobs`). Each output is appended to `outputs`."""

    def rollout_func(prompts, trainer):
        calls.append(list(prompts))
        tokenizer, args = trainer.processing_class, trainer.args
        policy = trainer.accelerator.unwrap_model(trainer.model)
        prompt_ids = [tokenize_prompt(p, tokenizer) for p in prompts]  # one completion per entry received
        temperature = 0.5 if logprobs == "temperature" else args.temperature
        turns = generate(
            policy, prompt_ids, trainer.generation_config, trainer.padding_id, None, temperature=temperature
        )
        sampler = turns["old_per_token_logps"]
        if logprobs == "constant":
            sampler = [torch.full_like(lp, -1.0) for lp in sampler]
        elif logprobs == "top_p":
            prompts_t = [torch.tensor(p) for p in prompt_ids]
            _, sampler = completion_logps_and_kept_support(
                policy, prompts_t, turns["completion_ids"], trainer.padding_id, args.temperature, top_p=args.top_p
            )
        tool = tokenizer.encode(TOOL, add_special_tokens=False)
        out = {"prompt_ids": prompt_ids, "completion_ids": [], "logprobs": [], "env_mask": [], "tool_calls": []}
        for turn, logps in zip(turns["completion_ids"], sampler):
            turn = turn.tolist()
            out["completion_ids"].append(turn + tool)
            out["logprobs"].append(logps.tolist() + [env_logprob] * len(tool))
            out["env_mask"].append([1] * len(turn) + [0] * len(tool))
            out["tool_calls"].append(1)
        if outputs is not None:
            outputs.append(out)
        return out

    return rollout_func


def trainer_for(tmp_path, tokenizer, dataset, rollout_func, reward, **overrides):
    settings = dict(
        output_dir=str(tmp_path),
        report_to="none",
        save_strategy="no",
        activation_checkpointing=False,
        max_steps=3,
        logging_steps=1,
        per_device_train_batch_size=8,
        num_generations=4,
        max_prompt_length=24,
        response_length=3,
        temperature=0.9,
        seed=0,
    )
    settings.update(overrides)
    return TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=reward,
        args=TRAPOConfig(**settings),
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )


def trl_script(trainer_class, config_class, tokenizer, output_dir, calls: list, lengths: list):
    """A TRL 1.16 `rollout_func` script as TRL's `GRPOTrainer` runs it: the function samples one completion per prompt
    entry it receives (transformers' `generate` with the trainer's model, its log-probs from `compute_transition_scores`)
    and returns an extra key, `length`, that the reward reads. Only the two classes change between runs. Records each
    call's prompts in `calls` and each reward call's `length` column in `lengths`."""

    def rollout_func(prompts, trainer):
        calls.append(list(prompts))
        model = trainer.accelerator.unwrap_model(trainer.model)
        tok = trainer.processing_class
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "length": []}
        for prompt in prompts:
            ids = tok.encode(prompt, add_special_tokens=False)
            with torch.no_grad():
                generated = model.generate(
                    torch.tensor([ids]),
                    do_sample=True,
                    max_new_tokens=trainer.args.max_completion_length,
                    temperature=trainer.args.temperature,
                    top_k=0,
                    output_scores=True,
                    return_dict_in_generate=True,
                    pad_token_id=tok.pad_token_id,
                )
            logps = model.compute_transition_scores(generated.sequences, generated.scores, normalize_logits=True)
            out["prompt_ids"].append(ids)
            out["completion_ids"].append(generated.sequences[0, len(ids) :].tolist())
            out["logprobs"].append(logps[0].tolist())
            out["length"].append(len(out["completion_ids"][-1]))
        return out

    def reward(completions, length, **kwargs):
        lengths.append(list(length))
        return [float(n % 3) for n in length]

    return trainer_class(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=reward,
        args=config_class(
            output_dir=str(output_dir),
            max_steps=2,
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=4,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            seed=0,
        ),
        train_dataset=Dataset.from_dict({"prompt": ["2+2=", "3+4=", "1+5=", "9+9=", "5+1=", "7+2="]}),
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )


def test_a_trl_rollout_func_script_runs_unchanged_under_both_trainers(tmp_path, tokenizer, monkeypatch):
    """TRL 1.16's `GRPOTrainer` calls `rollout_func` with its RepeatSampler's per-process slice (each prompt
    num_generations times in a row) and takes one completion per entry, whatever its docstring says; the same script
    runs under `TRAPOTrainer`, which passes the same kind of list. Before, TRAPO passed each prompt once and demanded
    num_generations completions per entry: "'completion_ids' has 2 entries, expected 4"."""
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL's experimental-feature warning
    runs = {}
    for name, trainer_class, config_class in [
        ("trl", GRPOTrainer, GRPOConfig),
        ("trapo", TRAPOTrainer, TRAPOConfig),
    ]:
        calls, lengths = [], []
        trainer = trl_script(trainer_class, config_class, tokenizer, tmp_path / name, calls, lengths)
        trainer.train()
        assert trainer.state.global_step == 2, name
        runs[name] = calls, lengths
    for name, (calls, lengths) in runs.items():
        assert calls, name
        for prompts in calls:  # each prompt num_generations=2 times in a row, as text
            assert len(prompts) % 2 == 0 and prompts == [p for p in prompts[::2] for _ in range(2)], (name, prompts)
            assert len(set(prompts)) == len(prompts) // 2, (name, prompts)
        # one completion per entry was taken: the reward saw one `length` per entry of each call
        assert [len(column) for column in lengths] == [len(prompts) for prompts in calls], name


def test_a_function_returning_num_generations_per_entry_is_refused_naming_both_readings(tmp_path, tokenizer, suite):
    """The reading of TRL's docstring (prompts without duplication, num_generations completions per prompt) applied
    to what TRL's code passes: 4 x too many completions. Before, TRAPO expected exactly that and trained on it."""

    def per_prompt(prompts, trainer):
        n = len(prompts) * trainer.args.num_generations
        return {"prompt_ids": [[5, 6]] * n, "completion_ids": [[7, 8]] * n, "logprobs": None}

    reward = lambda completions, **kw: [0.0] * len(completions)  # noqa: E731
    trainer = trainer_for(tmp_path, tokenizer, suite.rl_train, per_prompt, reward)
    with pytest.raises(ValueError) as error:
        trainer.collect_rollouts(8, step=0)
    message = str(error.value)
    assert message.startswith("rollout_func's 'completion_ids' has 32 entries, expected 8: it returned ")
    assert "num_generations=4 completions for each of the 8 prompt entries" in message
    assert "its code (what TRL runs, and TRAPO follows) passes each prompt repeated num_generations times" in message
    assert "its docstring says the prompts come without duplication" in message
    assert "Return one completion per entry received" in message


def test_a_rollout_func_reads_grpos_names_of_the_settings_in_effect_under_trapo_config(tmp_path, tokenizer, suite):
    """TRL's `rollout_func` scripts read `trainer.args.max_completion_length` (the completion budget, e.g. as
    `max_new_tokens`). Under `TRAPOConfig`, set by TRAPO's name `response_length` or left at its default, it read None
    (only `trl_trapo.GRPOConfig` mirrored it): the script generated to the model's own limit. Each GRPO name reads the
    value in effect."""
    seen = []
    inner = agent([])

    def rollout_func(prompts, trainer):
        args = trainer.args
        seen.append((args.max_completion_length, args.beta, args.epsilon, args.num_iterations))
        return inner(prompts, trainer)

    reward = lambda completions, **kw: [0.0] * len(completions)  # noqa: E731
    trainer = trainer_for(tmp_path, tokenizer, suite.rl_train, rollout_func, reward, cliprange=0.1)
    trainer.collect_rollouts(8, step=0)
    assert seen == [(3, 0.05, 0.1, 4)]  # response_length, kl_coef and num_ppo_epochs (defaults), cliprange


def test_each_entry_is_a_copy_and_what_the_function_does_to_it_never_reaches_the_rewards(tmp_path, tokenizer):
    """TRL deep-copies the prompts it passes. A function that appends its answer to each entry's messages (in place)
    leaves the rows the reward functions read as the dataset holds them, and no two entries are one object. Before,
    the entries were the rows' own lists: the reward saw the function's appended message."""
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+1="}]} for i in range(6)])
    seen = []

    def appends(prompts, trainer):
        assert len({id(p) for p in prompts}) == len(prompts)  # a copy each, also within a group
        tok = trainer.processing_class
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": None}
        for prompt in prompts:
            out["prompt_ids"].append(tokenize_prompt(prompt, tok))
            prompt.append({"role": "assistant", "content": "2"})
            out["completion_ids"].append(tok.encode("2", add_special_tokens=False) + [tok.eos_token_id])
        return out

    def reward(prompts, completions, **kwargs):
        seen.extend(prompts)
        return [0.0] * len(completions)

    trainer = trainer_for(tmp_path, tokenizer, dataset, appends, reward)
    batch = trainer.collect_rollouts(8, step=0)
    assert len(seen) == len(batch.completion_ids) == 8
    assert all(len(p) == 1 and p[0]["role"] == "user" for p in seen)  # the dataset's messages, untouched


def test_response_length_sizes_the_default_sources_completions_only(tmp_path, tokenizer):
    """A prompt of 245 tokens with response_length=16 does not fit the tiny model's 256 positions: refused for the
    default source, which samples 16 tokens. A rollout_func (or a rollout_source) decides its completions' length:
    one that returns 3 tokens trains; one that returns 12 is refused when its round arrives, naming the context.
    Before, the rollout_func run was refused at construction, its completions fitting or not."""
    dataset = Dataset.from_dict({"prompt": ["1" * 245] * 4, "answer": ["2"] * 4})
    reward = lambda completions, **kw: [float(len(c) % 2) for c in completions]  # noqa: E731
    settings = dict(max_prompt_length=300, response_length=16, max_steps=1)

    def answering(length):
        def rollout_func(prompts, trainer):
            tok = trainer.processing_class
            ids = [tokenize_prompt(p, tok) for p in prompts]
            return {
                "prompt_ids": ids,
                "completion_ids": [[tok.encode("2", add_special_tokens=False)[0]] * length for _ in prompts],
                "logprobs": None,
            }

        return rollout_func

    with pytest.raises(ValueError, match=r"`train_dataset` has a prompt of 245 tokens; with response_length=16"):
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=reward,
            args=TRAPOConfig(output_dir=str(tmp_path), report_to="none", **settings),
            train_dataset=dataset,
            processing_class=tokenizer,
        )
    trainer = trainer_for(tmp_path, tokenizer, dataset, answering(3), reward, **settings)
    trainer.train()
    assert trainer.state.global_step == 1
    too_long = trainer_for(tmp_path, tokenizer, dataset, answering(12), reward, **settings)
    with pytest.raises(ValueError, match=r"completion 0 is 257 tokens, more than the policy's context of 256"):
        too_long.collect_rollouts(8, step=0)

    class Fixed:  # a rollout_source of the user's gets the same freedom
        def sample(self, rows_needed, step):
            raise AssertionError("not called at construction")

    TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=reward,
        args=TRAPOConfig(output_dir=str(tmp_path), report_to="none", **settings),
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_source=Fixed(),
    )


def test_a_trl_style_rollout_func_trains_with_env_mask_and_its_extra_keys_reach_the_rewards(
    tmp_path, tokenizer, suite
):
    calls, seen = [], []

    def reward(prompts, completions, answer, tool_calls, **kwargs):  # a column only the rollout_func has
        seen.append(tool_calls)
        return [float(len(c) % 3) for c in completions]

    trainer = trainer_for(tmp_path, tokenizer, suite.rl_train, agent(calls), reward)
    assert isinstance(trainer.rollout_source, RolloutFuncSource)
    trainer.train()
    assert trainer.state.global_step == 3
    # as TRL passes them: each prompt num_generations=4 times in a row, as the dataset holds it (text)
    assert calls and all(len(prompts) == 8 for prompts in calls)  # ceil(rows_needed * num_mini_batches / G) x G
    assert all(prompts == [p for p in prompts[::4] for _ in range(4)] for prompts in calls)
    assert all(len(set(prompts)) == 2 for prompts in calls)
    assert all(p in set(suite.rl_train["prompt"]) for prompts in calls for p in prompts)
    # the extra key reached the reward function as a column, next to the dataset's own (`answer`)
    assert seen == [[1] * 8] * len(calls)  # (and no call before training, on dataset rows without the column)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    # the first step's behaviour log-probs are the trainer's recompute: ratio 1 on every model token
    assert logs[0]["policy/approxkl_avg"] < 1e-10 and logs[0]["val/ratio"] == pytest.approx(1.0, abs=1e-6)
    rollout_logs = [h for h in trainer.state.log_history if "completions/mean_env_length" in h]
    assert rollout_logs and all(h["completions/mean_env_length"] == len(TOOL) for h in rollout_logs)
    assert all(h["completions/mean_length"] <= 3 for h in rollout_logs)  # the model's turn only
    # its log-probs are the sampler's, here the trainer's own: every round's mismatch weights are 1 (TRL's default
    # sequence_mask: the smallest and largest sequence weight), with no gap between the two
    for h in rollout_logs:
        assert h["sampling/importance_sampling_ratio/min"] == pytest.approx(1.0, abs=1e-4)
        assert h["sampling/importance_sampling_ratio/max"] == pytest.approx(1.0, abs=1e-4)
        assert h["sampling/importance_sampling_ratio/masked_frac"] == 0.0
        assert h["sampling/sampling_logp_difference/max"] < 1e-4


def test_conversational_prompts_are_passed_as_messages(tmp_path, tokenizer):
    calls = []
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"{i}+1="}], "answer": str(i + 1)} for i in range(6)]
    )
    trainer = trainer_for(
        tmp_path, tokenizer, dataset, agent(calls), lambda completions, **kw: [0.0] * len(completions), max_steps=1
    )
    trainer.train()
    assert calls and all(isinstance(p, list) and p[0]["role"] == "user" for p in calls[0])


def test_logprobs_that_are_off_leave_the_first_ratio_one_and_weight_the_loss_by_the_gap(
    tmp_path, tokenizer, suite, monkeypatch
):
    """A function whose `logprobs` are all -1.0 (nonsense 5.0 at the tool's tokens): PPO's first ratio is exactly 1
    on every model token (the trainer's recompute is the behaviour log-prob), each model token's policy loss is
    weighted by exp(log pi_trainer - (-1)) (token_mask without bounds: the raw ratio), the environment's tokens by
    nothing, and the `sampling/*` metrics report that gap. Before, -1.0 was PPO's behaviour log-prob: the first ratio
    was exp(log pi + 1), far from 1."""
    import trl_trapo.objectives as objectives

    seen = []

    def recording_rl_term(*args, **kwargs):
        seen.append((args[0].detach(), args[1], args[3], kwargs["sampling_weights"]))  # new, old, mask, weights
        return rl_term(*args, **kwargs)

    rl_term = objectives.rl_term
    monkeypatch.setattr(objectives, "rl_term", recording_rl_term)
    reward = lambda completions, **kw: [float(len(c) % 3) for c in completions]  # noqa: E731
    func = agent([], logprobs="constant", env_logprob=5.0)
    trainer = trainer_for(
        tmp_path,
        tokenizer,
        suite.rl_train,
        func,
        reward,
        max_steps=1,
        vllm_importance_sampling_mode="token_mask",
        vllm_importance_sampling_clip_max=None,
    )
    trainer.train()
    assert seen
    new = torch.cat([n[m.bool()] for n, _, m, _ in seen])
    for n, old, mask, weights in seen:
        counted = mask.bool()
        assert bool(counted.any()) and weights is not None
        torch.testing.assert_close(torch.exp(n - old)[counted], torch.ones(int(counted.sum())), atol=1e-5, rtol=0)
        torch.testing.assert_close(weights[counted], torch.exp(n + 1.0)[counted], atol=1e-4, rtol=1e-4)
        assert bool((weights[~counted] == 1.0).all())  # the environment's tokens (and the prompt) carry no weight
    gap = (new + 1.0).abs()
    assert float(gap.mean()) > 0.5  # the function's -1.0 is far from the trainer's log-probs
    logged = next(h for h in trainer.state.log_history if "sampling/importance_sampling_ratio/mean" in h)
    assert logged["sampling/sampling_logp_difference/mean"] == pytest.approx(float(gap.mean()), rel=1e-4)
    assert logged["sampling/sampling_logp_difference/max"] == pytest.approx(float(gap.max()), rel=1e-4)
    ratios = torch.exp(new + 1.0).double()
    for name in ("importance_sampling_ratio", "raw_importance_sampling_ratio"):
        assert logged[f"sampling/{name}/mean"] == pytest.approx(float(ratios.mean()), rel=1e-4)
        assert logged[f"sampling/{name}/min"] == pytest.approx(float(ratios.min()), rel=1e-4)
        assert logged[f"sampling/{name}/max"] == pytest.approx(float(ratios.max()), rel=1e-4)
    assert logged["sampling/importance_sampling_ratio/masked_frac"] == 0.0
    assert logged["val/ratio"] == pytest.approx(1.0, abs=1e-6) and logged["policy/approxkl_avg"] < 1e-10


@pytest.mark.parametrize(
    "logprobs, overrides",
    [
        ("constant", {}),
        ("temperature", {}),
        ("top_p", {"top_p": 0.7}),
        ("constant", {"vllm_importance_sampling_correction": False}),
    ],
)
def test_a_round_gets_the_trainers_behaviour_logprobs_and_the_samplers_mismatch(
    tmp_path, tokenizer, suite, logprobs, overrides
):
    """Whatever the function's `logprobs`, the round's behaviour log-probs are the trainer's forward at the round's
    temperature (so PPO's first ratio is 1), and the mismatch log-ratio is log pi_trainer - log pi_sampler at the
    model's tokens, 0 at the tool's: -1.0 everywhere and log-probs of a 0.5-temperature sampler give a gap; vLLM-style
    log-probs renormalised over top_p's kept support give none, because the trainer's side is taken over the same
    support (TRL #6789), although they are far above the full-vocabulary ones (which, as behaviour log-probs, made
    the first ratio the kept mass S < 1). With the correction off they are ignored (TRL without vLLM)."""
    outputs = []
    reward = lambda completions, **kw: [0.0] * len(completions)  # noqa: E731
    trainer = trainer_for(
        tmp_path, tokenizer, suite.rl_train, agent([], logprobs, outputs, env_logprob=5.0), reward, **overrides
    )
    batch = trainer.collect_rollouts(8, step=0)
    (out,) = outputs
    assert [c.tolist() for c in batch.completion_ids] == out["completion_ids"]
    expected = completion_logps(
        trainer.model, batch.prompt_ids, batch.completion_ids, trainer.padding_id, batch.temperatures
    )
    for old, want, mask in zip(batch.old_per_token_logps, expected, batch.completion_mask):
        torch.testing.assert_close(old, torch.where(mask.bool(), want, 0.0))  # the trainer's own: first ratio 1
    if overrides.get("vllm_importance_sampling_correction") is False:
        assert batch.sampler_correction is None and all(t.sampler_log_ratio is None for t in batch.trajectories)
        return
    gaps = []
    for t, old, sampler, mask in zip(batch.trajectories, batch.old_per_token_logps, out["logprobs"], out["env_mask"]):
        model = torch.tensor(mask).bool()
        assert bool((t.sampler_log_ratio[~model] == 0).all())  # the tool's tokens: no mismatch weight
        sampler = torch.tensor(sampler)
        if logprobs == "top_p":
            assert bool((sampler[model] > old[model] + 1e-3).any())  # renormalised: above the full-vocabulary ones
            torch.testing.assert_close(t.sampler_log_ratio[model], torch.zeros(int(model.sum())), atol=1e-5, rtol=0)
        else:
            torch.testing.assert_close(t.sampler_log_ratio[model], old[model] - sampler[model], atol=1e-5, rtol=0)
        gaps.append(t.sampler_log_ratio[model].abs())
    stats = batch.sampler_correction.summary()
    assert stats["logp_difference/mean"] == pytest.approx(float(torch.cat(gaps).mean()), abs=1e-6)
    if logprobs == "top_p":
        assert stats["ratio/min"] == pytest.approx(1.0, abs=1e-4) and stats["ratio/max"] == pytest.approx(
            1.0, abs=1e-4
        )
    else:
        assert stats["logp_difference/mean"] > 0.05 and not math.isclose(stats["raw_ratio/mean"], 1.0, abs_tol=1e-2)


def rows(n=2, group=2):
    """The rows of the entries a rollout_func gets: `n` prompts, each `group` times in a row."""
    return [{"prompt": f"p{i}", "answer": str(i)} for i in range(n) for _ in range(group)]


def valid_output(group=2, n=2):
    return {
        "prompt_ids": [[5, 6]] * (n * group),
        "completion_ids": [[7, 8, 9]] * (n * group),
        "logprobs": [[-0.1, 0.0, -0.2]] * (n * group),
        "env_mask": [[1, 0, 1]] * (n * group),
        "judge": [f"j{i}" for i in range(n * group)],
        "episode": 3,
    }


def test_the_round_it_makes():
    sampled = rollout_func_round(valid_output(), rows(), 2, step=5)
    assert sampled.version == 5 and sampled.group == 2 and sampled.temperatures is None
    assert [e["prompt"] for e in sampled.examples] == ["p0", "p0", "p1", "p1"]  # each entry's row
    assert [e["judge"] for e in sampled.examples] == ["j0", "j1", "j2", "j3"]  # a list: each completion its entry
    assert all(e["episode"] == 3 for e in sampled.examples)  # anything else: every completion
    assert sampled.completion_mask[0].tolist() == [1.0, 0.0, 1.0]
    # TRL's meaning: the sampler's log-probs (0 at the environment's tokens), not PPO's behaviour log-probs, which the
    # trainer computes when it finishes the round
    assert sampled.old_per_token_logps is None
    assert sampled.sampler_per_token_logps[0].tolist() == pytest.approx([-0.1, 0.0, -0.2])
    none = rollout_func_round({**valid_output(), "logprobs": None, "env_mask": None}, rows(), 2, step=0)
    assert none.old_per_token_logps is None and none.sampler_per_token_logps is None and none.completion_mask is None
    # anything at the environment's tokens (TRL: vLLM's None, a placeholder) is accepted and ignored
    anything = {**valid_output(), "logprobs": [[-0.1, None, -0.2], [-0.1, 7.0, -0.2]] * 2}
    assert rollout_func_round(anything, rows(), 2, step=0).sampler_per_token_logps[1].tolist() == pytest.approx(
        [-0.1, 0.0, -0.2]
    )


@pytest.mark.parametrize("missing", [["logprobs"], ["completion_ids", "prompt_ids"]])
def test_a_missing_key_raises_trls_message(missing):
    output = {k: v for k, v in valid_output().items() if k not in missing}
    expected = f"rollout_func must return keys {sorted(missing)} in its output dict."
    with pytest.raises(ValueError) as error:
        rollout_func_round(output, rows(), 2, step=0)
    assert str(error.value) == expected


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"completion_ids": [[7, 8, 9]] * 2},
            r"'completion_ids' has 2 entries, expected 4: return one completion per prompt entry it was given, in "
            r"their order \(the 4 entries are 2 prompts, each repeated num_generations=2 times in a row",
        ),
        ({"prompt_ids": [[5]] * 8}, r"'prompt_ids' has 8 entries, expected 4: it returned num_generations=2 "),
        ({"logprobs": [[-0.1, -0.2, -0.3]] * 3 + [[-0.1]]}, r"'logprobs'\[3\] has 1 values for the 3 tokens of "),
        (
            {"env_mask": [[1, 0, 1]] * 2 + [[1, 0, 1, 1]] * 2},
            r"'env_mask'\[2\] has 4 values.*one value per completion",
        ),
        ({"judge": ["a"]}, r"'judge' has 1 entries, expected 4"),
        # the count is right, the type is not (it used to say "'completion_ids' has Tensor, expected 4")
        (
            {"completion_ids": torch.tensor([[7, 8, 9]] * 4)},
            r"'completion_ids' is a Tensor of shape \(4, 3\); it must be a list with one entry per completion \(4\)"
            r".*Convert it with `\.tolist\(\)`",
        ),
        ({"logprobs": 0.5}, r"'logprobs' is a float; it must be a list with one entry per completion \(4\)"),
        ({"env_mask": [[1, 2, 1]] * 4}, r"completion_mask\[0\].*TRL's `env_mask`"),
        ({"completion_ids": ["abc"] * 4}, r"'completion_ids'\[0\] is 'abc', not a list of token ids: tokenize"),
        ({"env_mask": [[1, 0, 1]] * 3 + [[0, 0, 0]]}, r"'env_mask'\[3\] has no 1 .*trains nothing"),
        # log-probs are checked at the policy's tokens, as before: finite and <= 0 (vLLM's None is not a log-prob)
        ({"logprobs": [[-0.1, 0.0, -0.2]] + [[0.5, 0.0, -0.2]] * 3}, r"'logprobs'\[1\] must be finite .*<= 0"),
        ({"logprobs": [[-0.1, 0.0, None]] * 4}, r"'logprobs'\[0\] must be finite log-probabilities"),
        ({"logprobs": [[-0.1, 0.0, float("-inf")]] * 4}, r"'logprobs'\[0\] must be finite log-probabilities"),
        # trial 9's PX92: an extra key named like a reward keyword ("got multiple values for keyword argument")
        ({"completions": ["4"] * 4}, r"rollout_func's output key 'completions' is named like an argument TRAPO"),
        ({"trainer_state": "x"}, r"output key 'trainer_state' is named like .*e.g. 'my_trainer_state'"),
    ],
)
def test_wrong_shapes_are_refused_naming_the_key_and_row(change, message):
    with pytest.raises(ValueError, match=message):
        rollout_func_round({**valid_output(), **change}, rows(), 2, step=0)
    with pytest.raises(ValueError, match="it must return a dict"):
        rollout_func_round([1, 2], rows(), 2, step=0)


def test_a_wrong_output_is_refused_when_the_trainer_asks_for_a_round(tmp_path, tokenizer, suite):
    def too_few(prompts, trainer):
        return {"prompt_ids": [[5]], "completion_ids": [[7]], "logprobs": None}

    trainer = trainer_for(
        tmp_path, tokenizer, suite.rl_train, too_few, lambda completions, **kw: [0.0] * len(completions)
    )
    with pytest.raises(ValueError, match=r"'completion_ids' has 1 entries, expected 8"):
        trainer.collect_rollouts(8, step=0)


def test_settings_it_cannot_work_with_are_refused(tmp_path, tokenizer, suite):
    reward = lambda completions, **kw: [0.0] * len(completions)  # noqa: E731
    func = agent([])

    class Source:
        def sample(self, rows_needed, step):
            raise AssertionError("never called")

    with pytest.raises(ValueError, match="Both rollout_source and rollout_func were given"):
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=reward,
            args=TRAPOConfig(output_dir=str(tmp_path), report_to="none"),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
            rollout_source=Source(),
            rollout_func=func,
        )
    with pytest.raises(ValueError, match=r"exploration=True.*rollout_func was given.*set exploration=None or False"):
        trainer_for(tmp_path, tokenizer, suite.rl_train, func, reward, exploration=True)
    with pytest.raises(TypeError, match="rollout_func=3 is not callable"):
        trainer_for(tmp_path, tokenizer, suite.rl_train, 3, reward)
    with pytest.raises(ValueError, match="rollout_func was given but there are no RL prompts: pass train_dataset"):
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            args=TRAPOConfig(output_dir=str(tmp_path), report_to="none", max_steps=1),
            sft_dataset=suite.sft,
            processing_class=tokenizer,
            rollout_func=func,
        )
    # exploration=None (auto) is simply off: the function chooses how it samples
    assert trainer_for(tmp_path, tokenizer, suite.rl_train, func, reward).exploration is None


def test_the_documented_rollout_func_trains(tmp_path, monkeypatch):
    """The document's block, as written: two steps; the extra key reached the reward (some completions agree with the
    tool, some do not); the tool's three tokens are the environment's in every round."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    block = registered_block(DOCUMENTED)
    exec(compile(block.text, block.where(), "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 2
    rounds = [h for h in trainer.state.log_history if "completions/mean_env_length" in h]
    assert rounds and all(h["completions/mean_env_length"] == 3.0 for h in rounds)
    assert all(0.0 < h["rewards/agrees_with_the_tool/mean"] < 1.0 for h in rounds)


def test_a_rollout_func_without_the_trainer_argument_is_refused_at_construction(tmp_path, tokenizer, suite):
    """The sibling of a source's `sample(self, rows_needed)` (issue 37, U15): TRL calls `rollout_func(prompts,
    trainer)`; a function taking only `prompts` failed at the first round with Python's positional-argument error."""

    def prompts_only(prompts):
        raise AssertionError("never called")

    with pytest.raises(TypeError, match=r"rollout_func=prompts_only\(prompts\) cannot be called as `rollout_func"):
        trainer_for(
            tmp_path, tokenizer, suite.rl_train, prompts_only, lambda completions, **kw: [0.0] * len(completions)
        )
