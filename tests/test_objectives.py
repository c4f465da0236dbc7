# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The objective seam (trl_trapo/objectives.py): objectives added through `TRAPOTrainer(objectives=...)` are trained,
weighted by DARE, given a curriculum share and checkpointed like the built-in three; a term with its own logit gradient
is probed exactly; checkpoints written before objectives were objects still resume."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_CONFIG
from datasets import Dataset
from transformers import TrainerCallback

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.collator import Row, StepContext
from trl_trapo.curriculum import phase_mixtures
from trl_trapo.losses import TermOutput
from trl_trapo.objectives import LanguageModelingObjective, Objective, check_objectives, count_keys, step_counts
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward, make_task_suite


FIXTURES = Path(__file__).parent / "fixtures"
MICRO_MODEL = FIXTURES / "micro_causal_lm.json"
FOUR_PHASES = [  # the fourth objective, "digits", gets a share in every phase
    {"pretrain": 0.5, "sft": 0.2, "rl": 0.1, "digits": 0.2},
    {"pretrain": 0.2, "sft": 0.4, "rl": 0.2, "digits": 0.2},
    {"pretrain": 0.1, "sft": 0.3, "rl": 0.5, "digits": 0.1},
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def suite():
    return make_task_suite(seed=0, num_pretrain_docs=20, num_sft_per_task=5, num_rl_per_task=5, num_eval_per_task=2)


def digits_corpus(n: int = 30) -> Dataset:
    """A second language-modelling corpus, unlike the built-in prose: digit strings."""
    generator = torch.Generator().manual_seed(1)
    texts = ["".join(str(int(d)) for d in torch.randint(0, 10, (20,), generator=generator)) for _ in range(n)]
    return Dataset.from_dict({"text": texts})


def four_objective_trainer(output_dir, tokenizer, suite, **overrides) -> TRAPOTrainer:
    settings = {
        **TINY_CONFIG,
        "max_steps": 6,
        "weighting": "dare",  # DARE weighs and measures the fourth objective (the default is static weights)
        "dare_update_interval": 1,  # DARE measures all four objectives every step
        "curriculum_mixtures": FOUR_PHASES,
        "curriculum_boundaries": [0.34, 0.67],
        "save_strategy": "steps",
        "save_steps": 3,
        **overrides,
    }
    return TRAPOTrainer(
        build_tiny_model(tokenizer, config_path=MICRO_MODEL, seed=0),
        reward_funcs=exact_match_reward,
        args=TRAPOConfig(output_dir=str(output_dir), **settings),
        train_dataset=suite.rl_train,
        pretrain_dataset=suite.pretrain,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
        objectives=[LanguageModelingObjective("digits", digits_corpus(), weight=0.5)],
    )


class ObjectiveRows(TrainerCallback):
    """Counts the rows each objective got (from the trainer's metrics of the objective's loss)."""

    def __init__(self):
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def test_a_fourth_objective_is_trained_weighted_and_resumed_bit_identically(tmp_path, tokenizer, suite):
    # uninterrupted: 6 steps, checkpoints at 3 and 6
    trainer = four_objective_trainer(tmp_path / "full", tokenizer, suite)
    recorder = ObjectiveRows()
    trainer.add_callback(recorder)
    assert [o.name for o in trainer.objectives] == ["pretrain", "sft", "rl", "digits"]
    assert len(trainer.dare.engine.value()) == 4 and trainer.dare.dynamic
    trainer.train()
    logged = [entry for entry in recorder.logs if "loss" in entry]
    # the objective had rows, a loss, a curriculum share, a DARE weight and a measured signal
    assert any("loss/digits" in entry for entry in logged)
    assert all(entry["curriculum/digits"] > 0 for entry in logged)
    assert all(0 < entry["weight/digits"] < 1 for entry in logged)
    assert any("dare/signal/digits" in entry for entry in logged)
    assert trainer.dare.engine.num_updates >= 4  # updated every step from step 1
    assert trainer.dare.engine.signal_counts[3] > 0  # the fourth objective's signal was measured
    full = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}

    # interrupted after step 3 and resumed from its checkpoint: the same parameters, bit for bit
    class StopAfterThree(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 3

    first = four_objective_trainer(tmp_path / "resumed", tokenizer, suite)
    first.add_callback(StopAfterThree())
    first.train()
    checkpoint = tmp_path / "resumed" / "checkpoint-3"
    assert checkpoint.is_dir()
    resumed = four_objective_trainer(tmp_path / "resumed2", tokenizer, suite)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, full[name]), name


