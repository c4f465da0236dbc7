"""Shared helpers for the TRL 1.12 PPO bug-class probes in this folder.

Each probe runs the REAL TRL 1.12.0 ``trl.experimental.ppo.PPOTrainer`` (installed beside the venv with
``.venv/bin/pip install --no-deps --target /work/trl112 trl==1.12.0``; override the folder with ``$TRL112_PATH``) on
tiny seeded Llama models and a word-level tokenizer built in-process. Rollouts are injected: the module-level
``batch_generation`` of 1.12 is replaced by a function returning fixed responses (row ``i`` of the rollout batch gets
``responses[i]``) with temperature-warped policy logits, exactly as ``dev/ppo_1_12/make_ppo_fixtures.py`` does.
Tensors are observed (never changed) by wrapping ``get_reward`` and ``PPOTrainer.log`` (which reads ``train()``'s
locals).

Import this module first: it puts TRL 1.12 at the front of ``sys.path``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings


TRL_PATH = os.environ.get("TRL112_PATH", "/work/trl112")
if TRL_PATH not in sys.path:
    sys.path.insert(0, TRL_PATH)
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402


torch.set_num_threads(1)

import trl  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402


hf_logging.set_verbosity_error()
assert trl.__version__ == "1.12.0", f"expected TRL 1.12.0 first on sys.path, got {trl.__version__} ({trl.__file__})"

import trl.experimental.ppo.ppo_trainer as ppo_mod  # noqa: E402
from trl.experimental.ppo import PPOConfig, PPOTrainer  # noqa: E402


PAD_ID, EOS_ID = 0, 1
VOCAB = ["[PAD]", "[EOS]"] + [f"t{i}" for i in range(2, 32)]
E, P = EOS_ID, PAD_ID
PROMPTS = [[4, 7, 10], [12], [20, 21, 22, 23, 24], [5, 6], [9, 8, 7, 6], [30], [2, 3], [11, 13, 15]]

_BASE_PROBE_CFG = {
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 2,
    "num_mini_batches": 1,
    "num_ppo_epochs": 1,
    "total_episodes": 4,
    "response_length": 6,
    "stop_token": "eos",
    "learning_rate": 1e-3,
    "bf16": False,
    "num_sample_generations": 0,
    "report_to": [],
    "save_strategy": "no",
    "disable_tqdm": True,
    "use_cpu": True,
    "logging_steps": 1,
}


def make_tokenizer(pad_token: str = "[PAD]", padding_side: str = "left"):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(VOCAB)}, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=pad_token, eos_token="[EOS]", padding_side=padding_side
    )


def _config(num_labels: int | None = None, pad_token_id: int = PAD_ID):
    from transformers import LlamaConfig

    kw = {} if num_labels is None else {"num_labels": num_labels}
    return LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        initializer_range=0.3,
        tie_word_embeddings=False,
        pad_token_id=pad_token_id,
        eos_token_id=EOS_ID,
        bos_token_id=None,
        **kw,
    )


def make_models(seed: int = 0, pad_token_id: int = PAD_ID) -> dict:
    """policy, ref (= policy + small noise), value, reward; all seeded."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    torch.manual_seed(seed)
    policy = AutoModelForCausalLM.from_config(_config(pad_token_id=pad_token_id))
    ref = AutoModelForCausalLM.from_config(_config(pad_token_id=pad_token_id))
    with torch.no_grad():
        for p_ref, p_pol in zip(ref.parameters(), policy.parameters()):
            p_ref.copy_(p_pol + 0.05 * torch.randn_like(p_pol))
    value = AutoModelForSequenceClassification.from_config(_config(1, pad_token_id))
    reward = AutoModelForSequenceClassification.from_config(_config(1, pad_token_id))
    return {"policy": policy, "ref": ref, "value": value, "reward": reward}


def inject_responses(responses: list[list[int]]) -> None:
    """Replace 1.12's module-level ``batch_generation`` with one returning ``responses`` (row i -> responses[i])."""

    def fake_batch_generation(model, queries, local_rollout_forward_batch_size, pad_token_id, generation_config):
        context_length = queries.shape[1]
        resp = torch.tensor(responses[: queries.shape[0]], dtype=queries.dtype, device=queries.device)
        query_responses = torch.cat((queries, resp), 1)
        with torch.no_grad():
            logits = ppo_mod.forward(model, query_responses, pad_token_id).logits[:, context_length - 1 : -1]
        return query_responses, logits / generation_config.temperature

    ppo_mod.batch_generation = fake_batch_generation


ROLLOUT_KEYS = [
    "queries", "context_length", "query_responses", "responses", "postprocessed_responses", "logprobs",
    "ref_logprobs", "values", "scores", "contain_eos_token", "sequence_lengths", "padding_mask", "padding_mask_p1",
    "kl", "non_score_reward", "actual_end", "rewards", "advantages", "returns",
]  # fmt: skip


def run_ppo(
    responses,
    *,
    tokenizer=None,
    models=None,
    prompts=None,
    ref_model="given",
    peft_config=None,
    output_dir=None,
    **cfg,
):
    """Build a 1.12 PPOTrainer with injected rollouts, train one update, return (trainer, captured dict).

    ``captured`` holds train()'s rollout locals at logging time (``ROLLOUT_KEYS``), the logged metrics, and
    ``scores_raw`` / ``score_token_index`` from the reward-model ``get_reward`` call (before ``missing_eos_penalty``).
    ``ref_model``: "given" passes ``models["ref"]``; None passes None.
    """
    from datasets import Dataset

    tokenizer = tokenizer if tokenizer is not None else make_tokenizer()
    models = models if models is not None else make_models()
    prompts = prompts if prompts is not None else PROMPTS
    inject_responses(responses)
    captured: dict = {"get_reward": []}
    orig_get_reward = ppo_mod.get_reward

    def get_reward_spy(model, query_responses, pad_token_id, context_length):
        out = orig_get_reward(model, query_responses, pad_token_id, context_length)
        if model is models["reward"]:
            captured["scores_raw"] = out[1].detach().clone()
            captured["score_token_index"] = out[2].detach().clone()
        return out

    ppo_mod.get_reward = get_reward_spy
    tmp = None
    if output_dir is None:
        tmp = tempfile.TemporaryDirectory()
        output_dir = tmp.name
    try:
        args = PPOConfig(output_dir=output_dir, **{**_BASE_PROBE_CFG, **cfg})
        ref = models["ref"] if ref_model == "given" else None
        trainer = PPOTrainer(
            args, tokenizer, models["policy"], ref, models["reward"], Dataset.from_dict({"input_ids": prompts}),
            models["value"], peft_config=peft_config,
        )  # fmt: skip
        orig_log = trainer.log

        def log_spy(logs, *a, **kw):
            f = sys._getframe(1).f_locals
            for k in ROLLOUT_KEYS:
                captured[k] = f[k].clone() if isinstance(f[k], torch.Tensor) else f[k]
            captured["metrics"] = dict(logs)
            return orig_log(logs, *a, **kw)

        trainer.log = log_spy
        trainer.train()
    finally:
        ppo_mod.get_reward = orig_get_reward
        if tmp is not None:
            tmp.cleanup()
    return trainer, captured


def verdict(probe: str, has_bug: bool, summary: str) -> None:
    print(f"VERDICT ({probe}): {'BUG PRESENT in TRL 1.12' if has_bug else 'no bug in TRL 1.12'} -- {summary}")
