"""`use_vllm`: the option is validated and wired to TRL's `VLLMGeneration`. vLLM itself needs a GPU and is not
installed here: these tests check the clear error when it is absent, and drive the wiring with a stand-in for
`VLLMGeneration` (what it is given, when weights are synced, that its completions become trajectories whose behaviour
log-probs are the training policy's). `scripts/benchmarks/gpu_check.py` runs the real thing on a GPU machine."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import AutoModelForCausalLM

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.collator import collate_rows
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward, make_task_suite


HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def suite():
    return make_task_suite(seed=0, num_pretrain_docs=20, num_sft_per_task=5, num_rl_per_task=10, num_eval_per_task=2)


def config(tmp_path, **overrides) -> TRAPOConfig:
    values = dict(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=8,
        report_to="none",
        save_strategy="no",
        activation_checkpointing=False,
        max_prompt_length=16,
        response_length=4,
        num_generations=4,
        use_vllm=True,
    )
    values.update(overrides)
    return TRAPOConfig(**values)


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
            "vllm_importance_sampling_mode='sequence' is invalid: use one",
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
    assert any(w.filename == __file__ for w in record)  # points at the code that built the config
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
    """Stands in for `trl.generation.vllm_generation.VLLMGeneration`: samples from the policy with transformers."""

    instances: list = []

    def __init__(self, model, accelerator, processing_class, **kwargs):
        self.model, self.kwargs, self.syncs, self.calls = model, kwargs, 0, []
        FakeVLLMGeneration.instances.append(self)

    def sync_weights(self):
        self.syncs += 1

    def generate(self, prompts, images, num_generations):
        self.calls.append((len(prompts), num_generations))
        completions = []
        for ids in prompts:
            out = self.model.generate(
                torch.tensor([ids]), do_sample=True, max_new_tokens=self.kwargs["max_completion_length"]
            )
            completions.append(out[0, len(ids) :].tolist())
        return prompts, completions, None, None


def test_vllm_wiring_with_a_stand_in(tmp_path, suite, monkeypatch):
    import trl.generation.vllm_generation as vllm_generation

    import trl_trapo.rollout as vllm_rollouts

    monkeypatch.setattr(vllm_rollouts, "is_vllm_available", lambda: True)
    monkeypatch.setattr(vllm_generation, "VLLMGeneration", FakeVLLMGeneration)
    FakeVLLMGeneration.instances.clear()
    model, tokenizer = saved_model(tmp_path)
    trainer = TRAPOTrainer(
        model,
        reward_funcs=exact_match_reward,
        args=config(tmp_path, vllm_gpu_memory_utilization=0.4, temperature=0.9, top_k=5),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
    )
    (fake,) = FakeVLLMGeneration.instances
    assert fake.model is model
    assert fake.kwargs["mode"] == "colocate"
    assert fake.kwargs["gpu_memory_utilization"] == 0.4
    assert fake.kwargs["max_completion_length"] == 4 and fake.kwargs["max_model_length"] == 16 + 4
    assert (fake.kwargs["temperature"], fake.kwargs["top_k"]) == (0.9, 5)

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
