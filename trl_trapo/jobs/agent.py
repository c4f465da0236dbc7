# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The built-in agent job (`examples/trapo_tools.py`): the tiny model learns to call a tool, jointly with the rest.

    from trl_trapo.jobs.agent import main, parse_args

    job_args, config = parse_args([])  # the defaults of AGENT_JOB_DEFAULTS; `--config recipe.yaml` supported
    results = main(job_args, config)  # evaluate, train, evaluate again, save; results as in eval_results.json

With no arguments and no network it builds the character-level tokenizer with the compact tool-calling chat template
(`trl_trapo.agents.use_tool_chat_template`), the tiny model, the agent task (`trl_trapo.tasks.agent`: traces, RL
prompts, the `multiply` tool, the final-answer reward) and the built-in suite's pretraining corpus and other families
(`trl_trapo.tasks`; their demonstrations as chat rows, [`~trl_trapo.tasks.agent.as_conversation`]), and trains one
`TRAPOTrainer` on all three objectives at once: pretraining on the corpus, SFT on the traces and the other families'
demonstrations (`assistant_only_loss=True`: every assistant turn, tool calls included), RL on the agent prompts with
the tool (`tools=[multiply]`). Before and after training it measures ([`evaluate`]):

- `eval_agent_accuracy_with_tool`, `eval_agent_tool_call_validity`, `eval_agent_tool_calls_per_prompt`: greedy
  multi-turn rollouts on the held-out agent prompts, with the tool;
- `eval_agent_accuracy_without_tool`, `eval_agent_tool_calls_per_prompt_without_tool`: the same model and prompts,
  the tool withheld (its schema not rendered; a call the model still writes fails as an unknown tool);
- `eval_other_accuracy` and `eval_other_accuracy_<family>`: greedy exact match on the other families' held-out
  prompts (the families with demonstrations: `rev`, `nxt`, `min`);
- `eval_heldout_loss`: language-modelling loss (nats/token) of the last `heldout_docs` pretraining documents, which
  no run trains on;

each also with the suffix `_initial` (before training), plus `train_runtime_s` and `train_loss`, written to
`<output_dir>/eval_results.json` (atomically) next to the model and `trainer_state.json`, as the main job writes them
(`trl_trapo.jobs.main.save_job`); `--resume_from_checkpoint` resumes training as there (`trl_trapo.jobs.main.train_job`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import ClassVar

from datasets import Dataset
from trl import TrlParser

from ..agents import use_tool_chat_template
from ..config import TRAPOConfig
from ..distributed import check_launch
from ..saving import releases_job_holds
from ..tasks import SPLIT_SFT_TASKS, build_char_tokenizer, build_tiny_model, greedy_accuracy, make_task_suite
from ..tasks.agent import AgentTask, as_conversation, evaluate_agent, make_agent_task, mixed_sft_dataset


logger = logging.getLogger(__name__)

# Hyper-parameters of the agent job, for what the user does not set. Measured on 2 CPU cores (docs/agents.md). The
# main job's `BUILTIN_DEFAULTS` (trl_trapo/jobs/main.py), except: 600 steps, warm-up as a fraction, no evaluation during
# training, logging every 20 steps, room for the agent's turns (prompt 40, response 80, SFT rows 128 tokens), every
# assistant turn trained (`assistant_only_loss`), at most 2 rounds of tool calls, no progress bars.
AGENT_JOB_DEFAULTS = dict(
    output_dir="trapo-tools-output",
    max_steps=600,
    per_device_train_batch_size=32,
    gradient_accumulation_steps=2,
    learning_rate=2e-3,
    lr_scheduler_type="cosine_with_min_lr",
    lr_scheduler_kwargs={"min_lr_rate": 0.1},
    warmup_steps=0.03,
    adam_beta2=0.99,
    weight_decay=0.0,
    max_grad_norm=1.0,
    logging_steps=20,
    eval_strategy="no",
    save_strategy="no",
    report_to="none",
    activation_checkpointing=False,
    pretrain_max_length=64,
    sft_max_length=128,
    assistant_only_loss=True,
    max_prompt_length=40,
    response_length=80,
    max_tool_calling_iterations=2,
    num_generations=8,
    temperature=1.0,
    kl_coef=0.01,
    sync_ref_model=True,  # from random weights: anchor the KL to a lagging copy, as the main job does
    ref_model_sync_steps=25,
    ref_model_mixup_alpha=0.5,
    seed=0,
    dataloader_num_workers=0,
    disable_tqdm=True,
)


@dataclass
class AgentJobArguments:
    """The data arguments of the agent job (the training arguments are `TRAPOConfig`'s)."""

    own_data: ClassVar[str] = (
        "For your own model and data: `trapo train` (it takes --model_name_or_path, --dataset_name, --use_peft, "
        "...), or "
        "`TRAPOTrainer(tools=...)` in Python for tool calls (docs/agents.md)."
    )
    """Where a user's own model and data go: said when a main-job argument is given to this job."""

    task_seed: int = field(
        default=0, metadata={"help": "Seed of the agent task and of the built-in suite (corpus, other families)."}
    )
    num_traces: int = field(default=8000, metadata={"help": "SFT traces of the agent task (distinct problems)."})
    num_rl_prompts: int = field(default=4000, metadata={"help": "RL prompts of the agent task."})
    num_eval: int = field(default=200, metadata={"help": "Held-out agent prompts."})
    other_sft_per_task: int = field(
        default=500, metadata={"help": "Demonstrations per other built-in family (rev, nxt, min) in the SFT data."}
    )
    heldout_docs: int = field(
        default=200, metadata={"help": "Last pretraining documents held out for `eval_heldout_loss` (>= 1)."}
    )

    def __post_init__(self):
        for name in ("num_traces", "num_rl_prompts", "num_eval", "other_sft_per_task", "heldout_docs"):
            value = getattr(self, name)
            minimum = 0 if name == "other_sft_per_task" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"--{name}={value!r}: must be a whole number >= {minimum}. Fix: give one.")


