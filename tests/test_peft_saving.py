# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""With a PEFT policy, `save_model` (and so `push_to_hub`) writes only the adapter being trained; checkpoints keep
what resuming needs, including a reference adapter that `sync_ref_model` moves."""

from __future__ import annotations

import os

import torch
from peft import LoraConfig

from trl_trapo import TRAPOTrainer
from trl_trapo.tasks import build_tiny_model, exact_match_reward


def lora_trainer(tmp_path, tokenizer, suite, tiny_config, **overrides):
    return TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=tiny_config(tmp_path, kl_coef=0.1, learning_rate=1e-2, **overrides),
        train_dataset=suite.rl_train,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )


def test_save_model_writes_only_the_trained_adapter(tmp_path, tokenizer, suite, tiny_config):
    trainer = lora_trainer(
        tmp_path,
        tokenizer,
        suite,
        tiny_config,
        sync_ref_model=True,
        ref_model_sync_steps=1,
        save_strategy="steps",
        save_steps=2,
        max_steps=2,
    )
    assert trainer.reference.adapter == "trapo_ref"
    trainer.train()
    out = tmp_path / "final"
    trainer.save_model(str(out))
    assert (out / "adapter_model.safetensors").exists() and (out / "adapter_config.json").exists()
    assert not (out / "trapo_ref").exists()  # the frozen reference copy is not what the user trains
    # the checkpoint keeps everything resuming needs
    assert (tmp_path / "checkpoint-2" / "trapo_ref").exists()


def test_a_synced_reference_adapter_survives_resume(tmp_path, tokenizer, suite, tiny_config):
    overrides = dict(sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=0.5, save_strategy="steps")
    trainer = lora_trainer(tmp_path, tokenizer, suite, tiny_config, save_steps=2, max_steps=2, **overrides)
    trainer.train()
    policy = trainer._unwrapped_policy()
    reference = {n: p.detach().clone() for n, p in policy.named_parameters() if ".trapo_ref." in n}
    resumed = lora_trainer(tmp_path, tokenizer, suite, tiny_config, save_steps=2, max_steps=2, **overrides)
    fresh = {n: p.detach().clone() for n, p in resumed._unwrapped_policy().named_parameters() if ".trapo_ref." in n}
    assert any(not torch.equal(fresh[n], reference[n]) for n in reference)  # the reference did move in training
    resumed.run_state.load(os.path.join(tmp_path, "checkpoint-2"))
    restored = {n: p for n, p in resumed._unwrapped_policy().named_parameters() if ".trapo_ref." in n}
    for name, value in reference.items():
        torch.testing.assert_close(restored[name], value)


def test_modules_to_save_naming_no_module_is_refused(tokenizer):
    """PEFT skips a `modules_to_save` entry that matches no module, so the head the user meant to train fully was
    trained frozen and not saved, without a word (trial 5, W34); one the model has (`lm_head`) is kept."""
    import pytest

    from trl_trapo.assembly import wrap_adapter

    def config(modules):
        return LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=modules, lora_dropout=0.0)

    with pytest.raises(
        ValueError, match=r"modules_to_save=\['lm_head', 'nope_head'\]: 'nope_head' names no module .*lm_head"
    ):
        wrap_adapter(build_tiny_model(tokenizer, seed=0), config(["lm_head", "nope_head"]))
    wrapped = wrap_adapter(build_tiny_model(tokenizer, seed=0), config(["lm_head"]))
    assert any("modules_to_save" in name for name, _ in wrapped.named_parameters())


def test_layers_to_transform_the_model_lacks_is_named_not_target_modules(tokenizer):
    """`layers_to_transform=[99]` on a 2-layer model was blamed on `target_modules` ("matches no module", q_proj
    listed among the names it has; trial 6's L07), and `[1, 99]` silently adapted layer 1 only."""
    import pytest

    from trl_trapo.assembly import wrap_adapter

    def config(layers):
        return LoraConfig(r=4, target_modules=["q_proj"], layers_to_transform=layers, task_type="CAUSAL_LM")

    for layers in ([99], [1, 99]):
        given = config(layers)
        with pytest.raises(ValueError, match=r"layers_to_transform=\[.*99\] names layer\(s\) \[99\].*numbered 0-1"):
            wrap_adapter(build_tiny_model(tokenizer, seed=0), given)
        assert given.layers_to_transform == layers  # the user's config is not changed
    wrong_pattern = LoraConfig(r=4, target_modules=["q_proj"], layers_to_transform=[0], layers_pattern="blocks")
    with pytest.raises(ValueError, match=r"no module matching target_modules=.* numbered layer under layers_pattern"):
        wrap_adapter(build_tiny_model(tokenizer, seed=0), wrong_pattern)
    wrapped = wrap_adapter(build_tiny_model(tokenizer, seed=0), config([1]))
    adapted = [name for name, _ in wrapped.named_modules() if name.endswith("q_proj.lora_A")]
    assert len(adapted) == 1 and ".layers.1." in adapted[0]
