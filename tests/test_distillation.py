# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""On-policy distillation as a fourth objective (issue 22, first step): the divergence equals TRL's
`DistillationTrainer` loss and gradient; a teacher given to the trainer (object or path) adds the `distill` objective,
weighted by DARE and given half of RL's curriculum share; what cannot work is refused at construction."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_CONFIG
from transformers import AutoModelForCausalLM, LlamaConfig, TrainerCallback
from trl.kernels.chunked_divergence import ChunkedDivergenceFunction

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.losses import distillation_term, generalized_jsd
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward, make_task_suite


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def suite():
    return make_task_suite(seed=0, num_pretrain_docs=20, num_sft_per_task=5, num_rl_per_task=5, num_eval_per_task=2)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_the_divergence_and_its_gradient_equal_trl_distillation_trainers(beta):
    """The same hidden states and output layers through TRL's chunked kernel (what `DistillationTrainer` computes)
    and through TRAPO's term: loss and the gradient of the student's output layer within 1e-5."""
    generator = torch.Generator().manual_seed(0)
    n, hidden, vocab = 37, 16, 90
    student_hidden = torch.randn(n, hidden, generator=generator)
    student_head = torch.randn(vocab, hidden, generator=generator) / 4
    teacher_hidden = torch.randn(n, hidden, generator=generator)
    teacher_head = torch.randn(vocab, hidden, generator=generator) / 4
    temperature = 1.3

    head_trl = student_head.clone().requires_grad_(True)
    hidden_trl = student_hidden.clone().requires_grad_(True)
    divergence, _ = ChunkedDivergenceFunction.apply(
        hidden_trl, head_trl, None, teacher_hidden, teacher_head, None, beta, temperature, 1.0, None, 1.0, None
    )
    loss_trl = divergence.sum() / n
    loss_trl.backward()

    head = student_head.clone().requires_grad_(True)
    hidden_ours = student_hidden.clone().requires_grad_(True)
    term = distillation_term(
        hidden_ours @ head.T, teacher_hidden, lambda h: h @ teacher_head.T, n, beta, temperature, chunk_size=8
    )
    term.loss.backward()
    torch.testing.assert_close(term.loss.detach(), loss_trl.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head.grad, head_trl.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden_ours.grad, hidden_trl.grad, rtol=1e-5, atol=1e-5)


def test_the_probe_signal_is_the_terms_own_logit_gradient():
    generator = torch.Generator().manual_seed(1)
    student = torch.randn(10, 30, generator=generator, requires_grad=True)
    teacher_hidden = torch.randn(10, 6, generator=generator)
    head = torch.randn(30, 6, generator=generator)
    term = distillation_term(student, teacher_hidden, lambda h: h @ head.T, 10.0, 0.5, 1.0, chunk_size=4, probe=True)
    (expected,) = torch.autograd.grad(term.loss, student)
    torch.testing.assert_close(term.logit_grad, expected)
    assert float(generalized_jsd(student.detach(), teacher_hidden @ head.T, 0.5).min()) >= 0


def distill_trainer(output_dir, tokenizer, suite, teacher=None, **overrides):
    return TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=TRAPOConfig(output_dir=str(output_dir), **{**TINY_CONFIG, **overrides}),
        train_dataset=suite.rl_train,
        pretrain_dataset=suite.pretrain,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
        teacher_model=teacher if teacher is not None else build_tiny_model(tokenizer, seed=1),
    )


def test_a_teacher_adds_a_weighted_distillation_objective(tmp_path, tokenizer, suite):
    mixtures = [{"pretrain": 0.2, "sft": 0.2, "rl": 0.3, "distill": 0.3}] * 3
    trainer = distill_trainer(
        tmp_path, tokenizer, suite, max_steps=6, weighting="dare", dare_update_interval=1, curriculum_mixtures=mixtures
    )  # DARE measures the distillation term like the others (the default is static weights)
    assert [o.name for o in trainer.objectives] == ["pretrain", "sft", "rl", "distill"]
    teacher_before = {k: v.clone() for k, v in trainer.teacher_model.state_dict().items()}
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss/distill" in entry]
    assert logged and all(entry["loss/distill"] > 0 and 0 < entry["weight/distill"] < 1 for entry in logged)
    assert trainer.dare.engine.signal_counts[3] > 0, "DARE never measured the distillation objective"
    for name, value in trainer.teacher_model.state_dict().items():  # the teacher is frozen
        assert torch.equal(value, teacher_before[name]), name