def make_parser(prog: str | None = None) -> TrlParser:
    """The job's parser over `(AgentJobArguments, TRAPOConfig)`, with `AGENT_JOB_DEFAULTS` as defaults.

    Abbreviations are refused (`--learning_rat` is an error); `--config recipe.yaml` is read as in TRL's scripts.
    """
    from .main import take_mixture_mappings

    parser = TrlParser(
        (AgentJobArguments, TRAPOConfig),
        allow_abbrev=False,
        **({"prog": prog} if prog else {}),  # argparse's error prefix; its default is the script's file name
        usage=f"{prog or 'examples/trapo_tools.py'} [--config RECIPE.yaml] [--ARGUMENT VALUE ...]",
    )
    parser.set_defaults(**AGENT_JOB_DEFAULTS)
    return take_mixture_mappings(parser)


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> tuple[AgentJobArguments, TRAPOConfig]:
    """Parse the job's command line (`sys.argv[1:]` by default) over `AGENT_JOB_DEFAULTS`.

    Returns:
        `(job_args, config)`.

    Raises:
        SystemExit: from argparse, for `--help`.
        ValueError: for an unknown argument or `--config` key (with the closest known names), or a value
            `TRAPOConfig` or [`AgentJobArguments`] refuses, naming the field.
    """
    from .main import parse_job_args

    job_args, config = parse_job_args(
        lambda: make_parser(prog),
        (AgentJobArguments, TRAPOConfig),
        sys.argv[1:] if argv is None else list(argv),
        "examples/trapo_tools.py",
        command=prog,
    )
    return job_args, config


@dataclass
class AgentJobData:
    """What the agent job trains and evaluates on.

    Attributes:
        tokenizer: the character-level tokenizer with the tool-calling chat template.
        task ([`~trl_trapo.tasks.agent.AgentTask`]): traces, RL prompts, held-out prompts, tools, reward.
        pretrain (`Dataset`): the built-in corpus without its held-out documents (`text`).
        heldout_texts (`list[str]`): the held-out documents.
        sft (`Dataset`): the traces and the other families' demonstrations (chat rows), shuffled.
        other_eval (`Dataset`): the other families' held-out prompts (`prompt`, `answer`, `task`).
    """

    tokenizer: object
    task: AgentTask
    pretrain: Dataset
    heldout_texts: list[str]
    sft: Dataset
    other_eval: Dataset


def build_data(job_args: AgentJobArguments) -> AgentJobData:
    """Generate the agent task and the built-in suite from `job_args.task_seed` (no download).

    Raises:
        ValueError: if `heldout_docs` leaves no pretraining document to train on.
    """
    tokenizer = use_tool_chat_template(build_char_tokenizer())
    task = make_agent_task(
        job_args.task_seed, num_sft=job_args.num_traces, num_rl=job_args.num_rl_prompts, num_eval=job_args.num_eval
    )
    suite = make_task_suite(job_args.task_seed, num_sft_per_task=job_args.other_sft_per_task)
    cut = len(suite.pretrain) - job_args.heldout_docs
    if cut < 1:
        raise ValueError(
            f"--heldout_docs={job_args.heldout_docs} holds out every one of the {len(suite.pretrain)} pretraining "
            "documents. Fix: hold out fewer."
        )
    sft = task.sft
    if job_args.other_sft_per_task:
        sft = mixed_sft_dataset([task.sft, as_conversation(suite.sft)], seed=job_args.task_seed)
    other_eval = as_conversation(suite.eval.filter(lambda row: row["split"] == SPLIT_SFT_TASKS))
    return AgentJobData(
        tokenizer=tokenizer,
        task=task,
        pretrain=suite.pretrain.select(range(cut)),
        heldout_texts=suite.pretrain.select(range(cut, len(suite.pretrain)))["text"],
        sft=sft,
        other_eval=other_eval,
    )


