"""TRAPO on the real SmolLM2-135M-Instruct (marker `real_model`, excluded by default: `pytest -m real_model`).

Needs the `real` extra and the model folder that `python scripts/fetch_smollm2.py` writes (default
`models/SmolLM2-135M-Instruct` in the repository, or `$TRL_TRAPO_SMOLLM2_DIR`); skipped with the command to run when
either is missing. Two joint steps (pretraining on Shakespeare, SFT and RL on GSM8K) with full fine-tuning: the
default path of `TRAPOTrainer(model, ...)`, which also trains the tied embedding / LM head and deep-copies the policy
into the frozen reference (LoRA's code paths are covered with tiny models in the default suite). About 75 s and 6.5 GB
of memory on 2 CPU cores (one torch thread). `pytest -m real_model -s` prints the losses and completions.
"""

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from conftest import RecordingTRAPOTrainer, gsm8k_chat_datasets, trained_rows

from trl_trapo import TRAPOConfig
from trl_trapo.config import PRETRAIN, RL, SFT
from trl_trapo.rewards import numeric_answer_reward


pytestmark = pytest.mark.real_model

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("fetch_smollm2", ROOT / "scripts" / "fetch_smollm2.py")
fetch_smollm2 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fetch_smollm2)
MODEL_DIR = fetch_smollm2.default_output_dir()
# SmolLM2 ends about 60 % of its sampled answers (temperature 0.7) to the shortest GSM8K questions within 96 tokens (at
# temperature 1: 1 of 8 in this test), so the stop check below sees stopped completions on any machine
RESPONSE_LENGTH = 96
TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    if importlib.util.find_spec("gguf") is None:
        pytest.skip(
            'the `real` extra is not installed: pip install -e ".[real]", then python scripts/fetch_smollm2.py'
        )
    if not fetch_smollm2.is_complete(MODEL_DIR):
        pytest.skip(
            f"no materialised SmolLM2 model in {MODEL_DIR}: run `python scripts/fetch_smollm2.py` (or set "
            f"{fetch_smollm2.ENV_VAR} to a folder it made)"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as `accelerate launch` on CPU; several threads on a shared machine wait at barriers
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    before = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    args = TRAPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trapo-smollm2")),
        max_steps=2,
        per_device_train_batch_size=8,
        learning_rate=1e-5,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        activation_checkpointing=False,
        # per step: 2 pretraining rows, 2 SFT rows and one GSM8K prompt with 4 sampled completions
        curriculum_mixtures=[0.25, 0.25, 0.5] * 3,
        pretrain_max_length=64,
        sft_max_length=256,
        max_prompt_length=128,
        response_length=RESPONSE_LENGTH,
        temperature=TEMPERATURE,
        num_generations=4,
        num_ppo_epochs=1,  # every step samples fresh completions
        seed=0,
    )
    trainer = RecordingTRAPOTrainer(
        model,
        reward_funcs=numeric_answer_reward,
        args=args,
        processing_class=tokenizer,
        **gsm8k_chat_datasets(tokenizer, n=4),
    )
    try:
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    return trainer, tokenizer, before


def replay_trajectories(trainer) -> list[dict[str, torch.Tensor]]:
    """Every trajectory in the replay buffer, from its public `state_dict()` (flat tensors + offsets per field)."""
    _, tensors = trainer.replay.state_dict()
    offsets = {name: tensors[f"replay/{name}.offsets"] for name in ("completion_ids", "completion_mask")}
    count = len(offsets["completion_ids"]) - 1
    return [
        {
            name: tensors[f"replay/{name}"][int(offsets[name][i]) : int(offsets[name][i + 1])]
            for name in ("completion_ids", "completion_mask")
        }
        for i in range(count)
    ]


def test_real_model_trains_every_parameter_on_all_three_objectives(trained):
    trainer, _, before = trained
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    keys = ("loss", "loss/pretrain", "loss/sft", "loss/rl", "rewards/numeric_answer_reward/mean", "grad_norm")
    print("\n" + "\n".join(str({k: entry.get(k) for k in keys}) for entry in logs))
    assert len(logs) == 2 and all(math.isfinite(entry["loss"]) for entry in logs), logs
    objectives = set(torch.cat([batch["objective"] for batch in trainer.seen_batches]).tolist())
    assert {PRETRAIN, SFT, RL} <= objectives
    # the defaults' zero-variance components ran on the real model (chat-templated prompts, 4 completions each)
    assert trainer.exploration is not None and trainer.memory_pool.successes is not None
    assert all("exploration/temperature" in entry and "self_imitation/size" in entry for entry in logs)
    params = dict(trainer.model.named_parameters())
    unchanged = [name for name, old in before.items() if torch.equal(params[name].detach(), old)]
    assert not unchanged, f"parameters that did not change: {unchanged}"


def test_sampled_completions_stop_at_im_end_and_nothing_after_it_is_trained(trained):
    trainer, tokenizer, _ = trained
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert eos == tokenizer.eos_token_id
    trajectories = replay_trajectories(trainer)
    assert len(trajectories) == 8  # 2 steps x 1 prompt x 4 completions, each used once
    stopped = 0
    for trajectory in trajectories:
        ids, mask = trajectory["completion_ids"], trajectory["completion_mask"]
        positions = (ids == eos).nonzero().flatten().tolist()
        if positions:  # cut right after its first <|im_end|>
            assert positions == [len(ids) - 1], tokenizer.decode(ids)
            stopped += 1
        else:  # never stopped: exactly response_length tokens
            assert len(ids) == RESPONSE_LENGTH
        assert mask.shape == ids.shape and bool(mask.all())
    print(
        f"\n{stopped} of {len(trajectories)} completions ended with <|im_end|>; lengths",
        [len(t["completion_ids"]) for t in trajectories],
    )
    print("first completion:", repr(tokenizer.decode(trajectories[0]["completion_ids"])))
    assert stopped >= 1, "no sampled completion ended with <|im_end|>: the stop check saw nothing"
    # what the loss saw: RL targets run from the first completion token up to the first <|im_end|> and no further
    rows = trained_rows(trainer.seen_batches, RL)
    assert rows
    for input_ids, mask in rows:
        start = int(mask.nonzero()[0]) + 1
        completion, counted = input_ids[start:], mask[start - 1 :]
        positions = (completion == eos).nonzero().flatten().tolist()
        end = positions[0] + 1 if positions else len(completion)
        assert bool(counted[:end].all()) and not bool(counted[end:].any())
        assert end == len(completion)  # nothing after the first <|im_end|> is even in the row
