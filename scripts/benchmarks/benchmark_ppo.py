"""PPO-mode speed and memory: trl-trapo's `PPOTrainer` next to TRL 1.12's, on the same tiny models and config.

Each implementation runs in its own fresh interpreter (TRL 1.12 with ``--trl-path`` first on ``sys.path``; install it
beside the venv with ``.venv/bin/pip install --no-deps --target /work/trl112 trl==1.12.0``), with
``torch.set_num_threads(1)``, on models built once from seeded configs and saved to a temporary folder. Both get the
same constructor call (only the import differs) and the same `PPOConfig` values; sampling is real (no injected
rollouts). Per rollout batch ("update": generate, score, ``num_ppo_epochs`` x ``num_mini_batches`` optimizer steps)
the wall time is taken at ``on_step_end`` (1.12 calls it once per update, we once per optimizer step); the table gives
the median over the updates after the first (warm-up), that median divided by the optimizer steps of an update, and
the process's peak resident memory (``resource.getrusage(...).ru_maxrss``) — in total, and above the RSS measured
after the imports (models, optimizer states, activations, buffers).

Run (from the repository root)::

    .venv/bin/python scripts/benchmarks/benchmark_ppo.py [--trl-path /work/trl112] [--updates 6] [--hidden 128] \
        [--layers 2]

Differences that are part of what is measured: ours clips gradients (``max_grad_norm=1.0``, TRL's default, which
1.12 ignored) and makes one optimizer step per mini-batch; with ``num_mini_batches=1`` (the default here) both make
``num_ppo_epochs`` optimizer steps per update.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "scripts" / "experiments"))  # runlib

from runlib import child_env, config_refusals_as_usage, int_range, peak_rss_mb, positive_int, run_child  # noqa: E402


DEFAULT_TRL_PATH = os.environ.get("TRL112_PATH", "/work/trl112")
IMPLEMENTATIONS = {"trl-trapo": "trl_trapo", "TRL 1.12": "trl.experimental.ppo"}


def current_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def build_assets(folder: Path, ns: argparse.Namespace) -> None:
    """Tokenizer (word-level, [PAD]=0, [EOS]=1, left padding) and four seeded tiny Llama models."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        LlamaConfig,
        PreTrainedTokenizerFast,
    )

    vocab = ["[PAD]", "[EOS]"] + [f"t{i}" for i in range(2, ns.vocab)]
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="t2"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", eos_token="[EOS]", padding_side="left"
    )
    tokenizer.save_pretrained(folder / "tokenizer")
    config = dict(
        vocab_size=ns.vocab,
        hidden_size=ns.hidden,
        intermediate_size=2 * ns.hidden,
        num_hidden_layers=ns.layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    for name, cls, extra, seed in (
        ("policy", AutoModelForCausalLM, {}, 0),
        ("ref", AutoModelForCausalLM, {}, 0),
        ("value", AutoModelForSequenceClassification, {"num_labels": 1}, 1),
        ("reward", AutoModelForSequenceClassification, {"num_labels": 1}, 2),
    ):
        torch.manual_seed(seed)
        cls.from_config(LlamaConfig(**config, **extra)).save_pretrained(folder / name)
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(
            2, ns.vocab, (int(torch.randint(4, 13, (1,), generator=generator)),), generator=generator
        ).tolist()
        for _ in range(ns.batch * ns.accumulation * (ns.updates + 1))
    ]
    (folder / "prompts.json").write_text(json.dumps(prompts))


def ppo_kwargs(ns: argparse.Namespace, output_dir: str) -> dict:
    return dict(
        output_dir=output_dir,
        per_device_train_batch_size=ns.batch,
        gradient_accumulation_steps=ns.accumulation,
        num_mini_batches=ns.mini_batches,
        num_ppo_epochs=ns.epochs,
        total_episodes=ns.batch * ns.accumulation * ns.updates,
        response_length=ns.response_length,
        local_rollout_forward_batch_size=ns.batch * ns.accumulation,
        stop_token="eos",
        temperature=0.7,
        learning_rate=1e-5,
        seed=0,
        bf16=False,
        use_cpu=True,
        activation_checkpointing=False,
        report_to=[],
        save_strategy="no",
        num_sample_generations=0,
        disable_tqdm=True,
        logging_steps=ns.epochs * ns.mini_batches,  # ours: once per update, as 1.12 always logged
    )


def run_worker(implementation: str, folder: Path, ns: argparse.Namespace) -> dict:
    if implementation == "TRL 1.12":
        sys.path.insert(0, ns.trl_path)
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import warnings

    warnings.filterwarnings("ignore")

    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if implementation == "TRL 1.12":
        import trl

        assert trl.__version__ == "1.12.0", trl.__file__
        from trl.experimental.ppo import PPOConfig, PPOTrainer
    else:
        from trl_trapo import PPOConfig, PPOTrainer
    rss_after_imports = current_rss_mb()

    marks: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            marks.append(time.perf_counter())

    tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")
    prompts = json.loads((folder / "prompts.json").read_text())
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = PPOTrainer(
            PPOConfig(**ppo_kwargs(ns, output_dir)),
            tokenizer,
            AutoModelForCausalLM.from_pretrained(folder / "policy"),
            AutoModelForCausalLM.from_pretrained(folder / "ref"),
            AutoModelForSequenceClassification.from_pretrained(folder / "reward", num_labels=1),
            Dataset.from_dict({"input_ids": prompts}),
            AutoModelForSequenceClassification.from_pretrained(folder / "value", num_labels=1),
            callbacks=[StepClock()],
        )
        start = time.perf_counter()
        trainer.train()
    steps_per_update = 1 if implementation == "TRL 1.12" else ns.epochs * ns.mini_batches
    update_ends = [start] + marks[steps_per_update - 1 :: steps_per_update]
    durations = [b - a for a, b in zip(update_ends, update_ends[1:])]
    return {
        "implementation": implementation,
        "updates": len(durations),
        "update_seconds": durations,
        "optimizer_steps_per_update": ns.epochs * (1 if implementation == "TRL 1.12" else ns.mini_batches),
        "peak_rss_mb": peak_rss_mb(),
        "rss_after_imports_mb": rss_after_imports,
    }


