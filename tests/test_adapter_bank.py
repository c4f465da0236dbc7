# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The adapter bank: K snapshots kept, bit-identical restore, manual and automatic rollback, Hub push, resume."""

import json
import os
import shutil

import pytest
import torch
from peft import LoraConfig, get_peft_model

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.checkpoint import CheckpointError
from trl_trapo.memory import AdapterBank
from trl_trapo.tasks import build_tiny_model


LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)


def peft_model(tokenizer, seed=0):
    torch.manual_seed(seed)
    return get_peft_model(build_tiny_model(tokenizer, seed=0), LoraConfig(**LORA))


def adapter_params(model):
    return {n: p for n, p in model.named_parameters() if ".default." in n}


def perturb(model, scale=0.5):
    with torch.no_grad():
        for p in adapter_params(model).values():
            p.add_(scale * torch.randn_like(p))


def test_keeps_exactly_k_snapshots_oldest_dropped(tmp_path, tokenizer):
    model = peft_model(tokenizer)
    bank = AdapterBank(str(tmp_path / "bank"), max_snapshots=3)
    for step in range(1, 6):
        perturb(model)
        entry = bank.snapshot(model, step, mean_reward=float(step), kl=0.1 * step)
        assert entry["files"].keys() == {"adapter_model.safetensors", "adapter_config.json"}
    assert [s["step"] for s in bank.list()] == [3, 4, 5]
    assert sorted(n for n in os.listdir(tmp_path / "bank") if n.startswith("step-")) == ["step-3", "step-4", "step-5"]
    index = json.loads((tmp_path / "bank" / "index.json").read_text())
    assert [s["step"] for s in index["snapshots"]] == [3, 4, 5]
    reopened = AdapterBank.open(str(tmp_path / "bank"))
    assert [s["step"] for s in reopened.list()] == [3, 4, 5] and reopened.max_snapshots == 3
    meta = json.loads((tmp_path / "bank" / "step-4" / "trapo_snapshot.json").read_text())
    assert meta["step"] == 4 and meta["mean_reward"] == 4.0 and meta["kl"] == pytest.approx(0.4)
    assert bank.best()["step"] == 5 and bank.best(kl_max=0.35)["step"] == 3


def test_dropped_snapshots_stay_while_a_checkpoint_lists_them(tmp_path, tokenizer):
    model = peft_model(tokenizer)
    bank = AdapterBank(str(tmp_path / "bank"), max_snapshots=1)
    bank.snapshot(model, 1)
    checkpoint = tmp_path / "checkpoint-1" / "trapo"
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_bank.json").write_text(json.dumps(bank.state_dict()))
    bank.snapshot(model, 2)
    assert [s["step"] for s in bank.list()] == [2]
    assert (tmp_path / "bank" / "step-1").is_dir()  # resuming from checkpoint-1 needs it
    shutil.rmtree(tmp_path / "checkpoint-1")  # e.g. save_total_limit rotated it away
    bank.snapshot(model, 3)
    assert sorted(os.listdir(tmp_path / "bank")) == ["index.json", "step-3"]


def test_restores_a_chosen_snapshot_bit_identically(tmp_path, tokenizer):
    model = peft_model(tokenizer)
    bank = AdapterBank(str(tmp_path / "bank"))
    saved = {}
    for step in (10, 20, 30):
        perturb(model)
        bank.snapshot(model, step)
        saved[step] = {n: p.detach().clone() for n, p in adapter_params(model).items()}
    base = {n: p.detach().clone() for n, p in model.named_parameters() if ".default." not in n}
    bank.load(model, 20)
    for name, param in adapter_params(model).items():
        assert torch.equal(param, saved[20][name]), name
    for name, param in model.named_parameters():  # the base model is untouched
        if name in base:
            assert torch.equal(param, base[name]), name
    # the snapshot directory is a regular PEFT adapter directory
    from peft import PeftModel

    other = PeftModel.from_pretrained(build_tiny_model(tokenizer, seed=0), bank.path(30))
    for name, param in adapter_params(other).items():
        assert torch.equal(param, saved[30][name]), name