def test_a_step_holds_the_added_objectives_rows_with_its_index(tmp_path, tokenizer, suite):
    trainer = four_objective_trainer(tmp_path, tokenizer, suite)
    batches, context = trainer.get_batch_samples(iter(range(1)), 1, "cpu")
    objectives = torch.cat([b["objective"] for b in batches])
    assert (objectives == 3).any(), "no row of the added objective in the step"
    tokens = sum(float(b["mask"][b["objective"] == 3].sum()) for b in batches)
    assert context.counts["tokens_digits"] == tokens
    assert len(context.weights) == 4 and sum(context.weights) == pytest.approx(1.0)
    # its rows are digits only: they come from its own corpus
    digit_ids = set(tokenizer.convert_tokens_to_ids(list("0123456789")))
    for batch in batches:
        for row, mask in zip(batch["input_ids"][batch["objective"] == 3], batch["mask"][batch["objective"] == 3]):
            counted = row[1:][mask.bool()].tolist()
            assert set(counted) <= digit_ids | {tokenizer.eos_token_id}


def test_the_curriculum_mapping_form_and_its_errors():
    names = ("pretrain", "sft", "rl", "digits")
    assert phase_mixtures(FOUR_PHASES, 3, names)[0] == (0.5, 0.2, 0.1, 0.2)
    # the three-number form keeps working; an added objective then gets nothing -> refused, naming the fix
    assert phase_mixtures([0.7, 0.2, 0.1, 0.1, 0.3, 0.6], 2, ("pretrain", "sft", "rl")) == [
        (0.7, 0.2, 0.1),
        (0.1, 0.3, 0.6),
    ]
    with pytest.raises(ValueError, match=r"'digits' gets no share in any curriculum phase.*mapping"):
        phase_mixtures([0.7, 0.2, 0.1], 1, names)
    with pytest.raises(ValueError, match=r"names \['code'\].*fix the name or add the objective"):
        phase_mixtures([{"pretrain": 0.5, "code": 0.5}], 1, names)
    with pytest.raises(ValueError, match="curriculum_mixtures.*phase 0.*must sum to 1"):
        TRAPOConfig(output_dir="unused", curriculum_mixtures=[{"pretrain": 0.5}, {"rl": 1.0}, {"sft": 1.0}])
    with pytest.raises(ValueError, match="curriculum_mixtures.*one mapping per phase"):
        TRAPOConfig(output_dir="unused", curriculum_mixtures=[{"pretrain": 1.0}])


def test_bad_objectives_are_refused_at_construction(tmp_path, tokenizer, suite):
    def build(objectives, **overrides):
        return TRAPOTrainer(
            build_tiny_model(tokenizer, config_path=MICRO_MODEL, seed=0),
            reward_funcs=exact_match_reward,
            args=TRAPOConfig(output_dir=str(tmp_path), **{**TINY_CONFIG, **overrides}),
            train_dataset=suite.rl_train,
            pretrain_dataset=suite.pretrain,
            processing_class=tokenizer,
            objectives=objectives,
        )

    with pytest.raises(ValueError, match="built-in names"):
        build([LanguageModelingObjective("sft", digits_corpus())])
    with pytest.raises(ValueError, match="Two objectives are named 'digits'"):
        build([LanguageModelingObjective("digits", digits_corpus()), LanguageModelingObjective("digits", None)])
    with pytest.raises(TypeError, match="Objective instances"):
        build(["digits"])
    with pytest.raises(ValueError, match="'digits' gets no share"):  # three-number curriculum: it would never train
        build([LanguageModelingObjective("digits", digits_corpus())])
    with pytest.raises(ValueError, match=r"objective 'digits' dataset needs a 'text' column"):
        build(
            [LanguageModelingObjective("digits", Dataset.from_dict({"body": ["1"]}))], curriculum_mixtures=FOUR_PHASES
        )
    with pytest.raises(ValueError, match="weight=-1"):
        LanguageModelingObjective("digits", digits_corpus(), weight=-1)