MAX_PROMPT = 12  # prompt tokens at most (build_assets), within the models' 128 positions


def make_parser() -> argparse.ArgumentParser:
    """The benchmark's command line (numbers refused outside their range: `runlib.NumberRange`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-path", default=DEFAULT_TRL_PATH, help="folder holding TRL 1.12.0 (pip --target)")
    parser.add_argument("--updates", type=positive_int, default=6, help="rollout batches (the first is warm-up)")
    parser.add_argument("--batch", type=positive_int, default=8, help="per_device_train_batch_size")
    parser.add_argument("--accumulation", type=positive_int, default=2, help="gradient_accumulation_steps")
    parser.add_argument(
        "--mini-batches", type=positive_int, default=1, help="num_mini_batches (must divide --accumulation)"
    )
    parser.add_argument("--epochs", type=positive_int, default=4, help="num_ppo_epochs")
    parser.add_argument(
        "--response-length", type=int_range(1, 128 - MAX_PROMPT), default=32, help=f"at most {128 - MAX_PROMPT}"
    )
    parser.add_argument("--hidden", type=positive_int, default=128, help="hidden size (a multiple of 4 heads)")
    parser.add_argument("--layers", type=positive_int, default=2)
    parser.add_argument("--vocab", type=int_range(3), default=256, help="vocabulary (>= 3: pad, EOS, a word)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--assets", default=None, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    parser = make_parser()
    ns = parser.parse_args()
    if ns.accumulation % ns.mini_batches:
        parser.error(
            f"argument --mini-batches: {ns.mini_batches} is invalid: use a divisor of --accumulation="
            f"{ns.accumulation} (each mini-batch is whole micro-batches)."
        )
    if ns.hidden % 4:
        parser.error(f"argument --hidden: {ns.hidden} is invalid: use a multiple of 4 (the models' attention heads).")

    if ns.worker:
        result = run_worker(ns.worker, Path(ns.assets), ns)
        print("RESULT " + json.dumps(result))
        return

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        from trl_trapo import PPOConfig

        flags = {"per_device_train_batch_size": "--batch", "gradient_accumulation_steps": "--accumulation",
                 "num_mini_batches": "--mini-batches", "num_ppo_epochs": "--epochs",
                 "response_length": "--response-length"}  # fmt: skip
        with config_refusals_as_usage(parser, flags):  # the workers' settings, checked before anything runs
            PPOConfig(**ppo_kwargs(ns, str(folder / "check")))
        build_assets(folder, ns)
        passthrough = sys.argv[1:]
        env = child_env(1)
        for index, implementation in enumerate(IMPLEMENTATIONS):
            print(f"[benchmark_ppo] running {implementation} ...", flush=True)
            command = [sys.executable, os.path.abspath(__file__), *passthrough, "--worker", implementation]
            run = run_child(
                [*command, "--assets", str(folder)],
                log_path=folder / f"worker{index}.log",
                env=env,
                cwd=os.getcwd(),
                check=False,
            )
            log = Path(run.log_path).read_text(encoding="utf-8", errors="replace")
            line = next((x for x in log.splitlines() if x.startswith("RESULT ")), None)
            if run.returncode != 0 or line is None:
                print(log[-6000:])
                raise SystemExit(f"{implementation} failed (exit code {run.returncode})")
            results.append(json.loads(line[len("RESULT ") :]))

    print(
        f"\nPPO, {ns.updates} rollout batches of {ns.batch * ns.accumulation} prompts x {ns.response_length} tokens, "
        f"{ns.epochs} PPO epochs, {ns.mini_batches} mini-batch(es); Llama hidden={ns.hidden} layers={ns.layers} "
        f"vocab={ns.vocab}; fp32, CPU, 1 thread; median over updates 2..{ns.updates}\n"
    )
    header = ("implementation", "s / update", "s / optimizer step", "peak RSS (MB)", "above imports (MB)")
    rows = []
    for r in results:
        median = statistics.median(r["update_seconds"][1:] or r["update_seconds"])
        rows.append(
            (
                r["implementation"],
                f"{median:.3f}",
                f"{median / r['optimizer_steps_per_update']:.3f}",
                f"{r['peak_rss_mb']:.0f}",
                f"{r['peak_rss_mb'] - r['rss_after_imports_mb']:.0f}",
            )
        )
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(str(x).ljust(w) for x, w in zip(row, widths)))


if __name__ == "__main__":
    main()