def test_manual_rollback_resets_the_adapters_adam_moments(tmp_path, tokenizer):
    model = peft_model(tokenizer)
    bank = AdapterBank(str(tmp_path / "bank"))
    bank.snapshot(model, 1, mean_reward=1.0)
    saved = {n: p.detach().clone() for n, p in adapter_params(model).items()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    loss = model(input_ids=torch.tensor([[5, 6, 7, 8]]), labels=torch.tensor([[5, 6, 7, 8]])).loss
    loss.backward()
    optimizer.step()
    assert all(p in optimizer.state for p in adapter_params(model).values())
    reset = bank.rollback(model, 1, optimizer)
    assert len(reset) == len(adapter_params(model)) and bank.rollbacks == 1
    for name, param in adapter_params(model).items():
        assert torch.equal(param, saved[name]) and param not in optimizer.state, name
    optimizer.step()  # a fresh state is created on the next step
    assert all(int(optimizer.state[p]["step"]) == 1 for p in adapter_params(model).values())


def test_push_to_hub_calls_the_hub_api(tmp_path, tokenizer, monkeypatch):
    import huggingface_hub

    calls = []

    class FakeApi:
        def __init__(self, token=None):
            calls.append(("init", token))

        def create_repo(self, repo_id, **kwargs):
            calls.append(("create_repo", repo_id, kwargs))

        def create_commit(self, repo_id, operations, **kwargs):
            calls.append(("create_commit", repo_id, list(operations), kwargs))
            return "commit-info"

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    model = peft_model(tokenizer)
    bank = AdapterBank(str(tmp_path / "bank"))
    bank.snapshot(model, 7, mean_reward=0.5, kl=1.25)
    assert bank.push_to_hub(7, "me/trapo-adapter", base_model="tiny-llama", token="tok", private=True) == "commit-info"
    assert calls[0] == ("init", "tok")
    assert calls[1] == ("create_repo", "me/trapo-adapter", {"private": True, "exist_ok": True, "repo_type": "model"})
    _, repo_id, operations, kwargs = calls[2]
    assert repo_id == "me/trapo-adapter" and kwargs["repo_type"] == "model" and "step 7" in kwargs["commit_message"]
    paths = sorted(op.path_in_repo for op in operations)
    assert paths == ["README.md", "adapter_config.json", "adapter_model.safetensors", "trapo_snapshot.json"]
    card = next(op for op in operations if op.path_in_repo == "README.md").path_or_fileobj
    card = card.decode() if isinstance(card, bytes) else card.read().decode()
    assert "library_name: peft" in card and "base_model: tiny-llama" in card and "| 7 | 0.5000 | 1.2500 |" in card


def test_a_push_without_network_names_the_hub_and_the_repo(tmp_path, tokenizer, monkeypatch):
    """The Hub client's connection error becomes one HubPushError naming the Hub, the repo id and `hf upload` of the
    snapshot folder, which stays complete on disk."""
    import huggingface_hub

    from trl_trapo.saving import HubPushError

    class OfflineApi:
        def __init__(self, token=None):
            pass

        def create_repo(self, repo_id, **kwargs):
            raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub, "HfApi", OfflineApi)
    model = peft_model(tokenizer)
    bank = AdapterBank(str(tmp_path / "bank"))
    bank.snapshot(model, 7, mean_reward=0.5, kl=1.25)
    folder = str(tmp_path / "bank" / "step-7")
    with pytest.raises(
        HubPushError, match=rf"Hugging Face Hub \(repo 'me/trapo-adapter'\).*hf upload me/trapo-adapter {folder}"
    ):
        bank.push_to_hub(7, "me/trapo-adapter")
    bank.verify(bank.get(7))


def test_damaged_bank_files_are_named(tmp_path, tokenizer):
    model = peft_model(tokenizer)
    bank = AdapterBank(str(tmp_path / "bank"))
    bank.snapshot(model, 1)
    weights = tmp_path / "bank" / "step-1" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="step-1/adapter_model.safetensors is corrupted or truncated"):
        bank.load(model, 1)
    (tmp_path / "bank" / "index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="index.json is corrupted"):
        AdapterBank.open(str(tmp_path / "bank"))


# ---------------------------------------------------------------------------------------------------------------------
# In the trainer
# ---------------------------------------------------------------------------------------------------------------------
def step_reward(prompts, completions, trainer_state=None, **kwargs):
    """1.0 for the rollouts of the first two optimizer steps, 0.0 afterwards: a collapse the bank must catch."""
    step = 0 if trainer_state is None else trainer_state.global_step
    return [1.0 if step < 2 else 0.0 for _ in completions]


def bank_trainer(tmp_path, tokenizer, suite, **overrides):
    values = dict(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,
        max_prompt_length=16,
        response_length=4,
        num_generations=2,
        num_ppo_epochs=1,
        kl_coef=0.0,
        scale_rewards="none",
        seed=0,
        adapter_snapshot_steps=1,
        max_adapter_snapshots=5,
        adapter_rollback_reward_drop=0.1,
    )
    values.update(overrides)
    torch.manual_seed(0)
    return TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=step_reward,
        args=TRAPOConfig(**values),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
        peft_config=LoraConfig(**LORA),
    )


