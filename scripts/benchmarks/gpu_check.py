# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""GPU check for a lent machine with no network: a short TRAPO job on a real-size, randomly initialised model.

Builds Qwen2.5-0.5B's architecture from its config (written below, nothing is downloaded) with random weights, a
character tokenizer padded to Qwen2.5's 151,936-token vocabulary, and the built-in task suite as data, then runs a
short joint pretraining + SFT + RL job — with transformers' `generate`, and again with vLLM (colocate mode) when vLLM
is importable — and prints, per run:

- training tokens/s (every token of every row the policy trained on, over the timed steps' wall time);
- MFU: model FLOPs utilisation of that throughput (`trl.trainer.utils.compute_mfu`, against the GPU's dense bf16
  peak), over the whole step and over the step minus generation;
- peak GPU memory (`torch.cuda.max_memory_allocated`);
- the share of step time spent in generation rounds (generate + reference / reward scoring), and the median step time.

After the vLLM run, two short runs of the pairs issue 40's sampler stage made possible, on vLLM's colocate mode:
`vllm-tools` (every turn of the tool-calling loop sampled by vLLM, `tools/turns_mean` reported) and `vllm-images`
(image prompts passed to vLLM as `multi_modal_data`; the tiny LLaVA of `trl_trapo.tasks.vision`, the vision tower's
forwards reported); `--pairs_only` runs them alone.

The vLLM run also records the sampler/trainer mismatch its rounds logged last (`sampling/*`: vLLM's bf16 log-probs
against the trainer's, TRL's `vllm_importance_sampling_correction` at its defaults) in the JSON output.

Then, where vLLM is importable and a GPU is present, asynchronous rollouts through a vLLM server (`async_rollouts=True,
use_vllm=True, vllm_mode="server"`): a child process starts `trl vllm-serve` on the trainer's chip (low
`--gpu_memory_utilization`; on the second GPU when there are two), trains a few RL steps against it and prints the
wall time of each step and the measured sampler/trainer log-prob gap (`sampling/sampling_logp_difference/*`; at step
0 the server and the trainer hold the same weights, so it is vLLM's kernels against the trainer's). The trainer
pushes its weights to the server over NCCL, which refuses two ranks on one GPU ("Duplicate GPU detected"): on a
one-GPU machine the script says so and leaves the pushes out (`async-vllm-server-no-push`: the server keeps the
initial weights; `--async_try_push` tries them, falling back when they fail), which still checks the HTTP path, the
producer and the log-prob gap; with two GPUs the server gets the second one and the pushes run. Elsewhere it prints
why it was skipped; the script exits 0 either way.

The first `--warmup` steps are not timed. The first two runs are meant to finish in under 8 minutes on one H100/H200
(`--time_budget_s` skips the vLLM run when the first one took too long); the async run adds a few minutes (server
start included; `--async_budget_s` skips it, `--async_timeout_s` stops it; `--async_only` runs it alone). A tiny
variant runs anywhere:

    python scripts/benchmarks/gpu_check.py                       # on the GPU machine
    python scripts/benchmarks/gpu_check.py --tiny --steps 4      # CPU smoke test (tests/test_gpu_check.py)
    python scripts/benchmarks/gpu_check.py --no_vllm             # transformers' generate only
    python scripts/benchmarks/gpu_check.py --async_only          # only the async vLLM server run (a few minutes)
    python scripts/benchmarks/gpu_check.py --pairs_only          # only the vLLM x tools / images runs
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import torch


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "experiments"))  # runlib
from runlib import (  # noqa: E402
    config_refusals_as_usage,
    int_range,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)


QWEN25_05B = dict(  # Qwen/Qwen2.5-0.5B-Instruct's config.json (architecture fields)
    model_type="qwen2",
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    tie_word_embeddings=True,
    use_sliding_window=False,
    attention_dropout=0.0,
)
TINY = dict(QWEN25_05B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)  # fmt: skip
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12}


