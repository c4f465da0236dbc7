"""TRAPO with a real tokenizer and chat template (SmolLM2's, `tests/fixtures/smollm2_tokenizer/`) on real GSM8K rows.

The model is a tiny random Llama over SmolLM2's 49,152-token vocabulary, so this runs in the default suite; the real
weights are exercised by `tests/test_real_model.py` (marker `real_model`). SmolLM2's tokenizer is a hard case for the
masks: its pad token *is* its EOS token (`<|im_end|>`, id 2), and its chat template already ends every turn with that
token followed by a newline.
"""

from pathlib import Path

import pytest
import torch
from conftest import RecordingTRAPOTrainer, gsm8k_chat_datasets, gsm8k_rows, trained_rows
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from trl_trapo import TRAPOConfig
from trl_trapo.config import PRETRAIN, RL, SFT
from trl_trapo.rewards import numeric_answer_reward


TOKENIZER = Path(__file__).resolve().parent / "fixtures" / "smollm2_tokenizer"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TOKENIZER)


def tiny_llama(tokenizer) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        tie_word_embeddings=True,  # as SmolLM2
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def test_smollm2_tokenizer_fixture_facts(tokenizer):
    assert len(tokenizer) == 49152
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 2
    assert tokenizer("2 + 3", add_special_tokens=True)["input_ids"] == tokenizer("2 + 3")["input_ids"]  # no BOS
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.fixture(scope="module")
def trained(tokenizer, tmp_path_factory):
    """Two joint steps (pretraining + SFT + RL) of a tiny random Llama with SmolLM2's tokenizer on GSM8K."""
    model = tiny_llama(tokenizer)
    before = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    args = TRAPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trapo")),
        max_steps=2,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        activation_checkpointing=False,
        # the same mixture at every step: 2 pretraining rows, 2 SFT rows and one RL group of 4 completions
        curriculum_mixtures=[0.25, 0.25, 0.5] * 3,
        pretrain_max_length=32,
        sft_max_length=256,
        max_prompt_length=256,
        response_length=8,
        num_generations=4,
        seed=0,
    )
    trainer = RecordingTRAPOTrainer(
        model,
        reward_funcs=numeric_answer_reward,
        args=args,
        processing_class=tokenizer,
        **gsm8k_chat_datasets(tokenizer),
    )
    trainer.train()
    return trainer, before


def test_two_joint_steps_train_every_parameter_on_all_three_objectives(trained):
    trainer, before = trained
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    objectives = torch.cat([batch["objective"] for batch in trainer.seen_batches])
    assert {PRETRAIN, SFT, RL} <= set(objectives.tolist())
    params = dict(trainer.model.named_parameters())
    unchanged = [name for name, old in before.items() if torch.equal(params[name].detach().cpu(), old)]
    assert not unchanged, f"parameters that did not change: {unchanged}"


def test_sft_rows_train_on_the_whole_assistant_answer_and_nothing_of_the_prompt(trained, tokenizer):
    trainer, _ = trained
    answers = {r["solution"] for r in gsm8k_rows(tokenizer, 4)}
    rows = trained_rows(trainer.seen_batches, SFT)
    assert rows
    for input_ids, mask in rows:
        counted = input_ids[1:][mask.bool()]  # the target tokens of the loss
        prompt = input_ids[: int(mask.nonzero()[0]) + 1]  # everything before the first counted target
        assert mask[int(mask.nonzero()[0]) :].all(), "the counted targets are one contiguous stretch"
        assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
        text = tokenizer.decode(counted)
        assert any(text.startswith(answer + "<|im_end|>") for answer in answers), text


def test_sft_rows_end_the_turn_with_exactly_one_eos(trained, tokenizer):
    """SmolLM2's chat template ends the assistant turn with '<|im_end|>\n': no second EOS is appended after it (as
    TRL's SFT does for conversational rows)."""
    trainer, _ = trained
    for input_ids, mask in trained_rows(trainer.seen_batches, SFT):
        counted = input_ids[1:][mask.bool()]
        assert int((counted == tokenizer.eos_token_id).sum()) == 1, tokenizer.decode(counted)


def test_rl_rows_train_on_the_completion_up_to_its_first_eos_only(trained, tokenizer):
    trainer, _ = trained
    prompts = {
        tokenizer.apply_chat_template(
            [{"role": "user", "content": r["question"]}], tokenize=False, add_generation_prompt=True
        )
        for r in gsm8k_rows(tokenizer, 4)
    }
    rows = trained_rows(trainer.seen_batches, RL)
    assert rows
    for input_ids, mask in rows:
        start = int(mask.nonzero()[0]) + 1  # position of the first completion token
        assert tokenizer.decode(input_ids[:start]) in prompts
        completion, counted = input_ids[start:], mask[start - 1 :]
        eos = (completion == tokenizer.eos_token_id).nonzero().flatten()
        end = int(eos[0]) + 1 if len(eos) else len(completion)
        assert counted[:end].all() and not counted[end:].any()
