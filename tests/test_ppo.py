"""PPO drop-in: a TRL 1.12-style PPO pipeline runs with only the import changed."""

from __future__ import annotations

import os

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    LlamaConfig,
    PreTrainedTokenizerFast,
)

# The only line a 1.12 pipeline changes: `from trl.experimental.ppo import PPOConfig, PPOTrainer`
from trl_trapo import PPOConfig, PPOTrainer


VOCAB = ["[PAD]", "[EOS]"] + [f"t{i}" for i in range(2, 40)]


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    """Tokenizer with a separate [PAD] and left padding, and four tiny models saved to local directories."""
    root = tmp_path_factory.mktemp("ppo_models")
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="t2"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", eos_token="[EOS]", padding_side="left"
    )
    tokenizer.save_pretrained(root / "tokenizer")
    config = dict(
        vocab_size=len(VOCAB),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
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
        cls.from_config(LlamaConfig(**config, **extra)).save_pretrained(root / name)
    return root


def tokenized_prompts(tokenizer, n=16) -> Dataset:
    texts = [" ".join(f"t{2 + (3 * i + j) % 30}" for j in range(1 + i % 4)) for i in range(n)]

    def tokenize(element):
        return {"input_ids": tokenizer(element["text"], padding=False)["input_ids"]}

    return Dataset.from_dict({"text": texts}).map(tokenize, remove_columns=["text"])


def load(root, name):
    if name in ("value", "reward"):
        return AutoModelForSequenceClassification.from_pretrained(root / name, num_labels=1)
    return AutoModelForCausalLM.from_pretrained(root / name)


def ppo_config(tmp_path, unset=(), **overrides) -> PPOConfig:
    """The tests' PPOConfig: `overrides` replace the values below; the fields in `unset` are left at their default."""
    values = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        num_ppo_epochs=2,
        num_mini_batches=1,
        total_episodes=16,
        response_length=5,
        learning_rate=1e-2,
        stop_token="eos",
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        gradient_checkpointing=False,
        num_sample_generations=0,
        logging_steps=1,
    )
    values.update(overrides)
    return PPOConfig(**{k: v for k, v in values.items() if k not in unset})


def trainer_in_1_12_order(config: PPOConfig, tokenizer, saved_models, ref="ref") -> PPOTrainer:
    """A `PPOTrainer` of the saved models given positionally, in TRL 1.12's order: (args, processing_class, model,
    ref_model, reward_model, train_dataset, value_model); `ref=None` gives no reference model."""
    return PPOTrainer(
        config,
        tokenizer,
        load(saved_models, "policy"),
        load(saved_models, ref) if ref is not None else None,
        load(saved_models, "reward"),
        tokenized_prompts(tokenizer),
        load(saved_models, "value"),
    )


def test_ppo_pipeline_as_trl_1_12_documented_it(tmp_path, saved_models):
    tokenizer = AutoTokenizer.from_pretrained(saved_models / "tokenizer")
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id != tokenizer.eos_token_id
    policy, ref_policy = load(saved_models, "policy"), load(saved_models, "ref")
    value_model, reward_model = load(saved_models, "value"), load(saved_models, "reward")
    train_dataset = tokenized_prompts(tokenizer)
    eval_dataset = tokenized_prompts(tokenizer, n=4)
    trainer = PPOTrainer(
        args=ppo_config(tmp_path),
        processing_class=tokenizer,
        model=policy,
        ref_model=ref_policy,
        reward_model=reward_model,
        value_model=value_model,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
    )
    assert trainer.model.policy is policy and trainer.model.value_model is value_model
    before_policy = {n: p.detach().clone() for n, p in policy.named_parameters()}
    before_value = {n: p.detach().clone() for n, p in value_model.named_parameters()}
    trainer.train()
    # 16 episodes / batch of 4 = 4 rollout batches x 2 PPO epochs x 1 mini-batch = 8 optimizer steps
    assert trainer.state.global_step == 8
    assert trainer.state.episode == 16
    changed = [n for n, p in policy.named_parameters() if not torch.equal(p.detach(), before_policy[n])]
    assert len(changed) == len(before_policy), set(before_policy) - set(changed)
    changed = [n for n, p in value_model.named_parameters() if not torch.equal(p.detach(), before_value[n])]
    assert len(changed) == len(before_value), set(before_value) - set(changed)
    logs = [h for h in trainer.state.log_history if "loss/policy_avg" in h]
    for key in (
        "objective/kl",
        "objective/entropy",
        "objective/non_score_reward",
        "objective/rlhf_reward",
        "objective/scores",
        "policy/approxkl_avg",
        "policy/clipfrac_avg",
        "loss/policy_avg",
        "loss/value_avg",
        "val/clipfrac_avg",
        "val/ratio",
        "val/ratio_var",
        "val/num_eos_tokens",
        "eps",
        "lr",
        "episode",
    ):
        assert any(key in h for h in logs), key
    # save_model saves the policy, loadable with from_pretrained, and not the wrapper
    trainer.save_model(str(tmp_path / "saved"))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    for name, param in reloaded.named_parameters():
        torch.testing.assert_close(param, dict(policy.named_parameters())[name])
    assert not os.path.exists(tmp_path / "saved" / "value_model")
    table = trainer.generate_completions()
    assert len(table) == 4 and all({"prompt", "completion", "score"} <= set(row) for row in table)