def test_the_three_number_curriculum_gives_distillation_half_of_rls_share(tmp_path, tokenizer, suite):
    trainer = distill_trainer(tmp_path, tokenizer, suite)
    shares = trainer.curriculum.mixture(0)
    assert shares[2] == pytest.approx(shares[3]) and shares[2] + shares[3] == pytest.approx(0.1)


def test_distillation_training_resumes_bit_identically(tmp_path, tokenizer, suite):
    # with DARE, whose measured factors are part of the resumed state (the default is static weights)
    settings = dict(max_steps=6, save_strategy="steps", save_steps=3, weighting="dare", dare_update_interval=2)
    full = distill_trainer(tmp_path / "full", tokenizer, suite, **settings)
    full.train()

    class StopAfterThree(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 3

    first = distill_trainer(tmp_path / "first", tokenizer, suite, **settings)
    first.add_callback(StopAfterThree())
    first.train()
    resumed = distill_trainer(tmp_path / "resumed", tokenizer, suite, **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "first" / "checkpoint-3"))
    expected = full.model.state_dict()
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_a_teacher_given_by_path_is_loaded_as_the_cli_does(tmp_path, tokenizer, suite):
    teacher = build_tiny_model(tokenizer, seed=1)
    teacher.save_pretrained(tmp_path / "teacher")
    tokenizer.save_pretrained(tmp_path / "teacher")
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=TRAPOConfig(
            output_dir=str(tmp_path / "out"),
            teacher_model_name_or_path=str(tmp_path / "teacher"),
            **{**TINY_CONFIG, "max_steps": 2},
        ),
        train_dataset=suite.rl_train,
        processing_class=tokenizer,
    )
    assert trainer.objectives[-1].name == "distill"
    torch.testing.assert_close(
        trainer.teacher_model.get_output_embeddings().weight, teacher.get_output_embeddings().weight
    )
    trainer.train()