class UniformTargetObjective(Objective):
    """A full-vocabulary term: cross-entropy of the model's distribution to the uniform one, on the RL rows' counted
    tokens — L = sum_n sum_v (1/V) * -log softmax(z_n)_v / N. Its gradient with respect to the logits is
    (p_n - 1/V) / N, not c (p - e_y): it hands the probe its own logit gradient."""

    def __init__(self):
        super().__init__("uniform")

    def take(self, n, step):  # any text will do: the test relabels the step's rows as this objective's
        ids = torch.arange(4, 14)
        return [Row(self.index, ids, torch.ones(ids.numel() - 1)) for _ in range(n)]

    def loss(self, term):
        logits = term.logits[term.tokens].float()  # (N_o, V)
        n = max(float(term.mask.sum()), 1.0)
        log_p = torch.log_softmax(logits, dim=-1)
        loss = -(log_p.mean(dim=-1)).sum() / n
        grad = (torch.softmax(logits, dim=-1) - 1.0 / logits.shape[-1]) / n
        return TermOutput(loss, loss.detach(), logit_grad=grad.detach())


def test_the_probe_sketch_of_a_term_with_its_own_logit_gradient_equals_the_autograd_gradient(
    tmp_path, tokenizer, suite
):
    uniform = UniformTargetObjective()
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, config_path=MICRO_MODEL, seed=0),  # untied head: its gradient is the term's own
        reward_funcs=exact_match_reward,
        args=TRAPOConfig(
            output_dir=str(tmp_path),
            **{
                **TINY_CONFIG,
                "weighting": "dare",  # the probe runs only under DARE (the default is static weights)
                "dare_update_interval": 1,
                "curriculum_mixtures": [{"rl": 0.5, "uniform": 0.5}] * 3,
            },
        ),
        train_dataset=suite.rl_train,
        pretrain_dataset=suite.pretrain,
        processing_class=tokenizer,
        objectives=[uniform],
    )
    # RL rows, relabelled as the uniform objective's (index 3), through the trainer's own forward and probe
    batches, _ = trainer.get_batch_samples(iter(range(1)), 1, "cpu")
    batch = {k: v.clone() for k, v in batches[0].items()}
    batch["objective"] = torch.full_like(batch["objective"], 3)
    counts = dict(zip(count_keys(trainer.objectives), step_counts([batch], trainer.objectives).tolist()))
    context = StepContext(step=1, weights=(0.0, 0.0, 0.0, 1.0), counts=counts, probe=True, num_micro=1)
    trainer.dare.begin_step(1)
    model = trainer.model
    model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(model, batch, num_items_in_batch=context)
    loss.backward()
    probe = trainer.dare.probe
    head = trainer.accelerator.unwrap_model(model).get_output_embeddings().weight.grad  # (V, H)
    expected = head if probe.rows is None else head[probe.rows]
    if probe.projection is not None:
        expected = expected @ probe.projection
    sketch = probe.sums[3, 0] + probe.sums[3, 1]
    torch.testing.assert_close(sketch, expected, rtol=1e-4, atol=1e-6)
    assert float(probe.counts[3].sum()) == float(batch["mask"].sum())
    assert float(probe.counts[:3].sum()) == 0.0  # nothing went to the closed-form objectives