def heldout_loss(model, tokenizer, texts: list[str], max_length: int, batch_size: int = 64) -> float:
    """Language-modelling loss (nats/token) of `texts`, each document (+ EOS) cut into rows of `max_length` tokens
    (`trl_trapo.evaluation.document_rows`); the model's train/eval mode is restored."""
    import torch

    from ..evaluation import document_rows, nll_sum

    rows = document_rows(list(texts), tokenizer, max_length)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            total, count = nll_sum(model, rows, tokenizer.pad_token_id, batch_size)
    finally:
        model.train(was_training)
    return total / max(count, 1.0)


def evaluate(model, data: AgentJobData, config: TRAPOConfig) -> dict[str, float]:
    """The job's held-out metrics of `model` (module docstring), without the `eval_` prefix.

    Returns:
        `dict[str, float]`: `agent_accuracy_with_tool`, `agent_tool_call_validity`, `agent_tool_calls_per_prompt`,
        `agent_accuracy_without_tool`, `agent_tool_calls_per_prompt_without_tool`, `other_accuracy`,
        `other_accuracy_<family>` per family of `data.other_eval`, `heldout_loss` (nats/token). Accuracies and
        validity are fractions in [0, 1].
    """
    tokenizer, task = data.tokenizer, data.task
    # training's bound (0 included: tools shown, none run); None (unbounded in training) evaluates with 4 rounds
    iterations = 4 if config.max_tool_calling_iterations is None else config.max_tool_calling_iterations
    loop = dict(response_length=config.response_length, max_iterations=iterations)
    with_tool = evaluate_agent(model, tokenizer, task.eval, task.tools, **loop)
    without_tool = evaluate_agent(model, tokenizer, task.eval, (), **loop)
    metrics = {
        "agent_accuracy_with_tool": with_tool["accuracy"],
        "agent_tool_call_validity": with_tool["tool_call_validity"],
        "agent_tool_calls_per_prompt": with_tool["tool_calls_per_prompt"],
        "agent_accuracy_without_tool": without_tool["accuracy"],
        "agent_tool_calls_per_prompt_without_tool": without_tool["tool_calls_per_prompt"],
    }
    other, correct = data.other_eval, 0.0
    tasks = other["task"]
    for family in sorted(set(tasks)):
        rows = other.select([i for i, task in enumerate(tasks) if task == family])
        accuracy = greedy_accuracy(model, tokenizer, rows, max_new_tokens=8)["accuracy"]
        metrics[f"other_accuracy_{family}"] = accuracy
        correct += accuracy * len(rows)
    metrics["other_accuracy"] = correct / len(other)
    metrics["heldout_loss"] = heldout_loss(model, tokenizer, data.heldout_texts, config.pretrain_max_length)
    return metrics


def build_trainer(data: AgentJobData, config: TRAPOConfig, model=None):
    """The job's `TRAPOTrainer`: pretraining on `data.pretrain`, SFT on `data.sft`, RL on the agent prompts with the
    tool; `model` defaults to a fresh tiny model (`build_tiny_model(tokenizer, seed=config.seed)`).

    Raises:
        ValueError: if `resume_from_checkpoint` is not a checkpoint, or `output_dir` is in use by another run or
            holds checkpoints this run does not resume (checked first, as the main job does), or for what the trainer
            refuses.
    """
    from ..saving import check_earlier_checkpoints, hold_output_dir
    from ..trainer import TRAPOTrainer
    from .main import check_checkpoint

    check_checkpoint(config.resume_from_checkpoint)  # before the model: `train_job` resumes from it
    hold_output_dir(config)  # no other run writes into output_dir: its lock, until this process ends
    check_earlier_checkpoints(config, config.resume_from_checkpoint, cli=True)  # an unfinished run there is resumed
    return TRAPOTrainer(
        model if model is not None else build_tiny_model(data.tokenizer, seed=config.seed),
        reward_funcs=data.task.reward_funcs,
        args=config,
        train_dataset=data.task.rl_train,
        sft_dataset=data.sft,
        pretrain_dataset=data.pretrain,
        processing_class=data.tokenizer,
        tools=data.task.tools,
    )