def test_ppo_positional_arguments_in_1_12_order(tmp_path, saved_models):
    tokenizer = AutoTokenizer.from_pretrained(saved_models / "tokenizer")
    trainer = trainer_in_1_12_order(ppo_config(tmp_path, total_episodes=4), tokenizer, saved_models)
    trainer.train()
    assert trainer.state.global_step == 2


def test_ppo_lora_variant_trains_critic_and_adapter_and_saves_only_the_adapter(tmp_path, saved_models):
    tokenizer = AutoTokenizer.from_pretrained(saved_models / "tokenizer")
    policy, value_model = load(saved_models, "policy"), load(saved_models, "value")
    trainer = PPOTrainer(
        args=ppo_config(tmp_path, total_episodes=8),
        processing_class=tokenizer,
        model=policy,
        ref_model=None,
        reward_model=load(saved_models, "reward"),
        value_model=value_model,
        train_dataset=tokenized_prompts(tokenizer),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )
    lora = {n: p.detach().clone() for n, p in trainer.model.policy.named_parameters() if "lora_" in n}
    base = {n: p.detach().clone() for n, p in trainer.model.policy.named_parameters() if "lora_" not in n}
    critic = {n: p.detach().clone() for n, p in value_model.named_parameters()}
    trainer.train()
    policy_params = dict(trainer.model.policy.named_parameters())
    assert all(not torch.equal(policy_params[n].detach(), v) for n, v in lora.items() if "lora_B" in n)
    assert all(torch.equal(policy_params[n].detach(), v) for n, v in base.items())
    assert all(not torch.equal(p.detach(), critic[n]) for n, p in value_model.named_parameters())
    trainer.save_model(str(tmp_path / "adapter"))
    files = set(os.listdir(tmp_path / "adapter"))
    assert "adapter_model.safetensors" in files and "adapter_config.json" in files
    assert "model.safetensors" not in files


def test_ppo_metrics_are_logged_once_per_rollout_batch_unless_logging_steps_is_given(tmp_path, saved_models):
    """TRL 1.12's PPOTrainer logged its metrics once per PPO update whatever `logging_steps` said; a 1.12 script that
    leaves `logging_steps` unset gets one log per rollout batch (num_ppo_epochs x num_mini_batches optimizer steps),
    also in a run shorter than TRAPOConfig's default of 10 steps. A value the user gives is kept, 10 included."""
    values = dict(output_dir=str(tmp_path / "out"), report_to="none")
    assert PPOConfig(**values).logging_steps == 4  # 1.12's defaults: 4 PPO epochs x 1 mini-batch
    assert PPOConfig(**values, logging_steps=10).logging_steps == 10
    assert PPOConfig(**values, logging_steps=0.5).logging_steps == 0.5
    assert PPOConfig(**values, num_ppo_epochs=3, num_mini_batches=2, gradient_accumulation_steps=2).logging_steps == 6
    tokenizer = AutoTokenizer.from_pretrained(saved_models / "tokenizer")
    config = ppo_config(tmp_path, unset=("logging_steps",), gradient_accumulation_steps=2, num_mini_batches=2)
    assert config.logging_steps == 4
    trainer = trainer_in_1_12_order(config, tokenizer, saved_models)
    trainer.train()
    # 16 episodes / 8 prompts per rollout batch = 2 batches x 2 PPO epochs x 2 mini-batches = 8 optimizer steps
    assert trainer.state.global_step == 8
    logs = [h for h in trainer.state.log_history if "objective/kl" in h]
    assert [h["step"] for h in logs] == [4, 8]  # one log per rollout batch, at its last optimizer step
    assert [h["episode"] for h in logs] == [8, 16]
    assert all(
        {"objective/scores", "policy/approxkl_avg", "loss/policy_avg", "loss/value_avg"} <= set(h) for h in logs
    )