def test_checkpoint_written_before_objectives_were_objects_resumes(tmp_path, tokenizer, suite):
    """tests/fixtures/checkpoint_7b3563e/checkpoint-2: a 4-step run of the code at 7b3563e (see its make_checkpoint.py),
    saved at step 2, with the pretraining stream at the top level of the state and three unnamed DARE factors."""
    import json
    import sys

    sys.path.insert(0, str(FIXTURES / "checkpoint_7b3563e"))
    from make_checkpoint import SETTINGS, SUITE  # the settings the fixture was made with

    checkpoint = tmp_path / "checkpoint-2"
    shutil.copytree(FIXTURES / "checkpoint_7b3563e" / "checkpoint-2", checkpoint)
    old_state = json.loads((checkpoint / "trapo" / "rank0.json").read_text())
    old_suite = make_task_suite(**SUITE)
    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, config_path=MICRO_MODEL, seed=0),
        reward_funcs=exact_match_reward,
        # the fixture was written with DARE, the default then: resumed as it was trained (the default is now static)
        args=TRAPOConfig(output_dir=str(tmp_path / "out"), **SETTINGS, weighting="dare"),
        train_dataset=old_suite.rl_train,
        pretrain_dataset=old_suite.pretrain,
        sft_dataset=old_suite.sft,
        processing_class=tokenizer,
    )
    restored = {}

    class AtStart(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            restored["pretrain"] = trainer.objectives[0].state_dict()
            restored["dare"] = trainer.dare.engine.state_dict()
            restored["allocator"] = trainer.allocator.state_dict()
            restored["step"] = state.global_step

    trainer.add_callback(AtStart())
    trainer.train(resume_from_checkpoint=str(checkpoint))
    assert restored["step"] == 2
    assert restored["pretrain"] == {**old_state["pretrain_stream"], "offset": 0}  # its buffer first, then read on
    assert restored["dare"]["factors"] == old_state["dare"]["factors"]
    assert restored["dare"]["names"] == ["pretrain", "sft", "rl"]
    assert restored["allocator"] == old_state["allocator"]
    assert trainer.state.global_step == 4
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_resuming_with_other_objectives_is_refused_by_name(tmp_path, tokenizer, suite):
    first = four_objective_trainer(tmp_path / "four", tokenizer, suite, max_steps=2, save_steps=2)
    first.train()
    three = TRAPOTrainer(
        build_tiny_model(tokenizer, config_path=MICRO_MODEL, seed=0),
        reward_funcs=exact_match_reward,
        # DARE as the checkpoint was written: its objectives are what differs
        args=TRAPOConfig(output_dir=str(tmp_path / "three"), **{**TINY_CONFIG, "max_steps": 4, "weighting": "dare"}),
        train_dataset=suite.rl_train,
        pretrain_dataset=suite.pretrain,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )
    with pytest.raises(Exception, match=r"other objectives \(this run adds none and lacks \['digits'\]\)"):
        three.train(resume_from_checkpoint=str(tmp_path / "four" / "checkpoint-2"))


def test_the_documented_objective_of_your_own_trains(tmp_path, monkeypatch):
    """docs/seams.md's "Writing your own" block, run from the page as written (its own class, its own dataset, one
    `objectives=[...]` line): its objective is served rows, trains (`loss/short`), logs its own metric and state,
    and its static weight 0.5 multiplies its share in the loss weights (w_o = c_o s_o f_o / sum: static weights, the
    default, so f_o = 1 and its weight over pretraining's is 0.5 s_short / (1 s_pretrain))."""
    from test_doc_commands import registered_block

    monkeypatch.chdir(tmp_path)
    block = registered_block("docs/seams.md: # run: an objective of your own")
    namespace: dict = {}
    exec(compile(block.text, block.where(), "exec"), namespace)
    trainer = namespace["trainer"]
    short = trainer.objectives[-1]
    assert type(short).__name__ == "ShortAnswers" and short.name == "short" and short.weight == 0.5
    assert trainer.state.global_step == 2 and short.served > 0
    logged = [entry for entry in trainer.state.log_history if "loss/short" in entry]
    assert logged and all(entry["loss/short"] > 0 and entry["short/served"] > 0 for entry in logged)
    mixture = trainer.args.curriculum_mixtures[0]  # every phase the same
    weighted = [entry for entry in trainer.state.log_history if "weight/short" in entry]
    assert len(weighted) == 2
    for entry in weighted:
        expected = (0.5 * mixture["short"]) / (1.0 * mixture["pretrain"])  # c_o s_o over pretraining's
        assert entry["weight/short"] / entry["weight/pretrain"] == pytest.approx(expected, rel=1e-6)
    assert short.state_dict() == {"served": short.served}


class Scripted(Objective):
    """An objective whose `take`, `loss` and `state_dict` misbehave as `case` says (a new user's trial, issue 21)."""

    def __init__(self, case: str = "ok"):
        super().__init__("scripted")
        self.case = case
        if case.startswith("counts"):
            self.count_keys = ("scripted_rows", "scripted_other")

    def take(self, n, step):
        ids = torch.arange(4, 14)
        index = {"index0": 0, "index99": 99}.get(self.case, self.index)
        count = {"fewer": n - 1, "more": n + 1}.get(self.case, n)
        if self.case == "dicts":
            return [{"input_ids": ids} for _ in range(n)]
        if self.case == "oov":  # the last row's last token is outside the vocabulary
            rows = [Row(index, ids, torch.ones(ids.numel() - 1)) for _ in range(n)]
            rows[-1] = Row(index, torch.cat([ids, torch.tensor([10**6])]), torch.ones(ids.numel()))
            return rows
        if self.case == "long":  # 100 tokens, the micro model has 64 positions
            ids = torch.arange(4, 14).repeat(10)
        if self.case == "empty":  # 0 tokens, the mask as the user wrote it (trial 8's OB04)
            return [Row(index, torch.tensor([], dtype=torch.long), torch.ones(0)) for _ in range(count)]
        mask = torch.ones(ids.numel() - (0 if self.case == "mask_len" else 1))  # mask_len: L entries, not L-1
        if self.case == "mask_values":  # trial 8's OB05: a mask of -5.0 trained as 1
            mask[2:] = -5.0
        return [Row(index, ids, mask) for _ in range(count)]

    def counts(self, batch, rows):
        if self.case in ("counts_dict", "counts_fewer"):  # trial 8's OB06: count_keys declared, not given
            return {} if self.case == "counts_dict" else [rows.sum()]
        return [rows.sum(), 0.0] if self.count_keys else []

    def logit_scale(self, inputs, rows):
        if self.case == "scale_shape":  # trial 9's PX90: torch's "index 3 is out of bounds for dimension 0"
            return torch.full((3,), 2.0)
        if self.case == "scale_float":
            return 2.0
        if self.case == "scale_ok":  # (B,) on the CPU, 2 on its own rows
            return torch.where(rows.cpu(), 2.0, 1.0)
        return None

    def loss(self, term):
        loss = -(term.per_token_logps * term.mask).sum() / max(term.context.counts["tokens_scripted"], 1.0)
        if self.case == "detached":  # trial 9's PX89: logged as loss/scripted, trained nothing
            return TermOutput(loss.detach(), loss.detach())
        if self.case == "skips":  # a zero loss without gradient: how an objective skips a micro-batch
            return TermOutput(torch.zeros(()), torch.zeros(()))
        if self.case == "float":
            return 0.0
        if self.case == "nonscalar":
            return TermOutput(loss.expand(2), loss.detach())
        if self.case == "nan":
            loss = loss * float("nan")
        if self.case == "bad_logp_coef":
            return TermOutput(loss, loss.detach(), logp_coef=torch.ones(3))
        if self.case == "no_signal":  # neither logp_coef nor logit_grad: DARE's probe cannot see its gradient
            return TermOutput(loss, loss.detach())
        return TermOutput(loss, loss.detach(), logp_coef=torch.ones_like(term.mask))

    def state_dict(self):
        return {"tensor": torch.zeros(1)} if self.case == "tensor_state" else {"case": self.case}

    def metrics(self):
        return {"scripted/seen": 1.0}


def scripted_trainer(tmp_path, tokenizer, suite, objective, **overrides):
    mixtures = [{"pretrain": 0.4, "sft": 0.2, "rl": 0.2, "scripted": 0.2}] * 3
    return TRAPOTrainer(
        build_tiny_model(tokenizer, config_path=MICRO_MODEL, seed=0),
        reward_funcs=exact_match_reward,
        args=TRAPOConfig(
            output_dir=str(tmp_path), **{**TINY_CONFIG, "max_steps": 2, "curriculum_mixtures": mixtures, **overrides}
        ),
        train_dataset=suite.rl_train,
        pretrain_dataset=suite.pretrain,
        sft_dataset=suite.sft,
        processing_class=tokenizer,
        objectives=[objective],
    )


@pytest.mark.parametrize(
    "case, error, message",
    [
        ("index0", ValueError, r"'scripted': take\(\) row 0 has objective=0, but this objective's index is 3"),
        ("index99", ValueError, r"row 0 has objective=99"),
        ("fewer", ValueError, r"take\(\d+, step\) returned \d+ rows; it must return a list of exactly"),
        ("more", ValueError, r"must return a list of exactly"),
        ("dicts", ValueError, r"take\(\) row 0 is a dict"),
        ("float", TypeError, r"'scripted': loss\(\) must return a trl_trapo.losses.TermOutput.*got float"),
        ("nonscalar", TypeError, r"scalar tensor, got TermOutput with a loss of shape \(2,\)"),
        ("bad_logp_coef", TypeError, r"logp_coef has shape \(3,\)"),
        ("mask_len", ValueError, r"'scripted': take\(\) row 0 has a mask of 10 entries for 10 tokens; Row.mask is "),
        ("oov", ValueError, r"'scripted': take\(\) row \d+ holds token id 1000000, outside the policy's vocabulary"),
        ("long", ValueError, r"'scripted': take\(\) row 0 is 100 tokens, more than the policy's context of 64"),
        ("empty", ValueError, r"'scripted': take\(\) row 0 is empty \(input_ids has 0 tokens\).*skip empty"),
        ("mask_values", ValueError, r"'scripted': take\(\) row 0 has a mask value of -5.0; Row.mask holds 1 "),
        (
            "counts_dict",
            ValueError,
            r"'scripted': count_keys=\('scripted_rows', 'scripted_other'\) declares 2 global "
            r"count\(s\), but counts\(\) returned a dict: return a list of exactly 2",
        ),
        ("counts_fewer", ValueError, r"'scripted': count_keys=.* but counts\(\) returned 1 value\(s\)"),
        (
            "scale_shape",
            TypeError,
            r"'scripted': logit_scale\(\) returned shape \(3,\); it must be a tensor of shape \(B,\) = \(\d+,\)",
        ),
        ("scale_float", TypeError, r"'scripted': logit_scale\(\) returned float; it must be a tensor of shape"),
        (
            "detached",
            ValueError,
            r"'scripted': loss\(\) returned -?[\d.]+ without gradient .* it would be logged as loss/scripted and "
            r"train nothing",
        ),
    ],
)
def test_an_objective_that_serves_or_computes_the_wrong_thing_is_named(
    tmp_path, tokenizer, suite, case, error, message
):
    """Rows labelled with another objective's index trained silently under that objective's loss; wrong counts and
    malformed terms crashed deep inside the trainer. Each now fails at the first step, naming the objective."""
    trainer = scripted_trainer(tmp_path, tokenizer, suite, Scripted(case))
    with pytest.raises(error, match=message):
        trainer.train()


@pytest.mark.parametrize("case", ["skips", "scale_ok"])
def test_a_zero_loss_without_gradient_and_a_row_scale_made_on_the_cpu_train(tmp_path, tokenizer, suite, case):
    """What the checks above must let through: an objective returning a zero loss without gradient (a micro-batch
    it skips) and a `(B,)` logit scale built on the CPU (moved to the rows' device)."""
    trainer = scripted_trainer(tmp_path, tokenizer, suite, Scripted(case))
    trainer.train()
    assert trainer.state.global_step == 2


def test_an_objectives_non_finite_loss_is_named(tmp_path, tokenizer, suite, caplog):
    """A NaN loss skipped the step with a warning that did not say whose loss it was (trial 7, O18)."""
    trainer = scripted_trainer(tmp_path, tokenizer, suite, Scripted("nan"), max_nonfinite_steps=1)
    with pytest.raises(
        RuntimeError, match=r"non-finite loss \(on this rank, the loss\(\) of objective\(s\) \['scripted'\]"
    ):
        trainer.train()


@pytest.mark.parametrize(
    "case, weighting, warned", [("no_signal", "dare", 1), ("ok", "dare", 0), ("no_signal", "static", 0)]
)
def test_a_term_without_a_probe_signal_is_warned_once(tmp_path, tokenizer, suite, caplog, case, weighting, warned):
    """A `TermOutput` with neither `logp_coef` nor `logit_grad` trained without a word (trial 7, O22), its DARE factor
    following the probe's stand-in (coefficient 1 per token: plain cross-entropy), not its loss. One warning at the
    first step that measures, naming the objective, the consequence and the fix; none with a signal or static
    weights (nothing is measured)."""
    import logging

    trainer = scripted_trainer(
        tmp_path, tokenizer, suite, Scripted(case), max_steps=3, dare_update_interval=1, weighting=weighting
    )
    with caplog.at_level(logging.WARNING, logger="trl_trapo.weighting"):
        trainer.train()
    found = [r.getMessage() for r in caplog.records if "neither logp_coef nor logit_grad" in r.getMessage()]
    assert len(found) == warned, found
    if warned:
        assert found[0].startswith("Objective 'scripted': loss() returned a TermOutput with neither"), found
        assert "dare/factor/scripted follows that gradient, not its loss's" in found[0]
        assert "Fix: return logp_coef=" in found[0] and "docs/seams.md" in found[0]


class SkipsSuperInit(Scripted):
    def __init__(self):  # no super().__init__: no name, weight, index
        self.case = "ok"


class SkipsSuperSetup(Scripted):
    def setup(self, setup):  # no super().setup(setup): self.index stays None
        self.prepared = True


class RenamedState(Scripted):
    def load_state_dict(self, state):
        self.count = state["count"]  # state_dict wrote "case"


def test_an_objective_skipping_the_base_class_or_failing_to_load_is_named(tmp_path, tokenizer, suite):
    """Trial 7 (O12, O13, X06): skipping super().__init__ raised Python's AttributeError ('name'); skipping
    super().setup crashed the collator at the first step (int(None)); a load_state_dict that raises gave a checkpoint
    error naming neither the objective nor its load_state_dict."""
    with pytest.raises(TypeError, match=r"SkipsSuperInit has no name, weight, index: .*call `super\(\).__init__"):
        scripted_trainer(tmp_path, tokenizer, suite, SkipsSuperInit())
    with pytest.raises(TypeError, match=r"'scripted' \(SkipsSuperSetup\): after setup\(\), self.index is None, not 3"):
        scripted_trainer(tmp_path, tokenizer, suite, SkipsSuperSetup())
    first = scripted_trainer(tmp_path / "first", tokenizer, suite, Scripted(), save_strategy="steps", save_steps=1)
    first.train()
    resumed = scripted_trainer(tmp_path / "resumed", tokenizer, suite, RenamedState(), max_steps=3)
    with pytest.raises(Exception, match=r"objective 'scripted' \(RenamedState\).load_state_dict raised KeyError"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "first" / "checkpoint-1"))


