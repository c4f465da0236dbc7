"""`use_vllm`: the option is validated and wired to TRL's `VLLMGeneration`. vLLM itself needs a GPU and is not
installed here: these tests check the clear error when it is absent, and drive the wiring with a stand-in for
`VLLMGeneration` (what it is given, when weights are synced, that its completions become trajectories whose behaviour
log-probs are the training policy's, and that its own log-probs weight the policy loss through the sampler/trainer
mismatch correction, `vllm_importance_sampling_*`). `scripts/benchmarks/gpu_check.py` runs the real thing on a GPU
machine."""

from __future__ import annotations

import importlib.util
import logging
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import make_tiny_config
from transformers import AutoModelForCausalLM

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.collator import collate_rows
from trl_trapo.sampler_correction import kept_support_logps
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward, make_task_suite


HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def suite():
    return make_task_suite(seed=0, num_pretrain_docs=20, num_sft_per_task=5, num_rl_per_task=10, num_eval_per_task=2)


def config(tmp_path, **overrides) -> TRAPOConfig:
    """2 steps of `TINY_CONFIG` sampled with vLLM; then `overrides`."""
    return make_tiny_config(tmp_path, **{"max_steps": 2, "use_vllm": True, **overrides})


def saved_model(tmp_path):
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, seed=0).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return AutoModelForCausalLM.from_pretrained(tmp_path / "model"), tokenizer


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(vllm_gpu_memory_utilization=0.0), "vllm_gpu_memory_utilization"),
        (dict(vllm_tensor_parallel_size=0), "vllm_tensor_parallel_size"),
        (dict(vllm_max_model_length=10), "max_prompt_length \\+ response_length = 20"),
    ],
)
def test_vllm_settings_are_validated(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(vllm_importance_sampling_mode="sequence"),
            "vllm_importance_sampling_mode='sequence' is invalid.*use one",
        ),
        (
            dict(vllm_importance_sampling_clip_max=0.5),
            "vllm_importance_sampling_clip_max=0.5 is invalid: use a bound >= 1",
        ),
        (
            dict(vllm_importance_sampling_clip_min=2.0),
            "vllm_importance_sampling_clip_min=2.0 is invalid: use a bound in",
        ),
        (
            dict(vllm_importance_sampling_clip_min=1.0, vllm_importance_sampling_clip_max=1.0),
            "clip_min=1.0 is invalid: it must be less than vllm_importance_sampling_clip_max=1.0",
        ),
        (
            dict(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=None),
            "vllm_importance_sampling_clip_max=None is invalid: mode 'token_truncate' truncates",
        ),
        (dict(generation_kwargs={"min_p": 0.05}), "generation_kwargs=\\{'min_p': 0.05\\} is invalid: .* drop min_p"),
    ],
    ids=["mode", "clip_max<1", "clip_min>1", "min>=max", "truncate-unbounded", "min_p"],
)
def test_correction_settings_are_validated(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **overrides)


def test_correction_settings_accepted_where_trl_accepts_them(tmp_path):
    # a truncate mode without bounds is refused only with the correction on (TRL's rule); min_p only with vLLM
    args = config(
        tmp_path,
        vllm_importance_sampling_correction=False,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=None,
    )
    assert args.vllm_importance_sampling_clip_max is None
    assert config(tmp_path, use_vllm=False, generation_kwargs={"min_p": 0.05}).generation_kwargs == {"min_p": 0.05}
    # mask modes may be unbounded on one side or both
    assert config(tmp_path, vllm_importance_sampling_clip_max=None, vllm_importance_sampling_clip_min=0.5)


def test_correction_fields_keep_trl_names_defaults_and_values():
    import dataclasses

    from trl import GRPOConfig

    from trl_trapo.sampler_correction import TRL_MODES

    ours = {f.name: f for f in dataclasses.fields(TRAPOConfig)}
    theirs = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    for name in (
        "vllm_importance_sampling_correction",
        "vllm_importance_sampling_mode",
        "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min",
        "vllm_importance_sampling_cap",
    ):
        assert ours[name].default == theirs[name].default, name
    trl_help = theirs["vllm_importance_sampling_mode"].metadata["help"]
    assert all(f"'{mode}'" in trl_help for mode in TRL_MODES)
    assert "%" not in "".join(ours[name].metadata["help"] for name in ours if "importance_sampling" in name)


