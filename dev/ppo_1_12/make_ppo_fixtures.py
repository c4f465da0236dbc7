"""Generate golden PPO fixtures from the REAL TRL 1.12 ``PPOTrainer`` (``trl.experimental.ppo``).

TRL removed ``PPOTrainer`` in 1.13; trl-trapo ships a drop-in replacement and these fixtures are its golden reference.
Every number in ``tests/fixtures/ppo_1_12/`` was produced by running TRL 1.12.0's own code (nothing is re-derived or
copied from its source); the script only *observes* tensors by wrapping module-level helpers / instance methods.

Regenerate (from the repository root; TRL 1.12 is installed beside, not into, the venv)::

    .venv/bin/pip install --no-deps --target /work/trl112 trl==1.12.0
    .venv/bin/python dev/ppo_1_12/make_ppo_fixtures.py --trl-path /work/trl112

``--trl-path`` (default: ``$TRL112_PATH`` or ``/work/trl112``) is put first on ``sys.path`` in a fresh subprocess per
case, so ``import trl`` resolves to 1.12.0 (asserted) while transformers / torch / accelerate / peft come from the venv
(generated with transformers 5.24.0, torch 2.13.0+cpu, accelerate 1.15.0, fp32, CPU, ``torch.set_num_threads(1)``).
Re-running gives byte-identical files.

What is injected, and why:

* Generation. ``ppo_trainer.batch_generation`` (the module-level function ``train()`` calls for rollouts) is replaced
  by a function returning predetermined responses (``RESPONSES`` below; row ``i`` of the rollout batch gets
  ``RESPONSES[i]``) so the fixture covers the edge cases sampling would only hit by chance: EOS mid-way followed by
  pads, EOS mid-way followed by non-pad tokens (incl. a second EOS), EOS as first / second-to-last / last token, no
  EOS, and a PAD token in the middle of a response. The logits it returns are what
  ``generate(..., output_scores=True)`` would return for those tokens: the policy's forward logits (via 1.12's own
  module-level ``forward`` helper) at the positions predicting each response token, divided by
  ``generation_config.temperature`` (= ``temperature + 1e-7``), i.e. the temperature-warped scores (``top_k=0`` and
  ``top_p=1.0`` add no other processor). The first PPO epoch sees ratio == 1 exactly (real sampling: up to fp noise).
* Minibatch shuffling. 1.12 never seeds numpy (``PPOTrainer.__init__`` does not run ``Trainer.__init__``), so the
  worker seeds ``np.random`` (``NUMPY_SEED``) before ``train()`` and records every ``np.random.permutation`` result.
* Nothing else: tiny models (Llama, 1 layer, hidden 16) are built from seeded configs, saved with ``save_pretrained``
  under ``models/`` and reloaded from there, and the tokenizer is a word-level ``tokenizers`` tokenizer (``[PAD]``=0,
  ``[EOS]``=1, left padding) saved under ``tokenizer/``.

Cases: ``kl_estimator`` in {k1, k3} x ``whiten_rewards`` in {False, True} x ``missing_eos_penalty`` in {None, 1.0}
(files ``<k1|k3>_<nowhiten|whiten>_<nopenalty|penalty>.json``), plus ``k1_nowhiten_penalty_single_batch_dataset``
whose dataset is exactly one batch, so accelerate's ``end_of_dataloader`` forces an optimizer step at every
micro-batch (in the grid the dataset holds two batches and gradients accumulate over ``gradient_accumulation_steps``
micro-batches, across minibatch boundaries). Each case writes ``cases/<name>.json`` (schema in ``index.json``) and
``cases/<name>.final.safetensors`` (post-training ``policy.*`` and ``value_model.*`` weights).

Exact grid (``exact_<k1|k3>_<nowhiten|whiten>_<nopenalty|penalty>``): the same models and 2 x 2 x 2 settings, but
restricted to where 1.12 is bug-free, so that exact reproduction is meaningful (``tests/test_ppo_golden.py``):

* injected responses (``EXACT_RESPONSES``) are only of the two kinds 1.12 handles correctly — no EOS at all, or EOS
  as the LAST response token — and contain no PAD token, so no score lands on a pad after the EOS (bug c), no pad is
  treated as the end of a response, and masks from lengths and masks from pad ids agree;
* ``num_mini_batches=1``, so 1.12's gradient accumulation (``gradient_accumulation_steps`` micro-batches) is exactly
  one mini-batch and it makes one optimizer step per PPO epoch (with several mini-batches 1.12 accumulated across
  mini-batch boundaries);
* the dataset holds two rollout batches but ``total_episodes`` is one batch, so accelerate's ``end_of_dataloader``
  never forces a step at every micro-batch; fp32 throughout.

Each exact case also writes ``cases/<name>.steps.safetensors`` (``step<k>.policy.*`` / ``step<k>.value_model.*``:
the weights right after the k-th real optimizer step, k = 1, 2; ``step<k>.grad.*``: the accumulated gradient that
step applied) and records the optimizer's class and settings and the learning rate of every step. Regenerate only this grid with::

    .venv/bin/python dev/ppo_1_12/make_ppo_fixtures.py --trl-path /work/trl112 --only \\
        exact_k1_nowhiten_nopenalty exact_k1_nowhiten_penalty exact_k1_whiten_nopenalty exact_k1_whiten_penalty \\
        exact_k3_nowhiten_nopenalty exact_k3_nowhiten_penalty exact_k3_whiten_nopenalty exact_k3_whiten_penalty

(``--only`` still rebuilds ``models/``, ``tokenizer/`` and ``index.json``, byte-identically.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "ppo_1_12"
DEFAULT_TRL_PATH = os.environ.get("TRL112_PATH", "/work/trl112")
TRL_VERSION = "1.12.0"

PAD_ID, EOS_ID = 0, 1
VOCAB = ["[PAD]", "[EOS]"] + [f"t{i}" for i in range(2, 32)]
RESPONSE_LENGTH = 6
NUMPY_SEED = 1234

# Prompts (unpadded token ids, lengths 1..5) — the collator left-pads them per batch.
PROMPTS = [[2 + (7 * i + 3 * j) % 30 for j in range(1 + (i * 3) % 5)] for i in range(32)]

E, P = EOS_ID, PAD_ID
# Row i of the (shuffled) rollout batch receives RESPONSES[i]; the comment says which edge case it is.
RESPONSES = [
    [5, 9, E, P, P, P],  # EOS mid-way, then pads (what HF generate emits)
    [7, 3, 11, 4, 8, 6],  # no EOS at all
    [12, E, 14, 2, 20, 9],  # EOS mid-way, then non-pad tokens (truncation pads them in postprocessed_responses)
    [3, 3, 7, 21, 30, E],  # EOS as the last token
    [8, 17, 5, 2, E, P],  # EOS second-to-last (score index = last position)
    [E, P, P, P, P, P],  # EOS as the first token
    [6, E, 13, E, 4, 4],  # two EOS tokens (the second lies after truncation)
    [9, P, 10, 11, 12, 13],  # a PAD token mid-way, no EOS
    [4, 25, 18, E, P, P],
    [31, 30, 29, 28, 27, 26],  # no EOS
    [2, 16, 22, 9, 5, E],
    [19, E, P, P, P, P],
    [10, 10, 10, E, 3, 7],
    [24, 6, 15, 27, 8, 2],  # no EOS
    [13, 26, 4, E, P, P],
    [23, 7, 14, 3, E, P],
]

# Exact grid: only the two kinds of response 1.12 handles correctly, and no PAD token anywhere.
EXACT_RESPONSES = [
    [5, 9, 14, 22, 3, E],  # EOS as the last token
    [7, 3, 11, 4, 8, 6],  # no EOS
    [12, 30, 14, 2, 20, E],
    [3, 3, 7, 21, 30, 9],
    [8, 17, 5, 2, 26, E],
    [31, 30, 29, 28, 27, 26],
    [6, 19, 13, 25, 4, E],
    [9, 2, 10, 11, 12, 13],
    [4, 25, 18, 16, 15, E],
    [24, 6, 15, 27, 8, 2],
    [2, 16, 22, 9, 5, E],
    [19, 19, 23, 17, 11, 28],
    [10, 10, 10, 29, 3, E],
    [13, 26, 4, 7, 22, 5],
    [23, 7, 14, 3, 18, E],
    [20, 2, 31, 12, 6, 16],
]

REF_NOISE = 0.05  # std of the seeded noise added to the policy weights to make the reference model
MODEL_SPECS = {  # name -> (class, init seed)
    "policy": ("causal", 11),
    "ref": ("causal", 12),
    "value": ("seqcls", 13),
    "reward": ("seqcls", 14),
}

BASE_ARGS = {
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 4,
    "num_mini_batches": 2,
    "num_ppo_epochs": 2,
    "total_episodes": 16,
    "response_length": RESPONSE_LENGTH,
    "local_rollout_forward_batch_size": 8,
    "stop_token": "eos",
    "temperature": 0.7,
    "kl_coef": 0.05,
    "cliprange": 0.2,
    "vf_coef": 0.1,
    "cliprange_value": 0.2,
    "gamma": 1.0,
    "lam": 0.95,
    "learning_rate": 0.005,
    "seed": 42,
    "bf16": False,
    "num_sample_generations": 0,
}


def case_grid() -> dict[str, dict]:
    cases = {}
    for kl in ("k1", "k3"):
        for whiten in (False, True):
            for penalty in (None, 1.0):
                name = f"{kl}_{'whiten' if whiten else 'nowhiten'}_{'penalty' if penalty else 'nopenalty'}"
                cases[name] = {
                    "args": {
                        **BASE_ARGS,
                        "kl_estimator": kl,
                        "whiten_rewards": whiten,
                        "missing_eos_penalty": penalty,
                    },
                    "num_prompts": 32,
                }
    cases["k1_nowhiten_penalty_single_batch_dataset"] = {
        "args": {**BASE_ARGS, "kl_estimator": "k1", "whiten_rewards": False, "missing_eos_penalty": 1.0},
        "num_prompts": 16,
    }
    for kl in ("k1", "k3"):
        for whiten in (False, True):
            for penalty in (None, 1.0):
                name = f"exact_{kl}_{'whiten' if whiten else 'nowhiten'}_{'penalty' if penalty else 'nopenalty'}"
                cases[name] = {
                    "args": {
                        **BASE_ARGS,
                        "num_mini_batches": 1,
                        "kl_estimator": kl,
                        "whiten_rewards": whiten,
                        "missing_eos_penalty": penalty,
                    },
                    "num_prompts": 32,  # two rollout batches; total_episodes = one
                    "responses": "exact",
                }
    return cases


SCHEMA = {
    "trl_version": "str, always '1.12.0'",
    "case": "str, the case name (= file stem)",
    "ppo_config": "dict: the PPOConfig kwargs given (others default; plus output_dir/report_to/save_strategy/...)",
    "derived_args": "dict: batch sizes PPOTrainer wrote back into args (world_size, local_batch_size, ...)",
    "numpy_seed": "int: np.random.seed() called right before trainer.train()",
    "tokenizer": "dict: pad_token_id, eos_token_id, padding_side, vocab (list, index = id)",
    "models": "dict: role -> folder under models/ (save_pretrained), reloaded with from_pretrained",
    "dataset_prompts": "list[list[int]]: train_dataset input_ids (unpadded)",
    "injected_responses": "list[list[int]]: RESPONSES, row i of the rollout batch gets row i",
    "rollout": {
        "queries": "[B][Lq] int, left-padded with pad_token_id, in rollout-batch order",
        "context_length": "int Lq",
        "query_responses": "[B][Lq+R] int, untruncated (used for values and training forwards)",
        "responses": "[B][R] int, untruncated",
        "postprocessed_responses": "[B][R] int, truncated after first stop token (rest = pad)",
        "logprobs": "[B][R] float, rollout logprobs, padding_mask positions = 1.0 (INVALID_LOGPROB)",
        "ref_logprobs": "[B][R] float, same masking",
        "values": "[B][R] float, value of the state before each response token, padding_mask_p1 positions = 0",
        "scores_raw": "[B] float, reward model score before missing_eos_penalty",
        "score_token_index": "[B] int, index into query_responses where get_reward read the score",
        "scores": "[B] float, after missing_eos_penalty",
        "contain_eos_token": "[B] bool (tokenizer eos in postprocessed_responses)",
        "sequence_lengths": "[B] int, index of the last non-pad token of postprocessed_responses",
        "padding_mask": "[B][R] bool, idx > sequence_lengths",
        "padding_mask_p1": "[B][R] bool, idx > sequence_lengths + 1",
        "kl": "[B][R] float, per-token KL estimate (k1 or k3)",
        "non_score_reward": "[B][R] float, -kl_coef * kl",
        "score_reward_index": "[B] int, response index where the score was added (actual_end)",
        "rewards_before_whiten": "[B][R] float",
        "rewards": "[B][R] float, after optional whitening (what GAE used)",
        "advantages_unwhitened": "[B][R] float, raw GAE advantages",
        "returns": "[B][R] float, advantages_unwhitened + values",
        "advantages": "[B][R] float, whitened over ~padding_mask then zeroed at padding_mask",
    },
    "masked_whiten_calls": "list of {shift_mean, mask, input, output} for every masked_whiten call, in order",
    "permutations": "list[list[int]]: np.random.permutation(local_batch_size) per PPO epoch",
    "micro_batches": (
        "list in execution order of {ppo_epoch, mini_batch, grad_accum_idx, indices, loss, pg_loss, vf_loss, "
        "vf_clipfrac, pg_clipfrac, approxkl, entropy (mean), ratio (mean), ratio_tokens, new_logprobs, vpred, "
        "vpredclipped, optimizer_stepped (bool: the inner torch optimizer really stepped after this micro-batch)}"
    ),
    "stats": "dict name -> [num_ppo_epochs][num_mini_batches][gradient_accumulation_steps] float (unused slots = 0)",
    "metrics": "dict: the logged metrics of the update (eps is wall-clock based -> stored as null)",
    "log_history": "list: trainer.state.log_history (eps nulled)",
    "episode": "int: trainer.state.episode after train()",
    "final_weights": "str: safetensors file with policy.<name> / value_model.<name> tensors after train()",
    "exact_only": {
        "step_weights": (
            "str: safetensors file with step<k>.policy.<name> / step<k>.value_model.<name> (weights after step k) and "
            "step<k>.grad.policy.<name> / step<k>.grad.value_model.<name> (the accumulated gradient step k applied)"
        ),
        "step_lrs": "list[float]: learning rate of each real optimizer step (param_groups[0]['lr'])",
        "optimizer": "dict: inner torch optimizer's class, defaults (lr, betas, eps, fused, ...) and param_groups",
    },
}


# ---------------------------------------------------------------------------------------------------------------------
# helpers shared by the orchestrator and the worker (imports are local: the worker must set sys.path first)
# ---------------------------------------------------------------------------------------------------------------------
def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(VOCAB)}, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", eos_token="[EOS]", padding_side="left")


def model_config(kind: str):
    from transformers import LlamaConfig

    kwargs = {
        "vocab_size": len(VOCAB),
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 32,
        "initializer_range": 0.3,
        "tie_word_embeddings": False,
        "pad_token_id": PAD_ID,
        "eos_token_id": EOS_ID,
        "bos_token_id": None,
    }
    if kind == "seqcls":
        kwargs["num_labels"] = 1
    return LlamaConfig(**kwargs)


def build_models(models_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    built = {}
    for name, (kind, seed) in MODEL_SPECS.items():
        torch.manual_seed(seed)
        cls = AutoModelForCausalLM if kind == "causal" else AutoModelForSequenceClassification
        model = cls.from_config(model_config(kind))
        if name == "ref":  # the reference is the policy plus small seeded noise (a nearby SFT checkpoint)
            with torch.no_grad():
                for (_, p_ref), (_, p_pol) in zip(model.named_parameters(), built["policy"].named_parameters()):
                    p_ref.copy_(p_pol + REF_NOISE * torch.randn_like(p_pol))
        built[name] = model
        model.save_pretrained(models_dir / name)


def to_py(x):
    """Tensor/ndarray -> nested python lists with float64 (exact for fp32) / int / bool leaves."""
    import numpy as np
    import torch

    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.is_floating_point():
            x = x.double()
        return x.tolist()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, list | tuple):
        return [to_py(v) for v in x]
    if isinstance(x, float | int | bool) or x is None:
        return x
    raise TypeError(type(x))


# ---------------------------------------------------------------------------------------------------------------------
# worker: runs one case with TRL 1.12
# ---------------------------------------------------------------------------------------------------------------------
def run_case(name: str, spec: dict, out_dir: Path, trl_path: str) -> None:
    sys.path.insert(0, trl_path)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import warnings

    warnings.filterwarnings("ignore")

    import numpy as np
    import torch

    torch.set_num_threads(1)
    import safetensors.torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    assert trl.__version__ == TRL_VERSION, (trl.__version__, trl.__file__)
    import trl.experimental.ppo.ppo_trainer as ppo_mod
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    models_dir = out_dir / "models"
    tokenizer = build_tokenizer()
    policy = AutoModelForCausalLM.from_pretrained(models_dir / "policy")
    ref = AutoModelForCausalLM.from_pretrained(models_dir / "ref")
    value = AutoModelForSequenceClassification.from_pretrained(models_dir / "value")
    reward = AutoModelForSequenceClassification.from_pretrained(models_dir / "reward")
    dataset = Dataset.from_dict({"input_ids": PROMPTS[: spec["num_prompts"]]})
    exact = spec.get("responses") == "exact"
    responses_pool = EXACT_RESPONSES if exact else RESPONSES

    rec: dict = {"get_reward": [], "masked_whiten": [], "permutations": [], "micro_batches": [], "log": []}
    rec["step_weights"], rec["step_lrs"] = {}, []

    # --- injected generation -----------------------------------------------------------------------------------
    def fake_batch_generation(model, queries, local_rollout_forward_batch_size, pad_token_id, generation_config):
        context_length = queries.shape[1]
        responses = torch.tensor(responses_pool[: queries.shape[0]], dtype=queries.dtype, device=queries.device)
        query_responses = torch.cat((queries, responses), 1)
        with torch.no_grad():
            logits = ppo_mod.forward(model, query_responses, pad_token_id).logits[:, context_length - 1 : -1]
        return query_responses, logits / generation_config.temperature

    ppo_mod.batch_generation = fake_batch_generation

    # --- observers ---------------------------------------------------------------------------------------------
    orig_get_reward = ppo_mod.get_reward

    def get_reward_spy(model, query_responses, pad_token_id, context_length):
        out = orig_get_reward(model, query_responses, pad_token_id, context_length)
        rec["get_reward"].append({"is_reward_model": model is reward, "score": out[1], "index": out[2]})
        return out

    ppo_mod.get_reward = get_reward_spy

    orig_masked_whiten = ppo_mod.masked_whiten

    def masked_whiten_spy(values, mask, shift_mean=True):
        out = orig_masked_whiten(values, mask, shift_mean=shift_mean)
        rec["masked_whiten"].append({"shift_mean": shift_mean, "mask": mask, "input": values, "output": out})
        return out

    ppo_mod.masked_whiten = masked_whiten_spy

    class _RandomProxy:
        def __getattr__(self, item):
            return getattr(np.random, item)

        @staticmethod
        def permutation(n):
            perm = np.random.permutation(n)
            rec["permutations"].append(perm.tolist())
            return perm

    class _NumpyProxy:
        random = _RandomProxy()

        def __getattr__(self, item):
            return getattr(np, item)

    ppo_mod.np = _NumpyProxy()

    with tempfile.TemporaryDirectory() as tmp:
        args = PPOConfig(
            output_dir=tmp,
            report_to=[],
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            use_cpu=True,
            **spec["args"],
        )
        trainer = PPOTrainer(args, tokenizer, policy, ref, reward, dataset, value)

        orig_backward = trainer.accelerator.backward

        def backward_spy(loss, **kwargs):
            f = sys._getframe(1).f_locals
            rec["micro_batches"].append(
                {
                    "ppo_epoch": f["ppo_epoch_idx"],
                    "mini_batch": f["minibatch_idx"],
                    "grad_accum_idx": f["gradient_accumulation_idx"],
                    "indices": [int(i) for i in f["micro_batch_inds"]],
                    "loss": loss.detach().clone(),
                    "pg_loss": f["pg_loss"].detach().clone(),
                    "vf_loss": f["vf_loss"].detach().clone(),
                    "vf_clipfrac": f["vf_clipfrac"].detach().clone(),
                    "ratio_tokens": f["ratio"].detach().clone(),
                    "new_logprobs": f["new_logprobs"].detach().clone(),
                    "vpred": f["vpred"].detach().clone(),
                    "vpredclipped": f["vpredclipped"].detach().clone(),
                    "optimizer_stepped": False,
                }
            )
            return orig_backward(loss, **kwargs)

        trainer.accelerator.backward = backward_spy

        inner_optimizer = trainer.optimizer.optimizer
        orig_step = inner_optimizer.step

        def step_spy(*a, **kw):
            rec["micro_batches"][-1]["optimizer_stepped"] = True
            rec["step_lrs"].append(float(inner_optimizer.param_groups[0]["lr"]))
            k = len(rec["step_lrs"])
            modules = (("policy", trainer.model.policy), ("value_model", trainer.model.value_model))
            if exact:  # the accumulated gradient this step applies (what AdamW's first moment is built from)
                for prefix, module in modules:
                    for key, param in module.named_parameters():
                        grad = param.grad.detach().clone().contiguous()
                        rec["step_weights"][f"step{k}.grad.{prefix}.{key}"] = grad
            out = orig_step(*a, **kw)
            if exact:
                for prefix, module in modules:
                    for key, value in module.state_dict().items():
                        rec["step_weights"][f"step{k}.{prefix}.{key}"] = value.detach().clone().contiguous()
            return out

        inner_optimizer.step = step_spy

        orig_log = trainer.log

        def log_spy(logs, *a, **kw):
            f = sys._getframe(1).f_locals
            keep = [
                "queries", "context_length", "query_responses", "responses", "postprocessed_responses", "logprobs",
                "ref_logprobs", "values", "scores", "contain_eos_token", "sequence_lengths", "padding_mask",
                "padding_mask_p1", "kl", "non_score_reward", "actual_end", "rewards", "advantages", "returns",
                "approxkl_stats", "pg_clipfrac_stats", "pg_loss_stats", "vf_loss_stats", "vf_clipfrac_stats",
                "entropy_stats", "ratio_stats",
            ]  # fmt: skip
            rec["log"].append({k: (f[k].clone() if isinstance(f[k], torch.Tensor) else f[k]) for k in keep})
            return orig_log(logs, *a, **kw)

        trainer.log = log_spy

        np.random.seed(NUMPY_SEED)
        trainer.train()
        derived = {
            k: getattr(trainer.args, k)
            for k in (
                "world_size", "local_batch_size", "micro_batch_size", "batch_size", "mini_batch_size",
                "local_mini_batch_size", "num_total_batches", "total_episodes",
            )
        }  # fmt: skip
        final = {f"policy.{k}": v.detach().clone().contiguous() for k, v in trainer.model.policy.state_dict().items()}
        final.update(
            {
                f"value_model.{k}": v.detach().clone().contiguous()
                for k, v in trainer.model.value_model.state_dict().items()
            }
        )
        episode = trainer.state.episode
        log_history = [dict(h) for h in trainer.state.log_history]

    assert len(rec["log"]) == 1, "one update expected (total_episodes = one batch)"
    loc = rec["log"][0]
    rm_calls = [c for c in rec["get_reward"] if c["is_reward_model"]]
    whiten_calls = rec["masked_whiten"]
    rewards_before_whiten = whiten_calls[0]["input"] if spec["args"]["whiten_rewards"] else loc["rewards"]
    adv_call = whiten_calls[-1]

    stat_names = {
        "approxkl": "approxkl_stats",
        "pg_clipfrac": "pg_clipfrac_stats",
        "pg_loss": "pg_loss_stats",
        "vf_loss": "vf_loss_stats",
        "vf_clipfrac": "vf_clipfrac_stats",
        "entropy": "entropy_stats",
        "ratio": "ratio_stats",
    }
    micro_batches = []
    for mb in rec["micro_batches"]:
        idx = (mb["ppo_epoch"], mb["mini_batch"], mb["grad_accum_idx"])
        entry = {k: to_py(v) for k, v in mb.items()}
        for key in ("approxkl", "pg_clipfrac", "entropy", "ratio"):
            entry[key] = to_py(loc[stat_names[key]][idx])
        micro_batches.append(entry)

    for h in log_history:
        if "eps" in h:
            h["eps"] = None
    metrics = {k: v for k, v in log_history[-1].items() if k not in ("epoch", "step")}

    ctx = int(loc["context_length"])
    result = {
        "trl_version": trl.__version__,
        "case": name,
        "ppo_config": {
            **spec["args"],
            "output_dir": "<tmp>",
            "report_to": [],
            "save_strategy": "no",
            "logging_steps": 1,
            "disable_tqdm": True,
            "use_cpu": True,
        },
        "derived_args": derived,
        "numpy_seed": NUMPY_SEED,
        "tokenizer": {
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "padding_side": tokenizer.padding_side,
            "vocab": VOCAB,
        },
        "models": {k: f"models/{k}" for k in MODEL_SPECS},
        "dataset_prompts": PROMPTS[: spec["num_prompts"]],
        "injected_responses": responses_pool,
        "rollout": {
            "queries": to_py(loc["queries"]),
            "context_length": ctx,
            "query_responses": to_py(loc["query_responses"]),
            "responses": to_py(loc["responses"]),
            "postprocessed_responses": to_py(loc["postprocessed_responses"]),
            "logprobs": to_py(loc["logprobs"]),
            "ref_logprobs": to_py(loc["ref_logprobs"]),
            "values": to_py(loc["values"]),
            "scores_raw": [v for c in rm_calls for v in to_py(c["score"])],
            "score_token_index": [v for c in rm_calls for v in to_py(c["index"])],
            "scores": to_py(loc["scores"]),
            "contain_eos_token": to_py(loc["contain_eos_token"]),
            "sequence_lengths": to_py(loc["sequence_lengths"]),
            "padding_mask": to_py(loc["padding_mask"]),
            "padding_mask_p1": to_py(loc["padding_mask_p1"]),
            "kl": to_py(loc["kl"]),
            "non_score_reward": to_py(loc["non_score_reward"]),
            "score_reward_index": to_py(loc["actual_end"]),
            "rewards_before_whiten": to_py(rewards_before_whiten),
            "rewards": to_py(loc["rewards"]),
            "advantages_unwhitened": to_py(adv_call["input"]),
            "returns": to_py(loc["returns"]),
            "advantages": to_py(loc["advantages"]),
        },
        "masked_whiten_calls": [{k: to_py(v) for k, v in c.items()} for c in whiten_calls],
        "permutations": rec["permutations"],
        "micro_batches": micro_batches,
        "stats": {k: to_py(loc[v]) for k, v in stat_names.items()},
        "metrics": metrics,
        "log_history": log_history,
        "episode": episode,
        "final_weights": f"cases/{name}.final.safetensors",
    }
    if exact:
        defaults = inner_optimizer.defaults
        result["optimizer"] = {
            "class": type(inner_optimizer).__name__,
            **{k: (list(v) if isinstance(v, tuple) else v) for k, v in defaults.items() if k != "differentiable"},
        }
        result["optimizer"]["param_groups"] = [
            {"num_params": len(g["params"]), "lr": g["lr"], "weight_decay": g["weight_decay"]}
            for g in inner_optimizer.param_groups
        ]
        result["step_lrs"] = rec["step_lrs"]
        result["step_weights"] = f"cases/{name}.steps.safetensors"
    cases_dir = out_dir / "cases"
    cases_dir.mkdir(parents=True, exist_ok=True)
    (cases_dir / f"{name}.json").write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    safetensors.torch.save_file(final, str(cases_dir / f"{name}.final.safetensors"))
    if exact:
        safetensors.torch.save_file(rec["step_weights"], str(cases_dir / f"{name}.steps.safetensors"))


# ---------------------------------------------------------------------------------------------------------------------
# orchestrator
# ---------------------------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-path", default=DEFAULT_TRL_PATH, help="folder holding TRL 1.12.0 (pip --target)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="fixture folder")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="*", default=None, help="regenerate only these case names")
    ns = parser.parse_args()
    out_dir = Path(ns.out)
    cases = case_grid()

    if ns.worker:
        run_case(ns.worker, cases[ns.worker], out_dir, ns.trl_path)
        return

    out_dir.mkdir(parents=True, exist_ok=True)
    # models + tokenizer are built in a subprocess too, with the same sys.path as the workers
    code = (
        f"import sys; sys.path.insert(0, {ns.trl_path!r}); sys.path.insert(0, {str(Path(__file__).parent)!r});"
        "import torch; torch.set_num_threads(1);"
        "import make_ppo_fixtures as m; from pathlib import Path;"
        f"m.build_models(Path({str(out_dir / 'models')!r}));"
        f"m.build_tokenizer().save_pretrained({str(out_dir / 'tokenizer')!r})"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    names = ns.only or list(cases)
    for name in names:
        print(f"[make_ppo_fixtures] {name}", flush=True)
        cmd = [sys.executable, __file__, "--worker", name, "--out", str(out_dir), "--trl-path", ns.trl_path]
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    index = {
        "trl_version": TRL_VERSION,
        "generator": "dev/ppo_1_12/make_ppo_fixtures.py",
        "cases": list(cases),
        "models": {k: {"folder": f"models/{k}", "kind": v[0], "init_seed": v[1]} for k, v in MODEL_SPECS.items()},
        "tokenizer": "tokenizer/",
        "schema": SCHEMA,
    }
    (out_dir / "index.json").write_text(json.dumps(index, indent=1) + "\n")


if __name__ == "__main__":
    main()
