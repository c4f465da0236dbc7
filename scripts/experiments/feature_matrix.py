# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The pairwise feature matrix (issue 40): every feature with every other, from real 2-step runs on tiny models.

    python scripts/experiments/feature_matrix.py                         # every single-process cell
    python scripts/experiments/feature_matrix.py --two_process           # and the DDP / ZeRO-3 cells
    python scripts/experiments/feature_matrix.py --only tools,async      # tools, async and tools x async
    python scripts/experiments/feature_matrix.py --cells tools+async     # that one cell
    python scripts/experiments/feature_matrix.py --involving fewshot     # every cell with few-shot mode
    python scripts/experiments/feature_matrix.py --render docs/feature_matrix.md   # the page, from --output_json

A *cell* is one feature alone (the diagonal) or two together. Each cell builds a `TRAPOTrainer` on the tiny models
(`trl_trapo.tasks.build_tiny_model`, the tiny LLaVA of `trl_trapo.tasks.vision`, the agent task of
`trl_trapo.tasks.agent`; a teacher, critic or reward model is another tiny model) with pretraining, SFT and RL data,
switches its features on (`FEATURES`) and trains 2 steps, in a process of its own (`python feature_matrix.py --_worker
spec.json`; the two-process cells under `accelerate launch --num_processes 2`), with `OMP_NUM_THREADS=1` and a time
limit. Its outcome:

- **works**: it trained 2 steps and every feature of the cell showed that it was active (`Feature.check`: a metric
  only that feature logs, such as `tools/turns_mean`, `loss/distill`, `sample/staleness_max`; the stand-in vLLM's
  generate calls; image tokens in the policy's training forwards; LoRA parameters being the trainable ones);
- **refused**: the construction raised a `ValueError` or `NotImplementedError` from `trl_trapo`'s own code (a refusal
  it means to make: the error's first line is the reason), before anything trained. A refusal is *by design* when
  issue 40 lets it stay (`BY_DESIGN`), *to fix* otherwise;
- **inactive**: it trained, but a feature did not act as it should (ignored, or applied wrongly: a silent defect);
- **crash**: any other exception (its type, first line and innermost `trl_trapo` frame), or a worker that died
  without a result;
- **hang**: the cell ran past `--timeout` seconds (its process group is killed).

Pairs on one axis have no cell (`SAME_AXIS`: vLLM server with vLLM colocate, DDP with ZeRO-3).

vLLM is not installed on a CPU machine: the vLLM cells run on the suite's CPU stand-ins, so they check TRAPO's wiring,
not vLLM. Without `async_rollouts`, TRL's `VLLMGeneration` is replaced by `FakeVLLMGeneration`
(tests/test_vllm_option.py: it samples with the policy through transformers, in server and colocate mode alike);
with `async_rollouts` and server mode, by `FakeVLLMServer` (tests/test_async_vllm_server.py: `trl vllm-serve`'s HTTP
endpoints over the tiny model, with TRL's real client; `install_stubs` stubs vLLM's absence and NCCL). The page marks
those cells. `scripts/benchmarks/gpu_check.py` runs the real vLLM on a GPU machine.

Every cell goes into `--output_json` (default `docs/results/feature_matrix/results.json`), merged by cell into what
the file holds, so a run of some cells updates them and keeps the others; `--render PAGE` writes the matrix (rows x
columns, a legend, each refusal and crash listed under it, the machine, commit and date) between the page's
`<!-- feature-matrix:start/end -->` markers (`result_blocks.write_block`); with no cell to run (`--cells ''` or
`--render` alone) it renders from the file. tests/test_feature_matrix.py runs it.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))  # result_blocks, runlib

from result_blocks import write_block  # noqa: E402
from runlib import (  # noqa: E402
    child_env,
    git,
    go_offline,
    machine_info,
    map_jobs,
    positive_float,
    positive_int,
    read_json,
    run_child,
    write_json_atomic,
)


logger = logging.getLogger("feature_matrix")

BLOCK = "feature-matrix"
RESULTS = ROOT / "docs" / "results" / "feature_matrix" / "results.json"
STEPS = 2  # optimizer steps per cell
TIMEOUT_S = 300  # per single-process cell (5-40 s each on 2 cores: 9-25 min for the 90)
TWO_PROCESS_TIMEOUT_S = 600
ACCELERATE_CONFIGS = ROOT / "examples" / "accelerate_configs"

# outcomes, in the order the page's legend lists them
WORKS, BY_DESIGN_REFUSED, TO_FIX_REFUSED, INACTIVE, CRASH, HANG = (
    "works",
    "refused (by design)",
    "refused (to fix: issue 40)",
    "inactive",
    "crash",
    "hang",
)
OUTCOMES = (WORKS, BY_DESIGN_REFUSED, TO_FIX_REFUSED, INACTIVE, CRASH, HANG)
SYMBOLS = {WORKS: "✓", BY_DESIGN_REFUSED: "—", TO_FIX_REFUSED: "R", INACTIVE: "I", CRASH: "C", HANG: "H"}