def test_trl_deprecated_cap_warns_names_the_replacement_and_sets_it(tmp_path):
    with pytest.warns(FutureWarning, match="use vllm_importance_sampling_clip_max=2.0 instead") as record:
        args = config(tmp_path, vllm_importance_sampling_cap=2.0)
    assert args.vllm_importance_sampling_clip_max == 2.0
    # points at the code that built the config (conftest's make_tiny_config), not into trl_trapo
    assert any(w.filename == make_tiny_config.__code__.co_filename for w in record)
    assert args.importance_sampling_cap is None  # TRAPO's replay cap is another knob, left alone
    with pytest.raises(ValueError, match="vllm_importance_sampling_clip_max=0.5 is invalid"):
        with pytest.warns(FutureWarning):
            config(tmp_path, vllm_importance_sampling_cap=0.5)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed: the missing-package error cannot happen")
def test_use_vllm_without_vllm_is_a_clear_error(tmp_path, suite):
    model, tokenizer = saved_model(tmp_path)
    with pytest.raises(ImportError, match="use_vllm=True needs vLLM"):
        TRAPOTrainer(
            model,
            reward_funcs=exact_match_reward,
            args=config(tmp_path),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
        )


def test_use_vllm_without_rl_data_is_ignored(tmp_path, suite):
    model, tokenizer = saved_model(tmp_path)
    trainer = TRAPOTrainer(model, args=config(tmp_path), sft_dataset=suite.sft, processing_class=tokenizer)
    assert trainer.rollouts.vllm is None


class FakeVLLMGeneration:
    """Stands in for `trl.generation.vllm_generation.VLLMGeneration`: samples from the policy with transformers at the
    temperature / top-k / top-p / `max_completion_length` it holds at each call (the public attributes TRL's reads
    there) and returns, like vLLM's `processed_logprobs`, the log-probs of the sampled tokens under the truncated,
    renormalised distribution (minus `logprob_shift`: a sampler that finds every token exp(shift) times less likely
    than the trainer does). A prompt's images (TRL's `images=`, PIL images per prompt) are processed by its
    `processing_class`'s image processor and passed to the model's `generate` with the prompt, as vLLM's
    `multi_modal_data` would reach its forward. `requests` records `(prompts, num_generations, temperature,
    max_completion_length, images per prompt)` of every call."""

    instances: list = []
    logprob_shift = 0.0

    def __init__(self, model, accelerator, processing_class, **kwargs):
        self.model, self.processing_class, self.kwargs, self.syncs, self.calls = model, processing_class, kwargs, 0, []
        self.temperature, self.max_completion_length = kwargs["temperature"], kwargs["max_completion_length"]
        self.requests: list[tuple] = []
        if kwargs["mode"] == "server":  # what `trl vllm-serve --logprobs-mode raw_logprobs` would report
            self.vllm_client = SimpleNamespace(
                get_server_info=lambda: {"model_config": {"logprobs_mode": "raw_logprobs"}},
                check_server=lambda total_timeout=0.0, retry_interval=2.0: None,  # TRL's: the server answers
            )
        FakeVLLMGeneration.instances.append(self)

    def sync_weights(self):
        self.syncs += 1

    def generate(self, prompts, images, num_generations):
        self.calls.append((len(prompts), num_generations))
        self.requests.append(
            (
                [list(p) for p in prompts],
                num_generations,
                self.temperature,
                self.max_completion_length,
                [0 if i is None else len(i) for i in images] if images is not None else None,
            )
        )
        completions, logprobs = [], []
        for k, ids in enumerate(prompts):
            extra = {}
            if images is not None and images[k] is not None:
                processed = self.processing_class.image_processor(images=images[k], return_tensors="pt")
                extra["pixel_values"] = processed["pixel_values"].to(self.model.dtype)
            out = self.model.generate(
                torch.tensor([ids]),
                do_sample=True,
                max_new_tokens=self.max_completion_length,
                temperature=self.temperature,
                top_k=self.kwargs["top_k"],
                top_p=self.kwargs["top_p"],
                output_scores=True,  # the processed (temperature, top-k, top-p) scores
                return_dict_in_generate=True,
                **extra,
            )
            new = out.sequences[0, len(ids) :]
            scores = torch.stack(out.scores)[:, 0]  # (C, V), -inf outside the kept support
            logps = torch.log_softmax(scores.float(), -1).gather(-1, new[:, None]).squeeze(-1) - self.logprob_shift
            completions.append(new.tolist())
            logprobs.append([[lp] for lp in logps.tolist()])  # (C, 1): vLLM's layout with logprobs=0
        return prompts, completions, logprobs, None