def build_tokenizer(vocab_size: int):
    """The built-in character tokenizer, its vocabulary padded with `<x_i>` tokens to `vocab_size` entries, so that
    every id the random model can sample decodes (the fillers never occur in the data)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from trl_trapo import tasks

    base = list(tasks.SPECIAL_TOKENS + tasks.CHARACTERS)
    vocab = {token: i for i, token in enumerate(base + [f"<x{i}>" for i in range(vocab_size - len(base))])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=tasks.UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=tasks.PAD_TOKEN,
        eos_token=tasks.EOS_TOKEN,
        bos_token=tasks.BOS_TOKEN,
        unk_token=tasks.UNK_TOKEN,
        padding_side="right",
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    tokenizer.chat_template = tasks.CHAT_TEMPLATE
    return tokenizer


def build_model(arch: dict, tokenizer, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in arch.items() if k != "model_type"}
    fields.update(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    config = AutoConfig.for_model(arch["model_type"], **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


class Probe:
    """Wraps a trainer's step building and generation rounds with timers and a token counter."""

    def __init__(self, trainer, device: torch.device):
        self.device = device
        self.step_tokens: list[int] = []
        self.step_generation: list[float] = []
        self.step_ends: list[float] = []
        self._generation = 0.0
        build, generate = trainer.get_batch_samples, trainer.rl_supply.collect  # every round of the RL supply

        def get_batch_samples(*args, **kwargs):
            batches, info = build(*args, **kwargs)
            self.step_tokens.append(int(sum(int(b["attention_mask"].sum()) for b in batches)))
            return batches, info

        def generate_round(*args, **kwargs):
            self._sync()
            start = time.perf_counter()
            result = generate(*args, **kwargs)
            self._sync()
            self._generation += time.perf_counter() - start
            return result

        trainer.get_batch_samples = get_batch_samples
        trainer.rl_supply.collect = generate_round
        from transformers import TrainerCallback

        probe = self

        class StepEnd(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                probe._sync()
                probe.step_ends.append(time.perf_counter())
                probe.step_generation.append(probe._generation)
                probe._generation = 0.0
                return control

        trainer.add_callback(StepEnd())

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def run(name: str, arch: dict, args, device: torch.device, use_vllm: bool) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import compute_flops_per_token, compute_mfu

    from trl_trapo import TRAPOConfig, TRAPOTrainer
    from trl_trapo.tasks import exact_match_reward, make_task_suite

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tokenizer = build_tokenizer(arch["vocab_size"])
    model = build_model(arch, tokenizer, dtype)
    workdir = tempfile.mkdtemp(prefix="trapo-gpu-check-")
    if use_vllm:  # vLLM loads the model from a directory
        model.save_pretrained(os.path.join(workdir, "model"))
        tokenizer.save_pretrained(os.path.join(workdir, "model"))
        model = AutoModelForCausalLM.from_pretrained(os.path.join(workdir, "model"), dtype=dtype)
    suite = make_task_suite(seed=0, num_pretrain_docs=400, num_sft_per_task=200, num_rl_per_task=200,
                            num_eval_per_task=2)  # fmt: skip
    long_text = Dataset.from_dict({"text": [" ".join(suite.pretrain["text"][i : i + 40]) for i in range(0, 400, 4)]})
    config = TRAPOConfig(
        output_dir=os.path.join(workdir, "out"),
        max_steps=args.steps + args.warmup,
        per_device_train_batch_size=args.rows,
        gradient_accumulation_steps=1,
        learning_rate=1e-5,
        logging_steps=max(args.steps, 1),
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        activation_checkpointing=False,
        use_cpu=device.type == "cpu",
        pretrain_max_length=args.seq_len,
        sft_max_length=args.seq_len,
        max_prompt_length=32,
        response_length=args.response_length,
        num_generations=8,
        num_ppo_epochs=2,  # as in the 7B recipes: each rollout is trained on twice
        local_rollout_forward_batch_size=64,
        curriculum_mode="constant",  # the same mixture every step, so steps are comparable
        kl_coef=0.05,
        use_vllm=use_vllm,
        vllm_gpu_memory_utilization=0.3,
        seed=0,
    )
    trainer = TRAPOTrainer(
        model,
        reward_funcs=exact_match_reward,
        args=config,
        train_dataset=suite.rl_train,
        pretrain_dataset=long_text,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )
    probe = Probe(trainer, trainer.accelerator.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    ends = probe.step_ends
    times = [b - a for a, b in zip(ends[args.warmup - 1 : -1], ends[args.warmup :])] if args.warmup else []
    if not args.warmup:
        times = [ends[0] - start] + [b - a for a, b in zip(ends[:-1], ends[1:])]
    timed = slice(len(ends) - len(times), len(ends))
    tokens = sum(probe.step_tokens[timed])
    generation = sum(probe.step_generation[timed])
    wall = sum(times)
    tokens_per_s = tokens / wall if wall else 0.0
    flops = compute_flops_per_token(trainer.model.config, args.seq_len)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else None
    if peak is None and device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in gpu), None)
    train_wall = wall - generation
    result = {
        "run": name,
        "steps_timed": len(times),
        "tokens_per_s": tokens_per_s,
        "mfu_pct": compute_mfu(flops, tokens_per_s, 1, peak) if peak else None,
        "mfu_pct_without_generation": compute_mfu(flops, tokens / train_wall, 1, peak)
        if peak and train_wall
        else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "generation_share": generation / wall if wall else 0.0,
        "median_step_s": statistics.median(times) if times else None,
        "total_s": total,
        "parameters_m": sum(p.numel() for p in trainer.model.parameters()) / 1e6,
    }
    for entry in trainer.state.log_history:  # vLLM runs: the mismatch statistics, last logged values
        result.update({k: v for k, v in entry.items() if k.startswith("sampling/")})
    del trainer, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def run_vllm_pair(case: str, args, device: torch.device) -> dict:
    """One pair of issue 40's sampler stage on the real vLLM (colocate mode), a few RL steps: `vllm-tools` (the
    tool-calling loop's turns sampled by vLLM: the agent task, `tools=[multiply]`, on the Qwen2.5-0.5B-sized random
    model with the tool template) or `vllm-images` (image prompts passed to vLLM as `multi_modal_data`: the tiny
    LLaVA of `trl_trapo.tasks.vision` on the visual task suite). Reports the steps run, what shows the pair ran
    (`tools/turns_mean`; the vision tower's forwards) and the sampler/trainer mismatch logged last (`sampling/*`)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from trl_trapo import TRAPOConfig, TRAPOTrainer

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    workdir = tempfile.mkdtemp(prefix=f"trapo-gpu-check-{case}-")
    path = os.path.join(workdir, "model")
    kwargs: dict = {}
    settings = dict(max_prompt_length=96, response_length=32, num_generations=4)
    if case == "vllm-tools":
        from trl_trapo.agents import use_tool_chat_template
        from trl_trapo.tasks.agent import make_agent_task, multiply

        arch = TINY if args.tiny else QWEN25_05B
        processing_class = use_tool_chat_template(build_tokenizer(arch["vocab_size"]))
        build_model(arch, processing_class, dtype).save_pretrained(path)
        loader = AutoModelForCausalLM
        task = make_agent_task(seed=0, num_sft=8, num_rl=64, num_eval=2)
        kwargs.update(train_dataset=task.rl_train, reward_funcs=[*task.reward_funcs], tools=[multiply])
        settings.update(response_length=64, vllm_max_model_length=512)
    else:
        from trl_trapo.tasks.vision import build_tiny_vlm, build_vlm_processor, make_visual_task_suite

        processing_class = build_vlm_processor()
        build_tiny_vlm(processing_class, seed=0).to(dtype).save_pretrained(path)
        loader = AutoModelForImageTextToText
        suite = make_visual_task_suite(seed=0, num_pretrain_docs=4, num_sft_per_task=2, num_rl_per_task=16,
                                       num_eval_per_task=1, num_eval_captions=1)  # fmt: skip
        kwargs.update(train_dataset=suite.rl_train, reward_funcs=[*suite.reward_funcs])
        settings.update(response_length=8, num_generations=2)
    processing_class.save_pretrained(path)
    model = loader.from_pretrained(path, dtype=dtype)
    forwards = []
    towers = [m for name, m in model.named_modules() if name.split(".")[-1] == "vision_tower"]
    if towers:
        towers[0].register_forward_hook(lambda module, inputs, output: forwards.append(1))
    config = TRAPOConfig(
        output_dir=os.path.join(workdir, "out"),
        max_steps=args.pair_steps,
        per_device_train_batch_size=8,
        learning_rate=1e-5,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        activation_checkpointing=False,
        use_cpu=device.type == "cpu",
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.2,
        seed=0,
        **settings,
    )
    start = time.perf_counter()
    trainer = TRAPOTrainer(model, args=config, processing_class=processing_class, **kwargs)
    trainer.train()
    result = {"run": case, "steps": trainer.state.global_step, "total_s": time.perf_counter() - start}
    for entry in trainer.state.log_history:
        result.update({k: v for k, v in entry.items() if k.startswith(("sampling/", "tools/"))})
    if towers:
        result["vision_tower_forwards"] = len(forwards)
    del trainer, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def run_vllm_pairs(args, device: torch.device, missing: str | None) -> list[dict]:
    """The `vllm-tools` and `vllm-images` runs ([`run_vllm_pair`]), each reported, never raising; none without
    vLLM."""
    if missing is not None or args.no_vllm:
        print("vLLM x tools / images runs skipped: " + ("--no_vllm" if args.no_vllm else missing), flush=True)
        return []
    results = []
    for case in ("vllm-tools", "vllm-images"):
        try:
            result = run_vllm_pair(case, args, device)
        except Exception as error:  # report, do not hide the other runs' numbers
            print(f"{case} run failed: {type(error).__name__}: {error}", flush=True)
            continue
        print(f"{case}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                     for k, v in result.items() if k != "run"), flush=True)  # fmt: skip
        results.append(result)
    return results


def vllm_missing(device: torch.device) -> str | None:
    """Why vLLM runs cannot happen here (None: they can)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vllm is not importable"
    return None if device.type == "cuda" else "no GPU"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class VLLMServer:
    """`trl vllm-serve` in a process group of its own (stopped on exit), logging to a file; `gpu`: the
    `CUDA_VISIBLE_DEVICES` it gets (None: this process's, i.e. the trainer's chip)."""

    def __init__(self, model_dir: str, max_model_len: int, start_timeout_s: float, gpu_memory_utilization: float,
                 gpu: str | None = None):  # fmt: skip
        self.model_dir, self.max_model_len, self.gpu = model_dir, max_model_len, gpu
        self.start_timeout_s, self.gpu_memory_utilization = start_timeout_s, gpu_memory_utilization
        self.process = None
        self.log_path = os.path.join(os.path.dirname(model_dir), "vllm_server.log")

    def start(self) -> str:
        port = free_port()
        command = [sys.executable, "-m", "trl.cli.main", "vllm-serve", "--model", self.model_dir,
                   "--host", "127.0.0.1", "--port", str(port), "--gpu_memory_utilization",
                   str(self.gpu_memory_utilization), "--max_model_len", str(self.max_model_len),
                   "--enforce_eager", "true"]  # fmt: skip
        env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": self.gpu} if self.gpu is not None else {}))
        log = open(self.log_path, "ab")  # noqa: SIM115 - the server writes to it until it stops
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        start = time.perf_counter()
        while time.perf_counter() - start < self.start_timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"`trl vllm-serve` exited with code {self.process.returncode}:\n{self.log_tail()}")
            if self.healthy():
                print(f"vLLM server up at {self.url} after {time.perf_counter() - start:.0f} s", flush=True)
                return self.url
            time.sleep(2)
        raise RuntimeError(f"`trl vllm-serve` did not answer within {self.start_timeout_s:.0f} s:\n{self.log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    def log_tail(self, chars: int = 3000) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()[-chars:]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None


def run_async_server(name: str, model_dir: str, url: str, args, push: bool) -> dict:
    """A few RL steps with asynchronous rollouts through the vLLM server at `url`; `push=False` leaves the NCCL weight
    transfer out (the trainer's `init_communicator` and weight pushes become no-ops: the server keeps its weights)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.generation.vllm_client import VLLMClient

    from trl_trapo import TRAPOConfig, TRAPOTrainer
    from trl_trapo.rollout import VLLMGenerator
    from trl_trapo.tasks import exact_match_reward, make_task_suite

    if not push:
        VLLMClient.init_communicator = lambda self, device=0: None
        VLLMGenerator.push_weights = lambda self: None
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    suite = make_task_suite(seed=0, num_pretrain_docs=10, num_sft_per_task=2, num_rl_per_task=200, num_eval_per_task=2)
    config = TRAPOConfig(
        output_dir=os.path.join(os.path.dirname(model_dir), f"out-{name}"),
        max_steps=args.async_steps,
        per_device_train_batch_size=args.rows,
        learning_rate=1e-5,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        activation_checkpointing=False,
        max_prompt_length=32,
        response_length=args.response_length,
        num_generations=8,
        num_ppo_epochs=1,  # every step consumes a round: each step's wait shows the producer's pace
        async_rollouts=True,
        max_staleness=2,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=url,
        vllm_server_timeout=60,
        seed=0,
    )
    trainer = TRAPOTrainer(
        model, reward_funcs=exact_match_reward, args=config, train_dataset=suite.rl_train, processing_class=tokenizer
    )
    ends = []

    class StepEnd(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            ends.append(time.perf_counter())
            return control

    trainer.add_callback(StepEnd())
    start = time.perf_counter()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    step_s = [b - a for a, b in zip([start] + ends[:-1], ends)]
    gap = [h.get("sampling/sampling_logp_difference/mean") for h in logs]
    result = {
        "run": name,
        "step_s": step_s,
        "median_step_s": statistics.median(step_s[1:] or step_s),
        "logp_gap_step0": gap[0] if gap else None,
        "logp_gap_mean": statistics.mean([g for g in gap if g is not None])
        if any(g is not None for g in gap)
        else None,
        "logp_gap_max": max((h.get("sampling/sampling_logp_difference/max", 0.0) for h in logs), default=None),
        "rollout_wait_s": sum(h.get("perf/rollout_wait_s", 0.0) for h in logs),
        "weight_sync_s": sum(h.get("perf/weight_sync_s", 0.0) for h in logs),
        "staleness_max": max((h.get("sample/staleness_max", 0) for h in logs), default=None),
    }
    print(f"{name}: step wall times (s): " + ", ".join(f"{t:.2f}" for t in step_s), flush=True)
    print(
        f"{name}: median step {result['median_step_s']:.2f} s (first step excluded), sampler/trainer log-prob gap "
        f"{result['logp_gap_step0']} nats/token at step 0 (same weights), mean {result['logp_gap_mean']}, max "
        f"{result['logp_gap_max']}; waited {result['rollout_wait_s']:.2f} s for rounds, {result['weight_sync_s']:.2f} "
        f"s pushing weights, lag <= {result['staleness_max']}",
        flush=True,
    )
    return result


def async_server_child(args) -> list[dict]:
    """The async vLLM server runs (in a child process of the check: its own CUDA context and time limit), each result
    written to `args.async_server_child` as soon as it exists.

    With one GPU the trainer and the server share it, and NCCL refuses two ranks of one communicator on one GPU
    ("Duplicate GPU detected"; with TRL's HTTP retries the failed rendezvous can also hang), so the weight pushes are
    left out unless `--async_try_push`; with two or more the server gets the second GPU and the pushes run."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the parent's time limit: stop the server on the way out
    arch = TINY if args.tiny else QWEN25_05B
    tokenizer = build_tokenizer(arch["vocab_size"])
    workdir = tempfile.mkdtemp(prefix="trapo-gpu-check-async-")
    model_dir = os.path.join(workdir, "model")
    build_model(arch, tokenizer, torch.bfloat16).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if os.environ.get("CUDA_VISIBLE_DEVICES") else []
    shared = torch.cuda.device_count() < 2
    gpu = None if shared else (visible[1] if len(visible) > 1 else "1")
    push = not shared or args.async_try_push
    if not push:
        print(
            "async vLLM server: one GPU, shared by the trainer and the server; NCCL refuses two ranks on one GPU, so "
            "the trainer's weight pushes are left out (the server keeps the initial weights; --async_try_push tries "
            "them). The run still checks the HTTP path, the producer and the sampler/trainer log-prob gap.",
            flush=True,
        )
    server = VLLMServer(model_dir, 32 + args.response_length, args.async_server_start_s, 0.25, gpu)
    results = []

    def keep(result: dict) -> None:
        results.append(result)
        with open(args.async_server_child, "w", encoding="utf-8") as handle:
            json.dump(results, handle)

    try:
        url = server.start()
        name = "async-vllm-server" if push else "async-vllm-server-no-push"
        try:
            keep(run_async_server(name, model_dir, url, args, push=push))
        except Exception as error:  # report, then check the rest without the NCCL weight transfer
            if not push:
                raise
            text = f"{type(error).__name__}: {error}"
            duplicate = "Duplicate GPU" in text + server.log_tail(20000)
            print(
                f"async vLLM server run with weight pushes failed: {text[:1500]}\n"
                + ("NCCL refused two ranks on one GPU. " if duplicate else "")
                + "Running again without the weight pushes.",
                flush=True,
            )
            if not server.healthy():
                server.stop()
                url = server.start()
            keep(run_async_server("async-vllm-server-no-push", model_dir, url, args, push=False))
    finally:
        server.stop()
    return results


def run_async_server_check(args, device: torch.device) -> list[dict]:
    """Asynchronous rollouts through `trl vllm-serve` (module docstring), in a child process stopped after
    `--async_timeout_s`; prints why it was skipped or what failed, never raises."""
    reason = "--no_vllm" if args.no_vllm else vllm_missing(device)
    if reason is not None:
        print(f"async vLLM server run skipped: {reason}", flush=True)
        return []
    out = tempfile.mkstemp(prefix="trapo-async-vllm-", suffix=".json")[1]
    command = [sys.executable, os.path.abspath(__file__), "--async_server_child", out, "--async_steps",
               str(args.async_steps), "--rows", str(args.rows), "--response_length", str(args.response_length),
               "--async_server_start_s", str(args.async_server_start_s)]  # fmt: skip
    command += ["--tiny"] if args.tiny else []
    command += ["--async_try_push"] if args.async_try_push else []
    child = subprocess.Popen(command, start_new_session=True)
    try:
        child.wait(timeout=args.async_timeout_s)
    except subprocess.TimeoutExpired:
        print(f"async vLLM server run stopped after {args.async_timeout_s:.0f} s (--async_timeout_s)", flush=True)
        os.killpg(child.pid, signal.SIGTERM)  # the child stops its server on the way out
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    if child.returncode not in (0, None):
        print(f"async vLLM server run failed (exit code {child.returncode}; its output is above)", flush=True)
    try:
        with open(out, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return []


CONFIG_FLAGS = {
    "per_device_train_batch_size": "--rows",
    "pretrain_max_length": "--seq_len",
    "sft_max_length": "--seq_len",
    "response_length": "--response_length",
}
"""TRAPOConfig field -> the flag that sets it, for a refusal's message."""


def make_parser() -> argparse.ArgumentParser:
    """The check's command line (numbers refused outside their range: `runlib.NumberRange`)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model with a 512-token vocabulary (CPU test)")
    parser.add_argument("--steps", type=positive_int, default=20, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=non_negative_int, default=2, help="untimed first steps")
    parser.add_argument("--rows", type=positive_int, default=16, help="rows per optimizer step")
    parser.add_argument(
        "--seq_len", type=int_range(2), default=512, help="pretraining / SFT row length (tokens, >= 2)"
    )
    parser.add_argument("--response_length", type=positive_int, default=128, help="generated tokens per completion")
    parser.add_argument(
        "--peak_tflops", type=positive_float, default=None, help="dense peak TFLOP/s (default: from GPU name)"
    )
    parser.add_argument(
        "--time_budget_s", type=non_negative_float, default=420, help="skip the vLLM run after this many seconds"
    )
    parser.add_argument("--no_vllm", action="store_true", help="skip the vLLM runs even if vLLM is importable")
    parser.add_argument(
        "--async_steps", type=positive_int, default=8, help="optimizer steps of the async vLLM server run"
    )
    parser.add_argument(
        "--async_server_start_s", type=positive_float, default=300, help="wait this long for the server"
    )
    parser.add_argument(
        "--async_timeout_s", type=positive_float, default=420, help="stop the async vLLM server run after"
    )
    parser.add_argument("--async_budget_s", type=non_negative_float, default=600,
                        help="skip the async vLLM server run when the runs before it took longer")  # fmt: skip
    parser.add_argument("--async_only", action="store_true", help="only the async vLLM server run (a short check)")
    parser.add_argument("--pairs_only", action="store_true",
                        help="only the vLLM x tools and vLLM x images runs (issue 40's sampler stage)")  # fmt: skip
    parser.add_argument(
        "--pair_steps", type=positive_int, default=3, help="optimizer steps of each vLLM x tools / images run"
    )
    parser.add_argument("--async_try_push", action="store_true",
                        help="on one GPU, try the NCCL weight pushes to the server anyway")  # fmt: skip
    parser.add_argument("--async_server_child", default=None, help=argparse.SUPPRESS)  # internal: the child's JSON
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    parser = make_parser()
    args = parser.parse_args(argv)
    with config_refusals_as_usage(parser, CONFIG_FLAGS):  # a TRAPOConfig refusal: a usage error, no traceback
        return run_all(args)


def run_all(args: argparse.Namespace) -> list[dict]:
    """The runs `args` selects (see the module docstring); their records."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.tiny:
        args.seq_len, args.response_length, args.rows = min(args.seq_len, 64), min(args.response_length, 16), 8
    if args.async_server_child:  # the child process of the async vLLM server run
        results = async_server_child(args)
        with open(args.async_server_child, "w", encoding="utf-8") as handle:
            json.dump(results, handle)
        return results
    arch = TINY if args.tiny else QWEN25_05B
    start = time.perf_counter()
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}", flush=True)
    missing = vllm_missing(device)
    if args.async_only or args.pairs_only:
        results = run_async_server_check(args, device) if args.async_only else run_vllm_pairs(args, device, missing)
        print(f"total wall time: {time.perf_counter() - start:.0f} s", flush=True)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump(results, handle, indent=1)
        return results
    results = [run("hf-generate", arch, args, device, use_vllm=False)]
    if missing is not None or args.no_vllm:
        print("vLLM run skipped: " + ("--no_vllm" if args.no_vllm else missing), flush=True)
    elif time.perf_counter() - start > args.time_budget_s:
        print(f"vLLM run skipped: the first run used up the {args.time_budget_s:.0f} s budget", flush=True)
    else:
        try:
            results.append(run("vllm-colocate", arch, args, device, use_vllm=True))
        except Exception as error:  # report, do not hide the first run's numbers
            print(f"vLLM run failed: {type(error).__name__}: {error}", flush=True)
        results += run_vllm_pairs(args, device, missing)
    header = ("run", "params (M)", "tokens/s", "MFU %", "MFU % w/o gen", "peak GiB", "gen share", "step s")
    print(" | ".join(header))
    for r in results:

        def fmt(value, spec):
            return "n/a" if value is None else format(value, spec)

        print(
            " | ".join(
                [
                    r["run"],
                    fmt(r["parameters_m"], ".1f"),
                    fmt(r["tokens_per_s"], ".0f"),
                    fmt(r["mfu_pct"], ".1f"),
                    fmt(r["mfu_pct_without_generation"], ".1f"),
                    fmt(r["peak_memory_gib"], ".2f"),
                    fmt(r["generation_share"], ".2f"),
                    fmt(r["median_step_s"], ".3f"),
                ]
            ),
            flush=True,
        )
    if not args.no_vllm and missing is None and time.perf_counter() - start > args.async_budget_s:
        print(f"async vLLM server run skipped: the runs above took over {args.async_budget_s:.0f} s", flush=True)
    else:
        results += run_async_server_check(args, device)
    print(f"total wall time: {time.perf_counter() - start:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