# =====================================================================================================================
# The features
# =====================================================================================================================
@dataclass
class Recipe:
    """What one cell builds, as the features set it (`Feature.apply`), then `run_cell` builds it.

    Attributes:
        vision: a VLM run (the tiny LLaVA and the visual task suite) instead of the character-level model.
        processing_class: the tokenizer (or the VLM's processor).
        model: the policy (built by the base recipe, or `images`).
        trainer_class: `TRAPOTrainer` or a subclass (few-shot mode's).
        config: `TRAPOConfig` keywords.
        kwargs: `TRAPOTrainer` keywords besides `model`, `args` and `processing_class`.
        saved: the policy must be loadable from a directory (vLLM's rule): it is saved and reloaded.
        by_path: the policy is passed as the path of its saved directory (`model="<run_dir>/model"`), as under ZeRO-3,
            where the reference is loaded from it (a partitioned policy cannot be deep-copied).
        vllm: `None`, `"generation"` (`FakeVLLMGeneration`) or `"server"` (`FakeVLLMServer`): the stand-in to install.
        agent_prompts: the RL prompts are the agent task's (set once by tools or environment_factory).
        record_sampling: record the temperature of every `RolloutEngine.sample` call (`probes["sample_calls"]`).
        run_dir: the cell's folder.
    """

    vision: bool
    processing_class: Any
    model: Any
    trainer_class: type
    config: dict
    kwargs: dict
    run_dir: Path
    saved: bool = False
    by_path: bool = False
    vllm: str | None = None
    agent_prompts: bool = False
    record_sampling: bool = False

    def at_least(self, **values: int) -> None:
        """Raise the config's `values` (lengths) to at least these."""
        for key, value in values.items():
            self.config[key] = max(self.config.get(key, 0), value)

    @property
    def tokenizer(self):
        """The text tokenizer (the processor's for a VLM)."""
        return getattr(self.processing_class, "tokenizer", self.processing_class)


@dataclass
class Evidence:
    """What a trained cell shows: the trainer, its logs (every entry of `log_history`) and the probes' counts."""

    trainer: Any
    logs: list[dict]
    probes: dict = field(default_factory=dict)

    def logged(self, key: str) -> list[float]:
        """Every value of `key` in the logs."""
        return [entry[key] for entry in self.logs if key in entry]


@dataclass(frozen=True)
class Feature:
    """One feature of the matrix.

    Attributes:
        name: its key (`--only`, `--cells`, the JSON).
        label: its name on the page.
        apply: switches it on in a `Recipe`.
        check: `check(evidence)` -> what shows it was active (a short text), or raises `AssertionError` saying what is
            missing.
        processes: 2 for the two-process features (their cells run under `accelerate launch`).
        accelerate_config: the shipped accelerate config of a two-process feature (`examples/accelerate_configs/`).
    """

    name: str
    label: str
    apply: Callable[[Recipe], None]
    check: Callable[[Evidence], str]
    processes: int = 1
    accelerate_config: str | None = None


def logged_once(evidence: Evidence, key: str) -> str:
    """`key=<value>` of the last log that has it; `AssertionError` when no log has it."""
    values = evidence.logged(key)
    assert values, f"no log has {key}"
    value = values[-1]
    return f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"


# ---- rollout drivers ------------------------------------------------------------------------------------------------
def use_agent_prompts(recipe: Recipe) -> None:
    """Tools and environments run on conversational prompts with a tool-calling chat template: the agent task's
    (`make_agent_task`) for a text run; a VLM run keeps its image prompts (conversational already). The tokenizer
    gets `use_tool_chat_template`; a VLM's processor gets it too (it renders the image prompts and the tool messages,
    as in TRL)."""
    from trl_trapo.agents import use_tool_chat_template
    from trl_trapo.tasks.agent import make_agent_task

    use_tool_chat_template(recipe.processing_class if recipe.vision else recipe.tokenizer)
    if not recipe.vision and not recipe.agent_prompts:
        task = make_agent_task(seed=0, num_sft=8, num_rl=8, num_eval=2)
        recipe.kwargs.update(train_dataset=task.rl_train, reward_funcs=[*task.reward_funcs])
        recipe.agent_prompts = True
        recipe.at_least(max_prompt_length=48, response_length=8)


def apply_tools(recipe: Recipe) -> None:
    from trl_trapo.tasks.agent import multiply

    use_agent_prompts(recipe)
    recipe.kwargs["tools"] = [multiply]


def check_tools(evidence: Evidence) -> str:
    return logged_once(evidence, "tools/turns_mean")


class Counter:
    """The environment of the `environment_factory` cells: one per rollout, a tool (`bump`) and a reward of 1 per
    rollout (`rewards/Counter/mean` = 1 shows every rollout went through an environment)."""

    def reset(self, **row) -> None:
        self.count = 0

    def bump(self, by: int) -> int:
        """Add to the counter.

        Args:
            by: How much to add.
        """
        self.count += by
        return self.count

    def get_reward(self) -> float:
        return 1.0


def apply_environment(recipe: Recipe) -> None:
    use_agent_prompts(recipe)
    recipe.kwargs["environment_factory"] = Counter


def check_environment(evidence: Evidence) -> str:
    rewards = evidence.logged("rewards/Counter/mean")
    assert rewards and all(r == 1.0 for r in rewards), f"rewards/Counter/mean = {rewards} (1 per rollout expected)"
    return f"rewards/Counter/mean=1, {logged_once(evidence, 'tools/turns_mean')}"


def sample_with_the_policy(prompts: list, trainer) -> dict:
    """The `rollout_func` of the matrix, as a TRL user writes one: one completion per prompt entry, sampled with the
    trainer's model (`trl.models.unwrap_model_for_generation`, transformers' `generate`), its log-probs recorded while
    sampling, or with `use_vllm=True` through the trainer's vLLM (`trainer.vllm_generation`, as in TRL; the trainer
    pushed the weights before the call), and an extra key `from_rollout_func` (1 per row) that `rollout_func_marker`
    reads. A VLM's processor renders each prompt (TRL passes the images inside the messages) and its pixel values go
    to `generate`."""
    from trl.models import unwrap_model_for_generation

    from trl_trapo.data import tokenize_prompt
    from trl_trapo.rollout import generate
    from trl_trapo.vision import is_processor

    processing_class = trainer.processing_class
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    model_inputs = None
    if is_processor(processing_class):
        rendered = [
            processing_class.apply_chat_template(
                prompt, tokenize=True, return_dict=True, add_generation_prompt=True, return_tensors="pt"
            )
            for prompt in prompts
        ]
        prompt_ids = [r["input_ids"][0].tolist() for r in rendered]
        model_inputs = [{k: v for k, v in r.items() if k not in ("input_ids", "attention_mask")} for r in rendered]
    else:
        prompt_ids = [tokenize_prompt(prompt, tokenizer) for prompt in prompts]
    if trainer.vllm_generation is not None:
        _, completion_ids, logprobs, _ = trainer.vllm_generation.generate(
            prompts=prompt_ids, images=None, num_generations=1
        )
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": [list(c) for c in completion_ids],
            "logprobs": [[lp[0] for lp in row] for row in logprobs],
            "from_rollout_func": [1.0] * len(prompt_ids),
        }
    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
        policy = getattr(model, "policy", model)  # the policy of a policy-and-critic wrapper
        turns = generate(
            policy,
            prompt_ids,
            trainer.generation_config,
            trainer.padding_id,
            None,
            temperature=trainer.args.temperature,
            model_inputs=model_inputs,
        )
    return {
        "prompt_ids": prompt_ids,
        "completion_ids": [c.tolist() for c in turns["completion_ids"]],
        "logprobs": [lp.tolist() for lp in turns["old_per_token_logps"]],
        "from_rollout_func": [1.0] * len(prompt_ids),
    }