@pytest.mark.parametrize("total_episodes", [None, 16])
def test_max_steps_is_honoured_and_wins_over_total_episodes_with_a_warning(
    tmp_path, saved_models, caplog, total_episodes
):
    """Trial 8's PP01: `PPOConfig(max_steps=2)` ran 8 optimizer steps, max_steps overwritten from total_episodes (or
    epochs x prompts) without a word, as TRL 1.12's PPOTrainer ignored it. Now max_steps counts optimizer steps, as
    in TRAPOTrainer; with total_episodes also set a warning says which wins."""
    tokenizer = AutoTokenizer.from_pretrained(saved_models / "tokenizer")
    config = ppo_config(tmp_path, max_steps=3, total_episodes=total_episodes)
    with caplog.at_level("WARNING", logger="trl_trapo.ppo"):
        trainer = trainer_in_1_12_order(config, tokenizer, saved_models)
    warned = [r.getMessage() for r in caplog.records if "max_steps wins" in r.getMessage()]
    if total_episodes is None:
        assert not warned
    else:
        assert warned and "max_steps=3 and total_episodes=16" in warned[0], warned
    assert config.max_steps == 3 and config.total_episodes == total_episodes  # the user's config is not changed
    # 3 optimizer steps of 2 per rollout batch (2 PPO epochs x 1 mini-batch): 2 batches of 4 prompts
    assert trainer.args.max_steps == 3 and trainer.args.num_total_batches == 2
    assert trainer.args.total_episodes == (8 if total_episodes is None else 16)
    trainer.train()
    assert trainer.state.global_step == 3


def test_mini_batches_must_divide_accumulation(tmp_path, saved_models):
    tokenizer = AutoTokenizer.from_pretrained(saved_models / "tokenizer")
    with pytest.raises(ValueError, match="divisible by num_mini_batches=3"):
        config = ppo_config(tmp_path, gradient_accumulation_steps=4, num_mini_batches=3)
        trainer_in_1_12_order(config, tokenizer, saved_models, ref=None)


def test_a_pad_token_added_without_resizing_never_reaches_an_embedding(tmp_path, saved_models):
    """TRL 1.12's PPO example: `tokenizer.add_special_tokens({"pad_token": "[PAD]"})` without resizing the models, so
    the pad id equals the vocabulary size. Generation, the training forward, reference, critic and reward forwards,
    and the sample table all run: no pad id ever reaches an embedding."""
    vocab = ["[EOS]"] + [f"t{i}" for i in range(1, len(VOCAB))]  # as many tokens as the models embed, no [PAD]
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="t2"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="[EOS]", padding_side="left")
    tokenizer.add_special_tokens({"pad_token": "[PAD]"})
    policy = load(saved_models, "policy")
    assert tokenizer.pad_token_id == policy.config.vocab_size == len(vocab)  # one past the last embedding row
    trainer = PPOTrainer(
        args=ppo_config(tmp_path, total_episodes=8, stop_token="eos"),
        processing_class=tokenizer,
        model=policy,
        ref_model=load(saved_models, "ref"),
        reward_model=load(saved_models, "reward"),
        value_model=load(saved_models, "value"),
        train_dataset=tokenized_prompts(tokenizer),
        eval_dataset=tokenized_prompts(tokenizer, n=4),
    )
    trainer.train()
    assert trainer.state.global_step == 4
    assert len(trainer.generate_completions()) == 4
    assert "eval_reward" in trainer.evaluate()
    # transformers' train() copied the unembeddable pad id into the live config; what is saved must still reload
    aligned = policy.config.pad_token_id
    trainer.save_model(str(tmp_path / "saved"))
    assert policy.config.pad_token_id == aligned  # the live model is left as it was
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")  # "Padding_idx must be within num_embeddings"
    assert reloaded.config.pad_token_id == trainer.padding_id < reloaded.config.vocab_size