def other_vocabulary_teacher(tokenizer):
    config = LlamaConfig(
        vocab_size=len(tokenizer) + 7,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize(
    "case, message",
    [
        ("policy_itself", r"`teacher_model` is the policy itself"),
        ("other_vocabulary", r"The teacher's vocabulary has \d+ rows, the policy's \d+.*GOLD"),
        (
            "other_dtype",
            r"The teacher is torch.float64, the policy torch.float32: load the teacher in the policy's dtype",
        ),
        (
            "short_context",
            r"The teacher_model has a context of 8 positions, but the longest prompt \+ response_length",
        ),
        ("no_prompts", r"scores the student's own samples of prompts, but this run has none"),
    ],
)
def test_a_teacher_that_cannot_work_is_refused_at_construction(tmp_path, tokenizer, suite, case, message):
    policy = build_tiny_model(tokenizer, seed=0)
    teacher = build_tiny_model(tokenizer, seed=1)
    train_dataset = suite.rl_train
    if case == "policy_itself":
        teacher = policy
    elif case == "other_vocabulary":
        teacher = other_vocabulary_teacher(tokenizer)
    elif case == "other_dtype":
        teacher = teacher.double()
    elif case == "short_context":
        teacher.config.max_position_embeddings = 8
    elif case == "no_prompts":
        train_dataset = None
    with pytest.raises(ValueError, match=message):
        TRAPOTrainer(
            policy,
            reward_funcs=exact_match_reward,
            args=TRAPOConfig(output_dir=str(tmp_path), **TINY_CONFIG),
            train_dataset=train_dataset,
            pretrain_dataset=suite.pretrain,
            processing_class=tokenizer,
            teacher_model=teacher,
        )


@pytest.mark.parametrize("given", ["teacher_model", "teacher_model_name_or_path"])
def test_an_encoder_decoder_teacher_given_by_path_is_refused_before_loading(tmp_path, tokenizer, given):
    """A T5 teacher by path failed raw inside `AutoModelForCausalLM` ("Unrecognized configuration class ..."); it gets
    the policy's check of a model loaded by id, with its config read and no weights."""
    from transformers import T5Config, T5ForConditionalGeneration

    from trl_trapo.teacher import load_teacher

    config = T5Config(vocab_size=len(tokenizer), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
    T5ForConditionalGeneration(config).save_pretrained(tmp_path / "t5")
    path = str(tmp_path / "t5")
    teacher = path if given == "teacher_model" else None
    args = TRAPOConfig(output_dir=str(tmp_path), teacher_model_name_or_path=None if teacher else path)
    with pytest.raises(ValueError, match=rf"^{given}='{path}' is an encoder-decoder model \(T5Config, .*decoder-only"):
        load_teacher(teacher, build_tiny_model(tokenizer, seed=0), args, tokenizer)


@pytest.mark.parametrize(
    "field, value", [("distillation_beta", 1.5), ("distillation_temperature", 0.0), ("distillation_weight", -1.0)]
)
def test_distillation_settings_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        TRAPOConfig(output_dir="unused", **{field: value})


def test_the_command_line_takes_the_teacher_by_path(tmp_path, tokenizer, capsys):
    """`examples/trapo.py --teacher_model_name_or_path DIR` trains with the teacher; a folder that is not there is one
    message naming the flag, exit status 2. In this process: `cli.run` is what the script's `__main__` calls."""
    import json

    from trl_trapo import cli

    teacher = tmp_path / "teacher"
    build_tiny_model(tokenizer, seed=1).save_pretrained(teacher)
    tokenizer.save_pretrained(teacher)
    command = ["--max_steps", "2", "--report_to", "none"]
    command += ["--eval_strategy", "no", "--max_eval_samples", "8", "--output_dir", str(tmp_path / "out")]
    assert cli.run([*command, "--teacher_model_name_or_path", str(teacher)]) == 0
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    assert any("weight/distill" in entry for entry in history)
    capsys.readouterr()
    missing = cli.run([*command, "--teacher_model_name_or_path", str(tmp_path / "nowhere"), "--overwrite_output_dir"])
    stderr = capsys.readouterr().err
    assert missing == 2 and "--teacher_model_name_or_path=" in stderr  # a traceback would have failed the call


def test_the_command_line_takes_reward_free_distillation_prompts(tmp_path, tokenizer, suite, capsys):
    """`--distillation_dataset_name FILE` trains on the prompts with the teacher; without a teacher it is one message,
    exit status 2. In this process: `cli.run` is what `examples/trapo.py` calls."""
    import json

    from trl_trapo import cli

    teacher = tmp_path / "teacher"
    build_tiny_model(tokenizer, seed=1).save_pretrained(teacher)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in suite.rl_train["prompt"]))
    command = ["--max_steps", "2", "--report_to", "none"]
    command += ["--eval_strategy", "no", "--max_eval_samples", "8", "--output_dir", str(tmp_path / "out")]
    command += ["--distillation_dataset_name"]
    command += [str(prompts)]
    assert cli.run([*command, "--teacher_model_name_or_path", str(teacher)]) == 0
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    assert any(entry.get("distill/sampled_tokens", 0) > 0 for entry in history)
    capsys.readouterr()
    alone = cli.run([*command, "--overwrite_output_dir"])
    assert alone == 2 and "needs a teacher" in capsys.readouterr().err  # a traceback would have failed the call