def rollout_func_marker(completions: list, from_rollout_func: list | None = None, **kwargs) -> list[float]:
    """1 for a row `sample_with_the_policy` returned (its extra key reached the rewards), 0 otherwise."""
    return [float(x) for x in from_rollout_func] if from_rollout_func is not None else [0.0] * len(completions)


def apply_rollout_func(recipe: Recipe) -> None:
    recipe.kwargs["rollout_func"] = sample_with_the_policy
    recipe.kwargs["reward_funcs"] = [*recipe.kwargs["reward_funcs"], rollout_func_marker]


def check_rollout_func(evidence: Evidence) -> str:
    marks = evidence.logged("rewards/rollout_func_marker/mean")
    assert marks and all(m == 1.0 for m in marks), f"rewards/rollout_func_marker/mean = {marks} (1 expected)"
    return "rewards/rollout_func_marker/mean=1"


# ---- where and how rollouts are sampled ------------------------------------------------------------------------------
def apply_async(recipe: Recipe) -> None:
    recipe.config.update(async_rollouts=True, max_staleness=2)
    if recipe.config.get("use_vllm") and recipe.config.get("vllm_mode") == "server":
        recipe.vllm = "server"


def check_async(evidence: Evidence) -> str:
    from trl_trapo.async_rollouts import AsyncRolloutSource

    assert isinstance(evidence.trainer.rollout_source, AsyncRolloutSource), "the rollout source is not the producer's"
    return logged_once(evidence, "sample/staleness_max")


def vllm_applier(mode: str) -> Callable[[Recipe], None]:
    def apply(recipe: Recipe) -> None:
        recipe.config.update(use_vllm=True, vllm_mode=mode)
        recipe.saved = True
        recipe.vllm = "server" if mode == "server" and recipe.config.get("async_rollouts") else "generation"

    return apply


def check_vllm(evidence: Evidence) -> str:
    calls = evidence.probes.get("vllm_generate_calls", 0)
    assert calls > 0, "the vLLM stand-in was never asked to generate"
    return f"{calls} generate calls to the stand-in, {logged_once(evidence, 'sampling/sampling_logp_difference/mean')}"


def apply_exploration(recipe: Recipe) -> None:
    recipe.config["exploration"] = True


def check_exploration(evidence: Evidence) -> str:
    return logged_once(evidence, "exploration/temperature")


def apply_fewshot(recipe: Recipe) -> None:
    """Few-shot mode, with a round at every step (each trajectory used once, RL-heavy phases), so that a round after
    step 0 shows whether it was sampled at the annealed temperature T(step) (equal to `temperature` at step 0)."""
    from trl_trapo.experimental.fewshot import FewShotTRAPOTrainer

    recipe.trainer_class = FewShotTRAPOTrainer
    recipe.config.update(
        fewshot_mode=True, fewshot_max_uses=1, num_ppo_epochs=1, curriculum_mixtures=[0.2, 0.2, 0.6] * 3
    )
    recipe.record_sampling = True


def check_fewshot(evidence: Evidence) -> str:
    """Every round was sampled at the few-shot temperature of its step (`FewShotController.temperature_at`), one of
    them after step 0 (where it differs from `temperature`); with targeted exploration each row at that temperature
    times its family's boost factor (`temperature_of(f) / temperature`, one of the rule's levels). With a
    `rollout_func`, which samples at its own temperature (its rows train at `temperature`), the rounds' prompts were
    few-shot mode's choice: their scores reached its prototypes."""
    from trl_trapo.sources import RolloutFuncSource

    trainer = evidence.trainer
    selector = trainer.memory_pool.selector
    if isinstance(trainer.rollout_source, RolloutFuncSource):
        scored = [label for label, r in zip(selector.prototypes.labels, selector.prototypes.reward.tolist()) if r == r]
        assert scored, "no prototype got a score: the rollout_func's rounds did not go through few-shot mode"
        return f"the rollout_func's prompts chosen by few-shot mode ({len(scored)} prototypes scored)"
    explore = trainer.exploration
    factors = [1.0]
    if explore is not None:  # the rule's levels: temperature + min(k * step, max_boost), over temperature
        levels = range(explore.max_level + 1)
        factors = [
            (explore.temperature + min(k * explore.step, explore.max_boost)) / explore.temperature for k in levels
        ]
    calls = evidence.probes.get("sample_calls", [])
    assert any(step > 0 for step, _ in calls), f"no round after step 0 (rounds at steps {[s for s, _ in calls]})"
    for step, temperatures in calls:
        expected = selector.temperature_at(step)
        wrong = [t for t in temperatures if not any(abs(t - expected * f) < 1e-5 for f in factors)]
        assert not wrong, (
            f"the round of step {step} was sampled at temperature {wrong[0]:.3g}, not the few-shot temperature "
            f"{expected:.3g}"
            + (" times an exploration factor" if explore is not None else "")
            + ": few-shot mode's annealing did not reach this round"
        )
    step = max(s for s, _ in calls)
    boosted = sum(t > selector.temperature_at(s) + 1e-5 for s, temperatures in calls for t in temperatures)
    return f"rounds sampled at the few-shot temperature (step {step}: {selector.temperature_at(step):.3g})" + (
        f", {boosted} rows boosted by exploration" if explore is not None else ""
    )