def test_an_objective_is_checked_at_construction(tmp_path, tokenizer, suite):
    with pytest.raises(TypeError, match=r"'scripted': state_dict\(\) must return a JSON-serialisable dict"):
        scripted_trainer(tmp_path, tokenizer, suite, Scripted("tensor_state"))
    with pytest.raises(TypeError, match="must be a list of trl_trapo.objectives.Objective, got Scripted"):
        check_objectives(Scripted())  # `objectives=obj`, not wrapped in a list

    class NoLoss(Objective):
        def take(self, n, step):
            return []

    with pytest.raises(TypeError, match=r"'half' \(NoLoss\) does not implement \['loss'\]"):
        check_objectives([NoLoss("half")])
    with pytest.raises(ValueError, match=r"weight=inf must be a finite number"):
        LanguageModelingObjective("digits", digits_corpus(), weight=float("inf"))
    assert LanguageModelingObjective("digits", digits_corpus(), weight=np.float32(0.5)).weight == 0.5
    for max_length in (1, 300):
        with pytest.raises(ValueError, match=rf"max_length={max_length} must be an int in \[2, 64\]"):
            TRAPOTrainer(
                build_tiny_model(tokenizer, config_path=MICRO_MODEL, seed=0),
                reward_funcs=exact_match_reward,
                args=TRAPOConfig(output_dir=str(tmp_path), **{**TINY_CONFIG, "curriculum_mixtures": FOUR_PHASES}),
                train_dataset=suite.rl_train,
                pretrain_dataset=suite.pretrain,
                processing_class=tokenizer,
                objectives=[LanguageModelingObjective("digits", digits_corpus(), max_length=max_length)],
            )