def test_the_sampled_token_estimator_is_unbiased_for_the_reverse_kl_and_its_gradient():
    """Tokens sampled from the student: the mean of log p_s(y) - log p_t(y) is KL(p_s || p_t) and the mean gradient of
    the term is grad KL (score function), both within 4 standard errors of 200k samples."""
    from trl_trapo.losses import sampled_token_distillation_term

    generator = torch.Generator().manual_seed(3)
    student_logits = torch.randn(6, generator=generator, dtype=torch.float64, requires_grad=True)
    teacher_logits = torch.randn(6, generator=generator, dtype=torch.float64)
    log_ps, log_pt = torch.log_softmax(student_logits, -1), torch.log_softmax(teacher_logits, -1)
    kl = (log_ps.exp() * (log_ps - log_pt)).sum()
    (kl_grad,) = torch.autograd.grad(kl, student_logits, retain_graph=True)
    n = 200_000
    samples = torch.multinomial(log_ps.detach().exp(), n, replacement=True, generator=generator)
    per_token_logps = log_ps[samples].unsqueeze(1)  # (n, 1)
    term = sampled_token_distillation_term(per_token_logps, log_pt[samples].unsqueeze(1), torch.ones(n, 1), n)
    (grad,) = torch.autograd.grad(term.loss, student_logits)
    k = (log_ps - log_pt).detach()[samples]
    assert abs(float(term.value) - float(kl)) < 4 * float(k.std()) / n**0.5
    per_sample = k.unsqueeze(1) * (torch.nn.functional.one_hot(samples, 6) - log_ps.detach().exp())  # k grad log p
    tolerance = 4 * per_sample.std(0) / n**0.5
    assert bool(((grad - kl_grad).abs() <= tolerance + 1e-12).all()), (grad, kl_grad, tolerance)


def test_the_sampled_token_estimator_trains_on_the_rounds_teacher_log_probs(tmp_path, tokenizer, suite):
    teacher = build_tiny_model(tokenizer, seed=1)
    trainer = distill_trainer(
        tmp_path, tokenizer, suite, teacher=teacher, distillation_estimator="sampled_token", max_steps=3
    )
    batch = trainer.collect_rollouts(8, step=0)
    trajectory = batch.trajectories[0]
    assert trajectory.teacher_per_token_logps is not None
    from trl_trapo.models import completion_logps

    expected = completion_logps(
        trainer.teacher_model,
        [trajectory.prompt_ids],
        [trajectory.completion_ids],
        tokenizer.pad_token_id,
        torch.tensor([trainer.args.distillation_temperature]),
        8,
    )[0]
    torch.testing.assert_close(trajectory.teacher_per_token_logps, expected)
    trainer.train()
    assert any("loss/distill" in entry for entry in trainer.state.log_history)


def test_the_sampled_token_estimator_leaves_out_rows_sampled_at_another_temperature(tmp_path, tokenizer, suite):
    """Targeted exploration samples some families hotter: under those samples log p_s - log p_t does not estimate the
    KL at the divergence's temperature, so such rows count no token of the term (and are counted as excluded)."""
    from trl_trapo.collator import Row

    trainer = distill_trainer(tmp_path, tokenizer, suite, distillation_estimator="sampled_token")
    distill = trainer.objectives[3]
    ids = torch.arange(4, 10)
    rows = [Row(2, ids, torch.ones(5), temperature=t) for t in (None, 1.0, 1.1, 1.3)]
    distill.take_rows = lambda n, step: rows[:n]
    taken = distill.take(4, step=0)
    assert [float(r.mask.sum()) for r in taken] == [5.0, 5.0, 0.0, 0.0]
    assert all(r.objective == 3 for r in taken) and distill.metrics()["distill/excluded_rows"] == 2.0


def test_a_lora_policy_distils_from_a_separate_teacher(tmp_path, tokenizer, suite):
    """With PEFT only the adapter trains: it moves, the base weights and the teacher stay, `distill` is measured."""
    from peft import LoraConfig

    mixtures = [{"pretrain": 0.2, "sft": 0.2, "rl": 0.3, "distill": 0.3}] * 3
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=TRAPOConfig(
            output_dir=str(tmp_path),
            **{**TINY_CONFIG, "max_steps": 3, "curriculum_mixtures": mixtures, "learning_rate": 1e-2},
        ),
        train_dataset=suite.rl_train,
        pretrain_dataset=suite.pretrain,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
        teacher_model=build_tiny_model(tokenizer, seed=1),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    before = {k: v.clone() for k, v in trainer.model.named_parameters()}
    teacher_before = {k: v.clone() for k, v in trainer.teacher_model.state_dict().items()}
    trainer.train()
    moved = {k for k, v in trainer.model.named_parameters() if not torch.equal(v, before[k])}
    assert moved and all("lora_" in k for k in moved), moved
    assert all(torch.equal(v, teacher_before[k]) for k, v in trainer.teacher_model.state_dict().items())
    assert any("loss/distill" in entry for entry in trainer.state.log_history)