# ---- models ---------------------------------------------------------------------------------------------------------
def apply_images(recipe: Recipe) -> None:
    """The tiny LLaVA and the visual task suite (RL prompts, SFT rows and pretraining documents with images)."""
    from trl_trapo.tasks.vision import build_tiny_vlm, build_vlm_processor, make_visual_task_suite

    processor = build_vlm_processor()
    suite = make_visual_task_suite(
        seed=0, num_pretrain_docs=16, num_sft_per_task=4, num_rl_per_task=4, num_eval_per_task=2, num_eval_captions=2
    )
    recipe.vision = True
    recipe.processing_class = processor
    recipe.model = build_tiny_vlm(processor, seed=0)
    recipe.kwargs.update(
        train_dataset=suite.rl_train,
        sft_dataset=suite.sft,
        pretrain_dataset=suite.pretrain,
        reward_funcs=[*suite.reward_funcs],
    )
    recipe.config.update(num_generations=2)  # the lengths of the VLM job (`trl_trapo/jobs/vision.py`)
    recipe.at_least(max_prompt_length=80, sft_max_length=96, pretrain_max_length=96)


def check_images(evidence: Evidence) -> str:
    images = evidence.probes.get("training_forwards_with_images", 0)
    assert images > 0, "no training forward of the policy received images"
    return f"{images} training forwards of the policy with images"