@pytest.mark.parametrize(
    "mixtures",
    [
        [float("nan"), 0.5, 0.5, 0.7, 0.2, 0.1, 0.1, 0.3, 0.6],
        [{"pretrain": float("nan"), "rl": 1.0}] * 3,
        [{"pretrain": float("inf"), "rl": 1.0}] * 3,
    ],
)
def test_non_finite_curriculum_shares_are_refused(mixtures):
    """A NaN share passed validation (NaN compares False) and every step was then skipped as non-finite."""
    with pytest.raises(ValueError, match="curriculum_mixtures"):
        TRAPOConfig(output_dir="unused", curriculum_mixtures=mixtures)


def test_an_objectives_own_metrics_are_logged_and_an_idle_share_is_warned(tmp_path, tokenizer, suite, caplog):
    trainer = scripted_trainer(tmp_path, tokenizer, suite, Scripted())
    trainer.train()
    assert any(entry.get("scripted/seen") == 1.0 for entry in trainer.state.log_history)
    idle = LanguageModelingObjective("idle", digits_corpus(), weight=0.0)
    with caplog.at_level("WARNING"):
        scripted_trainer(
            tmp_path / "idle",
            tokenizer,
            suite,
            idle,
            curriculum_mixtures=[{"pretrain": 0.4, "sft": 0.2, "rl": 0.2, "idle": 0.2}] * 3,
        )
    assert "['idle'] have a curriculum share but no data or a weight of 0" in caplog.text
