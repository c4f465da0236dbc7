"""TRAPO with a real tokenizer and chat template (SmolLM2's, `tests/fixtures/smollm2_tokenizer/`) on real GSM8K rows.

The model is a tiny random Llama over SmolLM2's 49,152-token vocabulary, so this runs in the default suite; the real
weights are exercised by `tests/test_real_model.py` (marker `real_model`). SmolLM2's tokenizer is a hard case for the
masks: its pad token *is* its EOS token (`<|im_end|>`, id 2), and its chat template already ends every turn with that
token followed by a newline.
"""

import json
import re
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.data import PRETRAIN, RL, SFT
from trl_trapo.rewards import numeric_answer_reward


ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "tests" / "fixtures" / "smollm2_tokenizer"
GSM8K = ROOT / "examples" / "data" / "gsm8k" / "train_first1500.jsonl"
SHAKESPEARE = ROOT / "examples" / "data" / "shakespeare" / "train.txt"
CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations, as scripts/gsm8k_to_trl.py removes them


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TOKENIZER)


def gsm8k_rows(tokenizer, n: int) -> list[dict]:
    """The `n` GSM8K training rows with the fewest question + solution tokens (deterministic, keeps steps fast)."""
    rows = [json.loads(line) for line in GSM8K.read_text(encoding="utf-8").splitlines()]
    for row in rows:
        row["solution"] = CALCULATOR.sub("", row["answer"]).strip()
    lengths = tokenizer([r["question"] + r["solution"] for r in rows], add_special_tokens=False)["input_ids"]
    order = sorted(range(len(rows)), key=lambda i: (len(lengths[i]), i))
    return [rows[i] for i in order[:n]]


def datasets(tokenizer, n: int = 4) -> dict:
    """Conversational RL prompts (with `answer` for the reward), SFT demonstrations and Shakespeare paragraphs."""
    rows = gsm8k_rows(tokenizer, n)
    paragraphs = SHAKESPEARE.read_text(encoding="utf-8").split("\n\n")[:16]
    return dict(
        train_dataset=Dataset.from_list(
            [{"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]} for r in rows]
        ),
        sft_dataset=Dataset.from_list(
            [
                {
                    "prompt": [{"role": "user", "content": r["question"]}],
                    "completion": [{"role": "assistant", "content": r["solution"]}],
                }
                for r in rows
            ]
        ),
        pretrain_dataset=Dataset.from_list([{"text": p} for p in paragraphs]),
    )


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


class RecordingTRAPOTrainer(TRAPOTrainer):
    """Keeps a CPU copy of every micro-batch `compute_loss` sees (the public hook), to check what is trained on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen_batches: list[dict[str, torch.Tensor]] = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        keep = ("objective", "input_ids", "attention_mask", "mask")
        self.seen_batches.append({k: inputs[k].detach().cpu().clone() for k in keep})
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def rows_of(batches: list[dict], objective: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`(input_ids (L,), mask (L - 1,))` of every trained row of one objective, padding removed."""
    out = []
    for batch in batches:
        for i in (batch["objective"] == objective).nonzero().flatten().tolist():
            n = int(batch["attention_mask"][i].sum())
            out.append((batch["input_ids"][i, :n], batch["mask"][i, : n - 1]))
    return out


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
        gradient_checkpointing=False,
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
        **datasets(tokenizer),
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
    rows = rows_of(trainer.seen_batches, SFT)
    assert rows
    for input_ids, mask in rows:
        counted = input_ids[1:][mask.bool()]  # the target tokens of the loss
        prompt = input_ids[: int(mask.nonzero()[0]) + 1]  # everything before the first counted target
        assert mask[int(mask.nonzero()[0]) :].all(), "the counted targets are one contiguous stretch"
        assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
        text = tokenizer.decode(counted)
        assert any(text.startswith(answer + "<|im_end|>") for answer in answers), text


@pytest.mark.xfail(
    strict=True,
    reason="trl_trapo.data.tokenize_sft_dataset appends EOS when a completion's last token is not EOS; SmolLM2's "
    "chat template ends the assistant turn with '<|im_end|>\\n', so every conversational SFT row ends with "
    "'<|im_end|>\\n<|im_end|>' and the model is trained to emit a second EOS after the end of its turn (TRL's "
    "SFTTrainer adds EOS to non-conversational rows only). Trainer code is being redesigned; reported, not fixed here.",
)
def test_sft_rows_end_the_turn_with_exactly_one_eos(trained, tokenizer):
    trainer, _ = trained
    for input_ids, mask in rows_of(trainer.seen_batches, SFT):
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
    rows = rows_of(trainer.seen_batches, RL)
    assert rows
    for input_ids, mask in rows:
        start = int(mask.nonzero()[0]) + 1  # position of the first completion token
        assert tokenizer.decode(input_ids[:start]) in prompts
        completion, counted = input_ids[start:], mask[start - 1 :]
        eos = (completion == tokenizer.eos_token_id).nonzero().flatten()
        end = int(eos[0]) + 1 if len(eos) else len(completion)
        assert counted[:end].all() and not counted[end:].any()