# ---- reward-free distillation prompts (`distillation_dataset`) ------------------------------------------------------
def distillation_prompts(suite, prefix=""):
    """The RL prompts without their reward columns (the answers): what a pure distillation dataset looks like."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [prefix + p for p in suite.rl_train["prompt"]]})


def test_pure_distillation_trains_on_reward_free_prompts_sampled_at_the_divergences_temperature(
    tmp_path, tokenizer, suite
):
    """No train_dataset, no reward function: only the teacher's objective, on fresh samples of the prompts, each at
    `distillation_temperature`; nothing reaches the replay buffer, the teacher stays frozen."""
    teacher = build_tiny_model(tokenizer, seed=1)
    teacher_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        args=TRAPOConfig(output_dir=str(tmp_path), **{**TINY_CONFIG, "distillation_temperature": 1.3}),
        processing_class=tokenizer,
        teacher_model=teacher,
        distillation_dataset=distillation_prompts(suite),
    )
    assert trainer.curriculum.mixture(0) == (0.0, 0.0, 0.0, 1.0)
    temperatures = []
    sample = trainer.rollouts.sample

    def recording_sample(examples, group, step, temperature):
        temperatures.append(temperature)
        return sample(examples, group, step, temperature)

    trainer.rollouts.sample = recording_sample
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    logged = [e for e in trainer.state.log_history if "loss/distill" in e]
    assert len(logged) == TINY_CONFIG["max_steps"] and all(e["loss/distill"] > 0 for e in logged)
    assert temperatures == [1.3] * TINY_CONFIG["max_steps"]  # one batched call per step, at the divergence's
    assert len(trainer.replay) == 0 and trainer.state.episode == 0  # never a rollout round
    assert logged[-1]["distill/sampled_tokens"] > 0
    assert any(not torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())
    for name, value in teacher.state_dict().items():
        assert torch.equal(value, teacher_before[name]), name


def test_distillation_prompts_never_reach_the_reward_functions_or_exploration(tmp_path, tokenizer, suite):
    """Joint run (RL prompts with a reward, and reward-free distillation prompts): the reward function sees only RL
    prompts; the distillation objective's rows are the distillation prompts' completions, not RL rollouts."""
    seen = []

    def reward(prompts, completions, answer, **kwargs):
        seen.extend(prompts)
        return exact_match_reward(prompts, completions, answer, **kwargs)

    mixtures = [{"pretrain": 0.1, "sft": 0.1, "rl": 0.4, "distill": 0.4}] * 3
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=reward,
        args=TRAPOConfig(output_dir=str(tmp_path), **{**TINY_CONFIG, "curriculum_mixtures": mixtures}),
        train_dataset=suite.rl_train,
        pretrain_dataset=suite.pretrain,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
        teacher_model=build_tiny_model(tokenizer, seed=1),
        distillation_dataset=distillation_prompts(suite, prefix="Z"),
    )
    distill = trainer.objectives[3]
    taken = []
    take = distill.take_rows
    distill.take_rows = lambda n, step: taken.extend(take(n, step)) or taken[-n:]
    trainer.train()
    assert taken and seen
    assert not any(p.startswith("Z") for p in seen), "a distillation prompt was scored"
    z = tokenizer.convert_tokens_to_ids("Z")
    assert all(int(row.input_ids[0]) == z for row in taken), "a distillation row was not a distillation prompt's"


def test_distillation_prompts_split_between_ranks_without_duplicates():
    from datasets import Dataset

    from trl_trapo.objectives import DistillationPrompts

    dataset = Dataset.from_dict({"prompt_ids": [[i + 1] for i in range(10)]})
    prompts = [DistillationPrompts(dataset, sampler=None, seed=3, rank=r, world_size=2) for r in range(2)]
    per_rank = []
    for p in prompts:
        start = 0 + p.rank * 5
        per_rank.append(p.indices(start, 5))
    assert sorted(per_rank[0] + per_rank[1]) == list(range(10))  # one epoch, split
    assert prompts[0].indices(10, 10) != prompts[0].indices(0, 10)  # the next epoch is another order
    assert sorted(prompts[0].indices(7, 6)) != [] and len(prompts[0].indices(7, 6)) == 6  # across an epoch's end


def test_distillation_with_prompts_resumes_bit_identically(tmp_path, tokenizer, suite):
    settings = dict(max_steps=6, save_strategy="steps", save_steps=3)

    def make(output_dir):
        return TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            args=TRAPOConfig(output_dir=str(output_dir), **{**TINY_CONFIG, **settings}),
            processing_class=tokenizer,
            sft_dataset=suite.sft,
            teacher_model=build_tiny_model(tokenizer, seed=1),
            distillation_dataset=distillation_prompts(suite),
        )

    full = make(tmp_path / "full")
    full.train()

    class StopAfterThree(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 3

    first = make(tmp_path / "first")
    first.add_callback(StopAfterThree())
    first.train()
    resumed = make(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "first" / "checkpoint-3"))
    assert resumed.objectives[3].prompts.position == full.objectives[3].prompts.position > 0
    expected = full.model.state_dict()
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_pure_distillation_plans_its_steps_from_the_prompts(tmp_path, tokenizer, suite):
    prompts = distillation_prompts(suite)  # 30 prompts, 8 rows a step: 4 steps an epoch
    config = {k: v for k, v in TINY_CONFIG.items() if k != "max_steps"}
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        args=TRAPOConfig(output_dir=str(tmp_path), **{**config, "num_train_epochs": 2}),
        processing_class=tokenizer,
        teacher_model=build_tiny_model(tokenizer, seed=1),
        distillation_dataset=prompts,
    )
    assert trainer.args.max_steps == 2 * -(-len(prompts) // TINY_CONFIG["per_device_train_batch_size"])


@pytest.mark.parametrize(
    "case, message",
    [
        ("no_teacher", "without a teacher"),
        ("sft_rows", "would ignore it"),
        ("no_prompt", "needs a `prompt` column"),
        ("too_long", "exceeds the model's context of 256 positions: lower response_length to at most 1, or remove"),
        ("fills_context", "256 positions: that prompt alone fills the context, .*: remove prompts longer than 252"),
        ("empty", "empty"),
    ],
)
def test_a_distillation_dataset_that_cannot_work_is_refused_at_construction(tmp_path, tokenizer, suite, case, message):
    from datasets import Dataset

    teacher = build_tiny_model(tokenizer, seed=1)
    dataset = distillation_prompts(suite)
    overrides = {}
    if case == "no_teacher":
        teacher = None
    elif case == "sft_rows":
        dataset = suite.sft
    elif case == "no_prompt":
        dataset = Dataset.from_dict({"question": ["1+1="]})
    elif case == "too_long":
        dataset = Dataset.from_dict({"prompt": ["1" * 255]})
        overrides = {"max_prompt_length": 256}
    elif case == "fills_context":  # no response_length can help: only the second fix is offered
        dataset = Dataset.from_dict({"prompt": ["1" * 300]})
        overrides = {"max_prompt_length": 400}
    elif case == "empty":
        dataset = Dataset.from_dict({"prompt": []})
    with pytest.raises(ValueError, match=message):
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            args=TRAPOConfig(output_dir=str(tmp_path), **{**TINY_CONFIG, **overrides}),
            processing_class=tokenizer,
            sft_dataset=suite.sft,
            teacher_model=teacher,
            distillation_dataset=dataset,
        )


def test_the_documented_distillation_example_trains(tmp_path, monkeypatch):
    """docs/distillation.md's block, as written: three steps with the teacher's objective trained on the reward-free
    prompts (and the three built-in objectives)."""
    from test_doc_commands import registered_block

    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    block = registered_block(
        "docs/distillation.md: # run: a teacher and reward-free prompts next to the built-in suite"
    )
    exec(compile(block.text, block.where(), "exec"), namespace)
    trainer = namespace["trainer"]
    assert [o.name for o in trainer.objectives] == ["pretrain", "sft", "rl", "distill"]
    assert trainer.state.global_step == 3 and trainer.objectives[3].prompts is not None