def fake_vllm_trainer(tmp_path, suite, monkeypatch, **overrides):
    import trl.generation.vllm_generation as vllm_generation

    import trl_trapo.rollout as vllm_rollouts

    monkeypatch.setattr(vllm_rollouts, "is_vllm_available", lambda: True)
    monkeypatch.setattr(vllm_generation, "VLLMGeneration", FakeVLLMGeneration)
    FakeVLLMGeneration.instances.clear()
    model, tokenizer = saved_model(tmp_path)
    trainer = TRAPOTrainer(
        model,
        reward_funcs=exact_match_reward,
        args=config(tmp_path, **overrides),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
    )
    return trainer, tokenizer


def test_vllm_wiring_with_a_stand_in(tmp_path, suite, monkeypatch):
    trainer, tokenizer = fake_vllm_trainer(
        tmp_path, suite, monkeypatch, vllm_gpu_memory_utilization=0.4, temperature=0.9, top_k=5
    )
    (fake,) = FakeVLLMGeneration.instances
    assert fake.model is trainer.model
    assert fake.kwargs["mode"] == "colocate"
    assert fake.kwargs["gpu_memory_utilization"] == 0.4
    assert fake.kwargs["max_completion_length"] == 4 and fake.kwargs["max_model_length"] == 16 + 4
    assert (fake.kwargs["temperature"], fake.kwargs["top_k"]) == (0.9, 5)
    assert fake.kwargs["logprobs"] == 0  # the sampled token's log-prob, for the mismatch correction

    trainer.collect_rollouts(8, step=0)
    trainer.collect_rollouts(8, step=0)
    assert fake.syncs == 1  # weights pushed once per optimizer step
    trainer.collect_rollouts(8, step=1)
    assert fake.syncs == 2
    assert fake.calls[0] == (8, 4)  # 2 prompts x 4 generations, grouped
    # vLLM's completions became trajectories; behaviour log-probs are the training policy's (first-use ratio 1)
    rows = [t.to_row() for t in trainer.replay.sample(8, step=1)]
    batch = collate_rows(rows, tokenizer.pad_token_id)
    with torch.no_grad():
        logits = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logps = torch.log_softmax(logits[:, :-1] / 0.9, -1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    mask = batch["mask"].bool()
    torch.testing.assert_close(logps[mask], batch["old_per_token_logps"][mask], atol=1e-4, rtol=0)
    # the mismatch log-ratio is taken over vLLM's top-k support: ~0 with the same model, although the full-vocabulary
    # log-probs are far below vLLM's renormalised ones (log of the kept mass, TRL #6789)
    torch.testing.assert_close(batch["sampler_log_ratio"][mask], torch.zeros(int(mask.sum())), atol=1e-4, rtol=0)
    kept = kept_support_logps(logits[:, :-1] / 0.9, batch["input_ids"][:, 1:], top_k=5)
    assert float((batch["old_per_token_logps"] - kept)[mask].mean()) < -0.5  # log of the kept mass
    metrics = trainer.metrics.collect(trainer.accelerator, 0.0)
    assert metrics["sampling/raw_importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-3)  # sequence_mask
    assert metrics["sampling/importance_sampling_ratio/masked_frac"] == 0.0
    assert metrics["sampling/sampling_logp_difference/max"] < 1e-4


def test_vllm_correction_weights_the_policy_loss_and_is_logged(tmp_path, suite, monkeypatch):
    """A sampler that finds every token exp(0.3) = 1.35 times less likely than the trainer: token ratios 1.35, clipped
    to 1.2 by token_truncate; the RL term gets weight 1.2 on every counted token, and the logs say so."""
    import trl_trapo.objectives as objectives

    monkeypatch.setattr(FakeVLLMGeneration, "logprob_shift", 0.3)
    seen = []

    def recording_rl_term(*args, **kwargs):
        seen.append((kwargs["sampling_weights"], args[3]))  # (weights, mask)
        return rl_term(*args, **kwargs)

    rl_term = objectives.rl_term
    monkeypatch.setattr(objectives, "rl_term", recording_rl_term)
    trainer, _ = fake_vllm_trainer(
        tmp_path,
        suite,
        monkeypatch,
        max_steps=1,
        logging_steps=1,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=1.2,
    )
    trainer.train()
    assert seen
    for weights, mask in seen:
        counted = mask.bool()
        assert bool(counted.any())
        torch.testing.assert_close(weights[counted], torch.full((int(counted.sum()),), 1.2), atol=1e-5, rtol=0)
    logged = next(entry for entry in trainer.state.log_history if "sampling/importance_sampling_ratio/mean" in entry)
    assert logged["sampling/raw_importance_sampling_ratio/mean"] == pytest.approx(math.exp(0.3), abs=1e-3)
    assert logged["sampling/importance_sampling_ratio/max"] == pytest.approx(1.2)
    assert logged["sampling/importance_sampling_ratio/clipped_frac"] == 1.0
    assert logged["sampling/sampling_logp_difference/mean"] == pytest.approx(0.3, abs=1e-3)


def test_a_server_whose_logprobs_are_not_the_processed_ones_is_warned_about(tmp_path, suite, monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_trapo.rollout"):
        fake_vllm_trainer(tmp_path, suite, monkeypatch, vllm_mode="server")
    assert "`--logprobs-mode raw_logprobs`" in caplog.text and "processed_logprobs" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo.rollout"):
        fake_vllm_trainer(tmp_path, suite, monkeypatch, vllm_mode="server", vllm_importance_sampling_correction=False)
    assert "logprobs-mode" not in caplog.text


def test_vllm_correction_off_ignores_the_sampler_logps(tmp_path, suite, monkeypatch):
    monkeypatch.setattr(FakeVLLMGeneration, "logprob_shift", 0.3)
    trainer, tokenizer = fake_vllm_trainer(tmp_path, suite, monkeypatch, vllm_importance_sampling_correction=False)
    trainer.collect_rollouts(8, step=0)
    batch = collate_rows([t.to_row() for t in trainer.replay.sample(8, step=0)], tokenizer.pad_token_id)
    assert "sampler_log_ratio" not in batch
    assert not any(k.startswith("sampling/") for k in trainer.metrics.collect(trainer.accelerator, 0.0))


def test_vllm_needs_a_model_that_vllm_can_load(tmp_path, tokenizer, suite, monkeypatch):
    import trl_trapo.rollout as vllm_rollouts

    monkeypatch.setattr(vllm_rollouts, "is_vllm_available", lambda: True)
    with pytest.raises(ValueError, match="save_pretrained"):
        TRAPOTrainer(
            build_tiny_model(tokenizer),  # in memory only: no directory for vLLM to load
            reward_funcs=exact_match_reward,
            args=config(tmp_path),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
        )


def test_guidance_demonstrations_carry_no_mismatch(tmp_path, suite, monkeypatch):
    """A demonstration put in by guidance was not sampled: log-ratio 0 (weight 1), while the sampled completions of
    the same round carry vLLM's mismatch (here 0.3 per token)."""
    monkeypatch.setattr(FakeVLLMGeneration, "logprob_shift", 0.3)
    trainer, _ = fake_vllm_trainer(
        tmp_path, suite, monkeypatch, demonstration_column="demonstration", guidance="always"
    )
    batch = trainer.collect_rollouts(16, step=0)
    guided = [t for t in batch.trajectories if t.off_policy]
    sampled = [t for t in batch.trajectories if not t.off_policy]
    assert guided and sampled
    for t in guided:
        assert bool((t.sampler_log_ratio == 0).all())
    for t in sampled:
        torch.testing.assert_close(t.sampler_log_ratio, torch.full_like(t.sampler_log_ratio, 0.3), atol=1e-4, rtol=0)
