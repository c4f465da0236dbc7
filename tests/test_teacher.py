# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The distillation teacher (`trl_trapo/teacher.py`, issue 39): one object owns the frozen teacher and its forwards,
the objectives and the rollout engine that use it receive it in their constructors, the trainer keeps no handle."""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager

import pytest
import torch
from conftest import TINY_CONFIG

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.models import completion_logps
from trl_trapo.objectives import DistillationObjective
from trl_trapo.sources import SampledRound
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward, make_task_suite
from trl_trapo.teacher import Teacher


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def ids(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_the_trainer_keeps_no_teacher_handle(tmp_path, tokenizer):
    """The `distill` objective owns the teacher; the rollout engine (sampled-token estimator) and the reward-free
    prompts get the same object; `trainer.teacher_model` is a read-only view and no trainer method runs the teacher."""
    from datasets import Dataset

    suite = make_task_suite(seed=0, num_pretrain_docs=20, num_sft_per_task=5, num_rl_per_task=5, num_eval_per_task=2)
    given = build_tiny_model(tokenizer, seed=1)
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=TRAPOConfig(output_dir=str(tmp_path), **{**TINY_CONFIG, "distillation_estimator": "sampled_token"}),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
        teacher_model=given,
        distillation_dataset=Dataset.from_dict({"prompt": suite.rl_train["prompt"]}),
    )
    distill = next(o for o in trainer.objectives if isinstance(o, DistillationObjective))
    assert isinstance(distill.teacher, Teacher) and trainer.teacher_model is distill.teacher.model
    assert trainer.accelerator.unwrap_model(trainer.teacher_model) is given
    assert trainer.rollouts.teacher is distill.teacher and distill.prompts.teacher is distill.teacher
    assert distill.prompts.sampler is trainer.rollouts
    held = [k for k, v in vars(trainer).items() if isinstance(v, Teacher) or v is given or v is distill.teacher.model]
    assert held == [], f"the trainer holds the teacher in {held}"
    assert [name for name in dir(TRAPOTrainer) if "teacher" in name or "distill" in name] == ["teacher_model"]
    with pytest.raises(AttributeError):
        trainer.teacher_model = None


def test_the_teachers_forwards_are_its_models(tokenizer):
    model = build_tiny_model(tokenizer, seed=1).eval()
    prepared = []
    teacher = Teacher(model, prepare=lambda m: prepared.append(m) or m, temperature=1.3, pad_token_id=0, batch_size=2)
    assert prepared == [model] and teacher.model is model and teacher.head_copy is None
    input_ids = ids(tokenizer, "12+34=46").unsqueeze(0)
    mask = torch.ones_like(input_ids)
    with torch.no_grad():
        expected = model.get_decoder()(input_ids=input_ids, attention_mask=mask).last_hidden_state
    hidden = teacher.hidden(input_ids, mask)
    assert not hidden.requires_grad and hidden.shape == (1, input_ids.shape[1], model.config.hidden_size)
    torch.testing.assert_close(hidden, expected, rtol=0, atol=0)
    torch.testing.assert_close(teacher.head(hidden[0]), model.lm_head(hidden[0]), rtol=0, atol=0)

    prompts = [ids(tokenizer, "1+2="), ids(tokenizer, "30+4=")]
    completions = [ids(tokenizer, "3"), ids(tokenizer, "34")]
    reference = completion_logps(model, prompts, completions, 0, torch.tensor([1.3, 1.3]), 2)
    assert [t.shape for t in teacher.logps(prompts, completions)] == [(1,), (2,)]
    for got, want in zip(teacher.logps(prompts, completions), reference):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # a reward-free round carries no prompt ids: its examples' are used
    round_ = SampledRound([{"prompt_ids": p.tolist()} for p in prompts], completions, version=0)
    for got, want in zip(teacher.round_logps(round_), reference):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def fake_deepspeed(gathers: list) -> types.ModuleType:
    """A stand-in `deepspeed` whose `zero.GatheredParameters` records each gather (the parameters are whole here)."""

    @contextmanager
    def gathered(params, modifier_rank=None):
        gathers.append(len(params))
        yield

    module = types.ModuleType("deepspeed")
    module.zero = types.SimpleNamespace(GatheredParameters=gathered)
    return module


def test_a_partitioned_teacher_gathers_its_head_once_and_runs_the_stand_in(tokenizer, monkeypatch):
    """Under ZeRO-3 the output layer is gathered once, at construction, into a frozen copy that every chunk uses; a
    micro-batch without distillation rows still runs the teacher's (collective) forward once on a one-token
    stand-in, so that every rank gathers the same parameters the same number of times."""
    gathers: list = []
    monkeypatch.setitem(sys.modules, "deepspeed", fake_deepspeed(gathers))
    model = build_tiny_model(tokenizer, seed=1).eval()
    teacher = Teacher(model, partitioned=True)
    assert gathers == [1] and teacher.head_copy is not None
    hidden = torch.randn(3, model.config.hidden_size)
    expected = model.lm_head(hidden).detach()
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)  # the copy is a clone: the (re-partitioned) module is not read again
    torch.testing.assert_close(teacher.head(hidden), expected, rtol=0, atol=0)
    assert gathers == [1]

    calls = []
    hidden_forward = teacher.hidden
    teacher.hidden = lambda input_ids, attention_mask: (
        calls.append(input_ids.shape) or hidden_forward(input_ids, attention_mask)
    )
    objective = DistillationObjective(lambda n, step: [], teacher)
    no_rows = types.SimpleNamespace(
        rows=torch.zeros(2, dtype=torch.bool), logits=torch.zeros(0, 5), inputs={"input_ids": torch.ones(2, 4).long()}
    )
    assert float(objective.loss(no_rows).loss) == 0.0 and calls == [(1, 1)]
    teacher.partitioned = False
    objective.loss(no_rows)
    assert calls == [(1, 1)], "a teacher that is not partitioned ran for a micro-batch without its rows"


def partitioned(model, rows: int | None = None):
    """`model` with its output layer's weight as DeepSpeed ZeRO-3 leaves it on a rank: an empty local tensor, the
    whole shape in `ds_shape` (`rows` rows there, default the real ones)."""
    head = model.get_output_embeddings()
    whole = tuple(head.weight.shape)
    empty = torch.nn.Parameter(torch.empty(0, dtype=head.weight.dtype), requires_grad=head.weight.requires_grad)
    empty.ds_shape = torch.Size((rows or whole[0], *whole[1:]))
    head.weight = empty
    return model


def test_the_vocabulary_check_reads_the_whole_shape_of_a_partitioned_output_layer(tokenizer):
    """Issue 40 (teacher x ZeRO-3): a policy loaded under ZeRO-3 has a partitioned output layer (0 local rows); the
    check compares its whole vocabulary (`ds_shape`) with the teacher's, so a teacher object built outside ZeRO-3 is
    accepted, and two partitioned models of different vocabularies are refused (0 == 0 matched them before)."""
    from trl_trapo.teacher import load_teacher

    args = types.SimpleNamespace(teacher_model_name_or_path=None, teacher_model_init_kwargs=None, disable_dropout=True)
    policy = partitioned(build_tiny_model(tokenizer, seed=0))
    assert policy.get_output_embeddings().weight.shape[0] == 0
    teacher = build_tiny_model(tokenizer, seed=1)
    assert load_teacher(teacher, policy, args, tokenizer) is teacher
    other = partitioned(build_tiny_model(tokenizer, seed=1), rows=len(tokenizer) + 7)
    with pytest.raises(ValueError, match=rf"vocabulary has {len(tokenizer) + 7} rows, the policy's {len(tokenizer)}"):
        load_teacher(other, policy, args, tokenizer)


def test_teacher_settings_without_a_teacher_are_warned(tmp_path, tokenizer, caplog):
    """`teacher_model_init_kwargs` without any teacher was ignored without a word (trial 8's TD09): one warning
    names the teacher-only settings given and the fix, as `--lora_r` without `--use_peft` gets; none for defaults."""
    import logging

    from trl_trapo.teacher import load_teacher

    policy = build_tiny_model(tokenizer, seed=0)
    args = TRAPOConfig(output_dir=str(tmp_path), teacher_model_init_kwargs={"dtype": "float32"}, distillation_beta=0.5)
    with caplog.at_level(logging.WARNING, logger="trl_trapo.teacher"):
        assert load_teacher(None, policy, args, tokenizer) is None
    # TRAPO's records only: another test's `log_level` may have left transformers' own INFO lines on (model builds)
    assert [r.getMessage() for r in caplog.records if r.name == "trl_trapo.teacher"] == [
        "teacher_model_init_kwargs={'dtype': 'float32'}, distillation_beta=0.5 are set but a teacher (`teacher_model` "
        "/ teacher_model_name_or_path) is not: they are ignored (no distillation objective is built). Pass "
        "teacher_model= to the trainer or set teacher_model_name_or_path (--teacher_model_name_or_path) to distill "
        "with them, or drop them."
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo.teacher"):
        assert load_teacher(None, policy, TRAPOConfig(output_dir=str(tmp_path)), tokenizer) is None
    assert [r.getMessage() for r in caplog.records if r.name == "trl_trapo.teacher"] == []