def run_job(data: AgentJobData, trainer, config: TRAPOConfig, job_start: float) -> dict[str, float]:
    """Evaluate, train jointly (resuming from `resume_from_checkpoint` when given), evaluate again, save the model,
    `trainer_state.json` and `eval_results.json` (steps 2-3 of [`main`]; `trl_trapo.jobs.main.train_job` and `save_job`,
    shared with the main job).

    Returns:
        The results written to `<output_dir>/eval_results.json` (see [`main`]).

    Raises:
        trl_trapo.checkpoint.CheckpointError: if `resume_from_checkpoint` is incomplete or corrupted.
        trl_trapo.saving.SaveError: if a file of the output folder cannot be written.
    """
    from .main import save_job, train_job

    # step 2. evaluate, train (resuming from resume_from_checkpoint when given), evaluate
    results = {f"eval_{k}_initial": v for k, v in evaluate(trainer.model, data, config).items()}
    results.update(train_job(trainer))
    results.update({f"eval_{k}": v for k, v in evaluate(trainer.model, data, config).items()})
    # step 3. save the model, the trainer state and the results, as the main job does
    save_job(trainer, results)
    if trainer.accelerator.is_main_process:
        print(summary(config.output_dir, results, time.perf_counter() - job_start), flush=True)
    return results


@releases_job_holds  # the hold on output_dir it takes (saving.hold_output_dir) ends with it
def main(job_args: AgentJobArguments, config: TRAPOConfig) -> dict[str, float]:
    """The job: build, evaluate, train jointly, evaluate again, save.

    Returns:
        The results written to `<output_dir>/eval_results.json`: `eval_<metric>_initial` and `eval_<metric>` for
        every metric of [`evaluate`], `train_runtime_s` (seconds) and `train_loss`.

    Raises:
        ValueError: for data arguments that cannot work (see [`build_data`]) or what the trainer refuses.
        trl_trapo.checkpoint.CheckpointError: if `resume_from_checkpoint` is incomplete or corrupted.
        trl_trapo.saving.SaveError: if a file of the output folder cannot be written.
    """
    job_start = time.perf_counter()
    # step 1. data, tokenizer, model, trainer
    check_launch(config.distributed_state)  # a launch that does not match the run: before data and model
    data = build_data(job_args)
    return run_job(data, build_trainer(data, config), config, job_start)


SUMMARY_METRICS = (
    "agent_accuracy_with_tool",
    "agent_accuracy_without_tool",
    "agent_tool_call_validity",
    "other_accuracy",
    "heldout_loss",
)


def summary(output_dir: str, results: dict[str, float], seconds: float) -> str:
    """A few lines for the human who launched the job: where the results are, the headline metrics before ->
    after, wall time."""
    width = max(len(name) for name in SUMMARY_METRICS)
    lines = [f"Done in {seconds:.0f} s (training {results['train_runtime_s']:.0f} s). Output: {output_dir}"]
    for name in SUMMARY_METRICS:
        lines.append(f"  {name:<{width}}  {results[f'eval_{name}_initial']:.3f} -> {results[f'eval_{name}']:.3f}")
    return "\n".join(lines)


@releases_job_holds  # the hold on output_dir it takes (saving.hold_output_dir) ends with it
def run(argv: list[str] | None = None, program: str | None = None) -> int:
    """The command line: parse, build, run the job; a user error becomes one message on stderr and exit status 2, as
    in the main job (`trl_trapo.jobs.main.run`: the same errors count as the user's before and during training;
    `TRAPO_DEBUG=1` raises them with their traceback instead).

    Returns:
        0 after a complete job, 2 after a user error.

    Raises:
        SystemExit: from argparse, for `--help` (status 0) or a malformed command line (status 2).
    """
    from .main import RUN_USER_ERRORS, SETUP_USER_ERRORS, debug_requested, report_user_error

    user_errors = SETUP_USER_ERRORS
    try:
        job_args, config = parse_args(argv, prog=program)
        job_start = time.perf_counter()
        data = build_data(job_args)
        trainer = build_trainer(data, config)
        user_errors = RUN_USER_ERRORS  # from here on, only errors that cannot be a fault of the program
        run_job(data, trainer, config, job_start)
    except Exception as error:
        if not isinstance(error, user_errors) or debug_requested():
            raise
        return report_user_error(error, program or os.path.basename(sys.argv[0]) or "trapo_tools.py")
    return 0


__all__ = [
    "AGENT_JOB_DEFAULTS",
    "AgentJobArguments",
    "AgentJobData",
    "build_data",
    "build_trainer",
    "evaluate",
    "heldout_loss",
    "main",
    "make_parser",
    "parse_args",
    "run",
    "run_job",
]