def sequence_classifier(recipe: Recipe, seed: int):
    """A tiny `AutoModelForSequenceClassification` (one label) on the policy's text config: a critic or reward model
    that embeds the policy's vocabulary."""
    import torch
    from transformers import AutoModelForSequenceClassification

    config = recipe.model.config.get_text_config().to_dict()
    config.update(num_labels=1, pad_token_id=recipe.tokenizer.pad_token_id)
    from transformers import AutoConfig

    text_config = AutoConfig.for_model(**config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForSequenceClassification.from_config(text_config, dtype=torch.float32)


def apply_critic(recipe: Recipe) -> None:
    recipe.kwargs["value_model"] = sequence_classifier(recipe, seed=1)


def check_critic(evidence: Evidence) -> str:
    assert getattr(evidence.trainer.model, "value_model", None) is not None, "the trained model has no value model"
    return logged_once(evidence, "loss/value_avg")


def apply_reward_model(recipe: Recipe) -> None:
    recipe.kwargs["reward_model"] = sequence_classifier(recipe, seed=2)


def check_reward_model(evidence: Evidence) -> str:
    from torch import nn

    rewards = evidence.trainer.rewards
    names = [name for func, name in zip(rewards.funcs, rewards.names) if isinstance(func, nn.Module)]
    assert names, "no reward model among the trainer's rewards"
    return logged_once(evidence, f"rewards/{names[0]}/mean")


def apply_teacher(recipe: Recipe) -> None:
    from trl_trapo.tasks import build_tiny_model
    from trl_trapo.tasks.vision import build_tiny_vlm

    recipe.kwargs["teacher_model"] = (
        build_tiny_vlm(recipe.processing_class, seed=1)
        if recipe.vision
        else build_tiny_model(recipe.tokenizer, seed=1)
    )


def check_teacher(evidence: Evidence) -> str:
    return logged_once(evidence, "loss/distill")


def apply_lora(recipe: Recipe) -> None:
    from peft import LoraConfig

    recipe.kwargs["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def check_lora(evidence: Evidence) -> str:
    trainable = [n for n, p in evidence.trainer.model.named_parameters() if p.requires_grad]
    lora = [n for n in trainable if "lora_" in n]
    # with a critic, the value model trains whole beside the policy's adapters
    others = [n for n in trainable if "lora_" not in n and "value_model" not in n]
    assert lora and not others, f"trainable: {len(lora)} LoRA tensors and {others[:3]} ..."
    return f"{len(lora)} trainable LoRA tensors, the policy's weights frozen"


# ---- processes ------------------------------------------------------------------------------------------------------
def apply_ddp(recipe: Recipe) -> None:
    """DDP changes the launch (`Feature.accelerate_config`), not the recipe."""


def apply_zero3(recipe: Recipe) -> None:
    """ZeRO-3 changes the launch (`Feature.accelerate_config`), and the policy is given by its path: TRAPO loads the
    reference from it (it refuses to deep-copy a partitioned policy; a ZeRO-3 script passes a model id)."""
    recipe.by_path = True


def check_ddp(evidence: Evidence) -> str:
    accelerator = evidence.trainer.accelerator
    assert accelerator.num_processes == 2, f"{accelerator.num_processes} processes"
    assert accelerator.distributed_type.name == "MULTI_CPU", accelerator.distributed_type
    return "2 processes, MULTI_CPU (gloo)"


def check_zero3(evidence: Evidence) -> str:
    accelerator = evidence.trainer.accelerator
    assert accelerator.num_processes == 2, f"{accelerator.num_processes} processes"
    assert accelerator.distributed_type.name == "DEEPSPEED", accelerator.distributed_type
    stage = accelerator.state.deepspeed_plugin.zero_stage
    assert stage == 3, f"ZeRO stage {stage}"
    return "2 processes, DeepSpeed ZeRO-3"


# the order of the page's rows and columns; a cell applies its features in this order (images first: it replaces the
# model and the data the others build on)
FEATURES = {
    f.name: f
    for f in (
        Feature("images", "images (VLM)", apply_images, check_images),
        Feature("teacher", "teacher", apply_teacher, check_teacher),
        Feature("tools", "tools", apply_tools, check_tools),
        Feature("environment_factory", "environment_factory", apply_environment, check_environment),
        Feature("rollout_func", "rollout_func", apply_rollout_func, check_rollout_func),
        Feature("vllm_server", "vLLM server", vllm_applier("server"), check_vllm),
        Feature("vllm_colocate", "vLLM colocate", vllm_applier("colocate"), check_vllm),
        Feature("async", "async", apply_async, check_async),
        Feature("exploration", "exploration", apply_exploration, check_exploration),
        Feature("critic", "critic", apply_critic, check_critic),
        Feature("reward_model", "reward model", apply_reward_model, check_reward_model),
        Feature("fewshot", "few-shot", apply_fewshot, check_fewshot),
        Feature("lora", "LoRA", apply_lora, check_lora),
        Feature("ddp", "DDP", apply_ddp, check_ddp, processes=2, accelerate_config="multi_gpu.yaml"),
        Feature("zero3", "ZeRO-3", apply_zero3, check_zero3, processes=2, accelerate_config="deepspeed_zero3.yaml"),
    )
}
# pairs of one axis: no cell (one run cannot have both)
SAME_AXIS = {frozenset({"vllm_server", "vllm_colocate"}), frozenset({"ddp", "zero3"})}
# the refusals issue 40 lets stay, with its reason
BY_DESIGN = {
    frozenset({"rollout_func", "exploration"}): "the function owns sampling",
    frozenset({"tools", "rollout_func"}): "one axis: a rollout_func runs its own tool loop",
    frozenset({"environment_factory", "rollout_func"}): "one axis: a rollout_func runs its own tool loop",
    frozenset({"critic", "images"}): "no value head in transformers reads images",
    frozenset({"reward_model", "images"}): "no reward head in transformers reads images",
    frozenset({"fewshot", "async"}): "few-shot mode is experimental (no anchor has it)",
    frozenset({"fewshot", "vllm_server"}): "few-shot mode is experimental (no anchor has it)",
    frozenset({"fewshot", "vllm_colocate"}): "few-shot mode is experimental (no anchor has it)",
    frozenset({"fewshot", "images"}): "few-shot mode is experimental (no anchor has it)",
    frozenset({"vllm_colocate", "async"}): (
        "the colocate engine is a shard of the trainer's distributed world; in a producer it would be a server"
    ),
}
VLLM_FEATURES = ("vllm_server", "vllm_colocate")


def cell_name(features: tuple[str, ...]) -> str:
    """`"tools"` (a diagonal cell) or `"tools+async"` (in `FEATURES` order)."""
    return "+".join(features)


def ordered(features) -> tuple[str, ...]:
    """`features` in `FEATURES` order, each once.

    Raises:
        ValueError: naming an unknown feature and the known ones.
    """
    features = set(features)
    unknown = sorted(features - set(FEATURES))
    if unknown:
        raise ValueError(f"unknown features {unknown}: use names from {list(FEATURES)}.")
    return tuple(name for name in FEATURES if name in features)


def all_cells(features=None, two_process: bool = False) -> list[tuple[str, ...]]:
    """Every cell of `features` (default all): each feature alone and each pair not on one axis, in page order;
    the two-process features' cells only with `two_process`."""
    names = [n for n in ordered(features or FEATURES) if two_process or FEATURES[n].processes == 1]
    cells = []
    for i, a in enumerate(names):
        cells.append((a,))
        cells += [(a, b) for b in names[i + 1 :] if frozenset({a, b}) not in SAME_AXIS]
    return cells


def processes_of(features: tuple[str, ...]) -> int:
    return max(FEATURES[f].processes for f in features)


# =====================================================================================================================
# One cell (the worker: `--_worker spec.json`, under `accelerate launch` for a two-process cell)
# =====================================================================================================================
def base_recipe(run_dir: Path) -> Recipe:
    """The character-level tiny model on the built-in task suite: pretraining, SFT and RL (exact match), 2 steps."""
    from trl_trapo import TRAPOTrainer
    from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward, make_task_suite

    tokenizer = build_char_tokenizer()
    suite = make_task_suite(seed=0, num_pretrain_docs=20, num_sft_per_task=5, num_rl_per_task=10, num_eval_per_task=2)
    return Recipe(
        vision=False,
        processing_class=tokenizer,
        model=build_tiny_model(tokenizer, seed=0),
        trainer_class=TRAPOTrainer,
        config=dict(
            output_dir=str(run_dir / "out"),
            max_steps=STEPS,
            per_device_train_batch_size=8,
            learning_rate=1e-3,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            activation_checkpointing=False,
            pretrain_max_length=24,
            sft_max_length=24,
            max_prompt_length=16,
            response_length=4,
            num_generations=4,
            seed=0,
            disable_tqdm=True,
        ),
        kwargs=dict(
            reward_funcs=[exact_match_reward],
            train_dataset=suite.rl_train,
            pretrain_dataset=suite.pretrain,
            sft_dataset=suite.sft,
        ),
        run_dir=run_dir,
    )


def saved_and_reloaded(recipe: Recipe):
    """The policy saved to `<run_dir>/model` with its tokenizer or processor, and loaded back from there (vLLM loads
    the policy from a directory)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    path = recipe.run_dir / "model"
    recipe.model.save_pretrained(path)
    recipe.processing_class.save_pretrained(path)
    loader = AutoModelForImageTextToText if recipe.vision else AutoModelForCausalLM
    return loader.from_pretrained(path), path


def count_image_forwards(model, probes: dict) -> None:
    """Count the training forwards (gradient on) of `model`'s vision tower (the policy's: the trainer's model holds
    no other), in `probes`."""
    import torch

    towers = [m for name, m in model.named_modules() if name.split(".")[-1] == "vision_tower"]
    assert towers, "the VLM has no vision_tower"

    def hook(module, args, output):
        if torch.is_grad_enabled():
            probes["training_forwards_with_images"] = probes.get("training_forwards_with_images", 0) + 1

    towers[0].register_forward_hook(hook)


def install_vllm_stand_in(recipe: Recipe, monkeypatch, model_dir: Path, probes: dict):
    """The suite's CPU stand-in for vLLM (module docstring); returns a callable that counts its generate calls, and
    a list of things to close."""
    sys.path.insert(0, str(ROOT / "tests"))
    if recipe.vllm == "generation":
        import trl.generation.vllm_generation as vllm_generation
        from test_vllm_option import FakeVLLMGeneration

        import trl_trapo.rollout as rollout

        monkeypatch.setattr(rollout, "is_vllm_available", lambda: True)
        monkeypatch.setattr(vllm_generation, "VLLMGeneration", FakeVLLMGeneration)
        FakeVLLMGeneration.instances.clear()
        return (lambda: sum(len(fake.calls) for fake in FakeVLLMGeneration.instances)), []
    from test_async_vllm_server import FakeVLLMServer, install_stubs

    target = install_stubs(monkeypatch)
    server = FakeVLLMServer(model_dir)
    target.server = server
    recipe.config["vllm_server_base_url"] = server.url
    recipe.config["vllm_server_timeout"] = 0.0
    return (lambda: sum(1 for event in server.events if event[0] == "completions")), [server.close]


def record_sampling(monkeypatch, probes: dict) -> None:
    """Record `(step, temperatures)` of every `RolloutEngine.sample` call (in this process) in
    `probes["sample_calls"]`."""
    import torch

    from trl_trapo.rollout import RolloutEngine

    sample = RolloutEngine.sample
    calls = probes.setdefault("sample_calls", [])

    def recording(self, examples, group, step, temperature, *args, **kwargs):
        rows = len(examples) * group
        values = temperature.tolist() if isinstance(temperature, torch.Tensor) else temperature
        calls.append(
            (step, [float(t) for t in values] if isinstance(values, (list, tuple)) else [float(values)] * rows)
        )
        return sample(self, examples, group, step, temperature, *args, **kwargs)

    monkeypatch.setattr(RolloutEngine, "sample", recording)


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else "")[:400]


def where(error: BaseException) -> str:
    """`path:line in function` of the innermost frame of `error` in `trl_trapo` (else the innermost frame)."""
    frames = traceback.extract_tb(error.__traceback__)
    own = [f for f in frames if f"{os.sep}trl_trapo{os.sep}" in f.filename]
    frame = (own or frames or [None])[-1]
    if frame is None:
        return "?"
    path = os.path.relpath(frame.filename, ROOT) if frame.filename.startswith(str(ROOT)) else frame.filename
    return f"{path}:{frame.lineno} in {frame.name}"


def is_refusal(error: BaseException) -> bool:
    """A refusal TRAPO means to make: a `ValueError` / `NotImplementedError` raised by `trl_trapo`'s own code."""
    frames = traceback.extract_tb(error.__traceback__)
    return (
        isinstance(error, (ValueError, NotImplementedError))
        and bool(frames)
        and f"{os.sep}trl_trapo{os.sep}" in frames[-1].filename
    )


def run_cell(spec: dict) -> dict:
    """Build, train and check one cell (module docstring); the cell's outcome as a dict (`status`, `reason`,
    `evidence`, ...). Exceptions are caught and classified, except `KeyboardInterrupt`."""
    import pytest  # MonkeyPatch: the stand-ins are installed as the suite installs them
    import torch

    from trl_trapo import TRAPOConfig

    features = tuple(spec["features"])
    run_dir = Path(spec["run_dir"])
    torch.manual_seed(0)
    probes: dict = {}
    closers: list = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        try:
            stage = "construction"
            recipe = base_recipe(run_dir)
            for name in features:
                FEATURES[name].apply(recipe)
            model, model_dir = recipe.model, None
            if recipe.saved or recipe.by_path:
                model, model_dir = saved_and_reloaded(recipe)
            vllm_calls = None
            if recipe.vllm is not None:
                vllm_calls, closers = install_vllm_stand_in(recipe, monkeypatch, model_dir, probes)
            if recipe.record_sampling:
                record_sampling(monkeypatch, probes)
            trainer = recipe.trainer_class(
                str(model_dir) if recipe.by_path else model,
                args=TRAPOConfig(**recipe.config),
                processing_class=recipe.processing_class,
                **recipe.kwargs,
            )
            if recipe.vision:
                count_image_forwards(trainer.model, probes)
            stage = "training"
            trainer.train()
            if vllm_calls is not None:
                probes["vllm_generate_calls"] = vllm_calls()
        except Exception as error:  # the outcome of the cell, whatever it is
            if stage == "construction" and is_refusal(error):
                return {"status": "refused", "reason": first_line(error), "where": where(error)}
            return {
                "status": CRASH,
                "stage": stage,
                "reason": f"{type(error).__name__}: {first_line(error)}",
                "where": where(error),
                "traceback": traceback.format_exc()[-4000:],
            }
        finally:
            for close in closers:
                close()
    logs = list(trainer.state.log_history)
    if trainer.state.global_step != STEPS:
        return {"status": INACTIVE, "reason": f"trained {trainer.state.global_step} steps of {STEPS}"}
    evidence, missing = {}, {}
    for name in features:
        try:
            evidence[name] = FEATURES[name].check(Evidence(trainer, logs, probes))
        except AssertionError as error:
            missing[name] = str(error)
    if missing:
        return {"status": INACTIVE, "reason": "; ".join(f"{k}: {v}" for k, v in missing.items()), "evidence": evidence}
    return {"status": WORKS, "evidence": evidence}


def worker(spec_path: str) -> int:
    """The `--_worker` mode: run the cell of `spec_path` and write `result<rank>.json` beside it (every rank of a
    two-process cell writes its own)."""
    logging.basicConfig(level=logging.WARNING)
    spec = read_json(spec_path)
    rank = int(os.environ.get("RANK", "0"))
    started = time.perf_counter()
    result = run_cell(spec)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    write_json_atomic(Path(spec["run_dir"]) / f"result{rank}.json", result)
    return 0


# =====================================================================================================================
# The matrix: cells in child processes (`runlib`), the results file, the page
# =====================================================================================================================
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cell_command(features: tuple[str, ...], spec_path: Path) -> list[str]:
    """`python feature_matrix.py --_worker spec.json`, under `accelerate launch --num_processes 2` (the feature's
    shipped accelerate config, fp32) for a two-process cell."""
    worker_argv = [str(Path(__file__).resolve()), "--_worker", str(spec_path)]
    if processes_of(features) == 1:
        return [sys.executable, *worker_argv]
    config = next(FEATURES[f].accelerate_config for f in features if FEATURES[f].processes > 1)
    return [
        sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch",
        "--config_file", str(ACCELERATE_CONFIGS / config), "--num_processes", "2", "--mixed_precision", "no",
        "--main_process_port", str(free_port()), *worker_argv,
    ]  # fmt: skip


def combine(results: list[dict]) -> dict:
    """One outcome from the ranks' results: the first crash, else the first refusal, else rank 0's."""
    for status in (CRASH, INACTIVE, "refused"):
        for rank, result in enumerate(results):
            if result["status"] == status:
                return {**result, "rank": rank} if len(results) > 1 else result
    return results[0]


def launch_cell(features: tuple[str, ...], work_dir: Path, timeout_s: float) -> dict:
    """Run one cell in its own process(es) (`runlib.run_child`: its own session, one torch thread, offline,
    `DS_ACCELERATOR=cpu`; killed with what it started after `timeout_s`); its JSON record (`features`, `status`,
    `reason`, `where`, `evidence`, `processes`, `wall_s`, `commit`, `modified`, `date`)."""
    name = cell_name(features)
    run_dir = work_dir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in run_dir.glob("result*.json"):
        old.unlink()
    spec_path = run_dir / "spec.json"
    write_json_atomic(spec_path, {"features": list(features), "run_dir": str(run_dir)})
    processes = processes_of(features)
    run = run_child(
        cell_command(features, spec_path),
        log_path=run_dir / "log.txt",
        env=child_env(1, {"DS_ACCELERATOR": "cpu"}),
        name=name,
        timeout_s=timeout_s,
        check=False,
    )
    results = [read_json(p) for p in sorted(run_dir.glob("result*.json"))]
    if run.timed_out:
        result = {"status": HANG, "reason": f"no result after {timeout_s:.0f} s (killed)"}
        if results:
            result["ranks_finished"] = [r["status"] for r in results]
    elif len(results) < processes:
        tail = (run_dir / "log.txt").read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or [""]
        result = {
            "status": CRASH,
            "stage": "process",
            "reason": f"exit code {run.returncode} with {len(results)} of {processes} results; the log ends: "
            f"{tail[0][:300]}",
            "where": "the worker process",
        }
    else:
        result = combine(results)
    if result["status"] == "refused":
        result["status"] = BY_DESIGN_REFUSED if frozenset(features) in BY_DESIGN else TO_FIX_REFUSED
    result.pop("traceback", None)  # it stays in the cell's folder (result<rank>.json)
    record = {
        "features": list(features),
        **result,
        "processes": processes,
        "wall_s": round(run.wall_s, 1),
        "vllm_stand_in": any(f in VLLM_FEATURES for f in features),
        **library_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
    }
    logger.info("%-40s %-28s %5.0f s  %s", name, record["status"], run.wall_s, record.get("reason", ""))
    return record


def library_version() -> dict:
    """`commit`: the last commit that changed `trl_trapo/` (what the cells measure: the script and the tests may be
    newer); `modified`: whether `trl_trapo/` differs from it (None without git)."""
    changed = git("status", "--porcelain", "--", "trl_trapo")
    return {
        "commit": git("log", "-1", "--format=%H", "--", "trl_trapo"),
        "modified": bool(changed) if changed is not None else None,
    }


def merge(old: dict | None, records: list[dict], machine: dict | None) -> dict:
    """The results file with `records` replacing the cells of the same features (`machine`: `runlib.machine_info` of
    this run, None to keep the file's)."""
    cells = {cell_name(tuple(c["features"])): c for c in (old or {}).get("cells", [])}
    for record in records:
        cells[cell_name(tuple(record["features"]))] = record
    order = {cell_name(c): i for i, c in enumerate(all_cells(two_process=True))}
    return {
        "machine": machine if machine is not None else old["machine"],
        "steps": STEPS,
        "cells": sorted(cells.values(), key=lambda c: order.get(cell_name(tuple(c["features"])), len(order))),
    }


# ---- the page -------------------------------------------------------------------------------------------------------
def counts(data: dict) -> dict[str, int]:
    """Cells per outcome."""
    out = dict.fromkeys(OUTCOMES, 0)
    for cell in data["cells"]:
        out[cell["status"]] += 1
    return out


def render_block(data: dict) -> str:
    """The page's block: the matrix, its legend, the refusals and crashes listed, the machine, commits and dates."""
    cells = {frozenset(c["features"]): c for c in data["cells"]}
    names = [n for n in FEATURES if any(n in key for key in cells)]
    notes: dict[str, int] = {}  # reason text -> footnote number
    lines = []
    machine = data["machine"]
    commits = sorted(
        {c["commit"][:7] + (" (modified)" if c.get("modified") else "") for c in data["cells"] if c.get("commit")}
    )
    dates = sorted({c["date"] for c in data["cells"] if c.get("date")})
    total = counts(data)
    lines.append(
        f"{len(data['cells'])} cells, {data['steps']} optimizer steps each: "
        + ", ".join(f"**{total[o]}** {o}" for o in OUTCOMES if total[o] or o in (WORKS, CRASH, HANG))
        + "."
    )
    lines.append("")
    lines.append("| | " + " | ".join(FEATURES[n].label for n in names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for row in names:
        entries = []
        for column in names:
            cell = cells.get(frozenset({row, column}))
            if frozenset({row, column}) in SAME_AXIS:
                entries.append("·")
            elif cell is None:
                entries.append(" ")
            else:
                symbol = SYMBOLS[cell["status"]]
                if cell["status"] != WORKS:
                    text = cell_note(cell)
                    symbol += f"<sup>{notes.setdefault(text, len(notes) + 1)}</sup>"
                if cell.get("vllm_stand_in"):
                    symbol += "ˢ"
                entries.append(symbol)
        lines.append(f"| **{FEATURES[row].label}** | " + " | ".join(entries) + " |")
    lines.append("")
    lines.append(
        "Legend: ✓ works (trained "
        f"{data['steps']} steps, every feature of the cell seen active); — refused by design (a refusal issue 40 lets "
        "stay); R refused, to fix (issue 40); I inactive (trained, but a feature did not act as it should); C crash; "
        "H hang; · one axis, no cell; blank: not run. ˢ: run on the CPU stand-in for vLLM, not vLLM. The "
        "numbers are the notes below."
    )
    lines.append("")
    by_note: dict[int, list[str]] = {}
    for cell in data["cells"]:
        if cell["status"] != WORKS:
            by_note.setdefault(notes[cell_note(cell)], []).append(
                " × ".join(FEATURES[f].label for f in cell["features"])
            )
    for text, number in sorted(notes.items(), key=lambda item: item[1]):
        lines.append(f"{number}. {text} — {', '.join(by_note[number])}")
    lines.append("")
    lines.append(
        f"Measured on {machine['cpu_model']} ({machine['cpu_count']} cores), Python {machine['python']}, torch "
        f"{machine['torch']}, transformers {machine['transformers']}, TRL {machine['trl']}, accelerate "
        f"{machine['accelerate']}; `trl_trapo` at commit{'s' if len(commits) > 1 else ''} "
        f"{', '.join(commits)}; {' to '.join(sorted({dates[0], dates[-1]})) if dates else ''}."
    )
    return "\n".join(lines) + "\n"


def cell_note(cell: dict) -> str:
    """What the page says of a cell that does not work: its outcome, reason and where."""
    status = cell["status"]
    reason = cell.get("reason", "").replace("|", "\\|")
    if status in (BY_DESIGN_REFUSED, TO_FIX_REFUSED):
        return f"{status}: “{reason}”"
    if status == CRASH:
        return f"crash ({cell.get('stage', '?')}): `{reason}` at `{cell.get('where', '?')}`"
    return f"{status}: {reason}"


# ---- the command line -----------------------------------------------------------------------------------------------
def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default=None, help="comma-separated features: only their cells (alone and pairs)")
    parser.add_argument(
        "--involving", default=None, help="comma-separated features: every cell that has one of them (after --only)"
    )
    parser.add_argument(
        "--cells", default=None, help="comma-separated cells to run, each 'a' or 'a+b' ('': none, render only)"
    )
    parser.add_argument("--two_process", action="store_true", help="run the DDP and ZeRO-3 cells too (slow)")
    parser.add_argument("--jobs", type=positive_int, default=1, help="cells run at a time (default 1)")
    parser.add_argument(
        "--timeout", type=positive_float, default=None, help="seconds per cell before it counts as a hang"
    )
    parser.add_argument("--output_json", default=str(RESULTS), help="the results file (cells merged into it)")
    parser.add_argument("--work_dir", default=None, help="where the cells run (default: a temporary folder)")
    parser.add_argument("--render", default=None, help="write the matrix into this page (its feature-matrix block)")
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    return parser


def selected_cells(args: argparse.Namespace) -> list[tuple[str, ...]]:
    """The cells `--cells`, or `--only` / `--involving` / `--two_process`, select.

    Raises:
        ValueError: for an unknown feature, a cell of more than two features, or a pair on one axis.
    """
    if args.cells is not None:
        cells = []
        for text in filter(None, (c.strip() for c in args.cells.split(","))):
            features = ordered(text.split("+"))
            if len(features) not in (1, 2) or len(text.split("+")) != len(features):
                raise ValueError(f"--cells: {text!r} is not one feature or a pair of two different ones.")
            if frozenset(features) in SAME_AXIS:
                raise ValueError(f"--cells: {text!r} is a pair on one axis ({sorted(SAME_AXIS, key=sorted)}).")
            cells.append(features)
        return cells
    only = [f.strip() for f in args.only.split(",")] if args.only else None
    cells = all_cells(only, args.two_process)
    if args.involving:
        involving = set(ordered(f.strip() for f in args.involving.split(",")))
        cells = [cell for cell in cells if involving & set(cell)]
    return cells


def main(argv: list[str] | None = None) -> dict | None:
    """Run the selected cells, merge them into `--output_json`, render `--render`; returns the results file's data
    (None in worker mode)."""
    args = make_parser().parse_args(argv)
    if args._worker:
        sys.exit(worker(args._worker))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    go_offline()
    try:
        cells = selected_cells(args)
    except ValueError as error:
        make_parser().error(str(error))
    output = Path(args.output_json)
    old = read_json(output)
    records = []
    if cells:
        work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="feature_matrix-"))
        logger.info("%d cells, %d at a time, in %s", len(cells), args.jobs, work_dir)
        started = time.perf_counter()

        def one(features: tuple[str, ...]) -> dict:
            timeout = args.timeout or (TIMEOUT_S if processes_of(features) == 1 else TWO_PROCESS_TIMEOUT_S)
            return launch_cell(features, work_dir, timeout)

        records = map_jobs(one, cells, args.jobs)
        logger.info("%d cells in %.0f s", len(cells), time.perf_counter() - started)
    if not records and old is None:
        make_parser().error(f"no cell to run and no results in {output} to render.")
    data = merge(old, records, machine_info(code_paths=("trl_trapo",)) if records else None)
    if records:
        write_json_atomic(output, data, sort_keys=False)
        for outcome, n in counts({**data, "cells": records}).items():
            logger.info("%-28s %d", outcome, n)
    if args.render:
        write_block(BLOCK, render_block(data), Path(args.render))
        logger.info("wrote the %s block of %s", BLOCK, args.render)
    return data


if __name__ == "__main__":
    main()