def test_automatic_rollback_when_the_reward_drops(tmp_path, tokenizer, suite, caplog):
    trainer = bank_trainer(tmp_path, tokenizer, suite)
    callback = trainer.memory_pool.adapter_bank
    restored = {}
    original = callback.bank.rollback

    def spy(model, step, optimizer=None, adapter_name=None):
        params = original(model, step, optimizer, adapter_name)
        restored["weights"] = {n: p.detach().clone() for n, p in adapter_params(model).items()}
        restored["optimizer_has_state"] = any(p in trainer.optimizer.optimizer.state for p in params)
        return params

    callback.bank.rollback = spy
    trainer.train()
    bank = callback.bank
    assert [s["step"] for s in bank.list()] == [1, 2]  # no snapshot of the collapsed policy
    assert [s["mean_reward"] for s in bank.list()] == [1.0, 1.0]
    assert bank.rollbacks == 1 and "rolling back" in caplog.text
    saved = bank.read_weights(2)
    assert {k.replace(".weight", ".default.weight") for k in saved} == set(restored["weights"])
    for name, tensor in saved.items():
        assert torch.equal(restored["weights"][name.replace(".weight", ".default.weight")], tensor), name
    assert not restored["optimizer_has_state"]  # Adam moments of the adapter were reset
    logs = [h for h in trainer.state.log_history if "adapter_bank/rollbacks" in h]
    assert logs[-1]["adapter_bank/rollbacks"] == 1.0 and logs[0]["adapter_bank/rollbacks"] == 0.0
    assert len(trainer.replay) == 0  # trajectories of the abandoned policy were dropped


def test_rollback_rule(tmp_path, tokenizer, suite):
    trainer = bank_trainer(tmp_path, tokenizer, suite, adapter_rollback_reward_drop=0.5, adapter_rollback_kl_max=2.0)
    callback = trainer.memory_pool.adapter_bank
    model = trainer._unwrapped_policy()
    assert callback.should_roll_back(0.0, 0.0) is None  # an empty bank: nothing to roll back to
    callback.bank.snapshot(model, 1, mean_reward=-2.0, kl=1.0)
    callback.bank.snapshot(model, 2, mean_reward=4.0, kl=3.0)  # best reward, but beyond the KL bound
    assert callback.bank.best(2.0)["step"] == 1
    assert callback.should_roll_back(-2.5, 1.0) is None  # -2.5 >= -2 - 0.5 * 2
    assert callback.should_roll_back(-3.5, 1.0)["step"] == 1  # reward dropped by more than half of |best|
    assert callback.should_roll_back(10.0, 2.5)["step"] == 1  # KL beyond the bound
    assert callback.should_roll_back(None, None) is None  # no scored rollout in the window


@pytest.mark.parametrize("peft", [False, True])
def test_adapter_bank_settings_where_the_bank_is_off_are_warned(
    tmp_path, tokenizer, suite, tiny_trainer, caplog, peft
):
    """`adapter_snapshot_steps=1, adapter_rollback_reward_drop=0.1` on a full-model run trained with no bank and no
    word (trial 10's PY10); the rollback settings with `adapter_snapshot_steps=0` on a PEFT run, the same. One warning
    at construction naming the settings, the gate and the fix."""
    import logging

    if peft:
        model, settings = peft_model(tokenizer), dict(adapter_snapshot_steps=0, adapter_rollback_kl_max=5.0)
        expected = (
            "adapter_rollback_kl_max=5.0 is set but adapter_snapshot_steps > 0 (it is 0) is not: it is ignored (the "
            "adapter bank is off). Set adapter_snapshot_steps"
        )
    else:
        model, settings = None, dict(adapter_snapshot_steps=1, adapter_rollback_reward_drop=0.1)
        expected = (
            "adapter_snapshot_steps=1, adapter_rollback_reward_drop=0.1 are set but a PEFT policy (`peft_config`, "
            "--use_peft, or a PeftModel) is not: they are ignored (the adapter bank snapshots and rolls back adapters; "
            "this run trains the full model). Pass a peft_config (--use_peft) to snapshot and roll back an adapter "
            "with them, or drop them."
        )
    with caplog.at_level(logging.WARNING, logger="trl_trapo"):
        tiny_trainer(tmp_path, tokenizer, suite, model=model, **settings)
    found = [r.getMessage() for r in caplog.records if "adapter_" in r.getMessage()]
    assert len(found) == 1 and found[0].startswith(expected), found
