"""Exact reproduction of TRL 1.12's `PPOTrainer` where 1.12 is bug-free (golden fixtures `exact_*`).

The fixtures (`tests/fixtures/ppo_1_12/cases/exact_*.json`, made by `dev/ppo_1_12/make_ppo_fixtures.py` from the REAL
TRL 1.12.0 trainer) inject responses of the two kinds 1.12 handles correctly — no EOS, or EOS as the last token, no
PAD anywhere — with `num_mini_batches=1` and a dataset of two rollout batches of which one is used, in fp32. Our
`PPOTrainer` is built with the same models, tokenizer and config (plus a constant learning-rate schedule, as 1.12's
is within one rollout batch, and no gradient clipping, which 1.12 never did), is fed the same queries and responses
in the same rollout-batch order through `process_rollouts`, and must reproduce, to 1e-5 (+ 1e-6 relative, which only
matters for the few quantities above 1):

- the rollout: behaviour log-probs, reference log-probs, values, scores (after `missing_eos_penalty`), the per-token
  KL, non-score rewards and rewards (recomputed with our pure `losses` functions from the trajectory fields, since a
  trajectory does not store them), and the advantages and returns stored in our trajectories;
- every micro-batch of both optimizer steps (one per PPO epoch), formed from 1.12's recorded permutations:
  `pg_loss`, `vf_loss`, the total loss, the new log-probs, values, clip fractions, approx-KL, ratio and entropy;
- the accumulated gradient of each optimizer step, and the policy and critic weights after it (same fused AdamW,
  weight decay 0, constant lr);
- and, end to end, the weights after our own `train()` loop (which groups rows into micro-batches its own way:
  every response has the same length, so the per-micro-batch means average to the same loss).

The gradients are the strict check (AdamW is blind to a rescaled gradient on its first step, so the weights alone
would not catch a wrong loss normalisation). Their tolerance comes from fp32 error analysis, not from one machine's
run: a sum of n terms computed in floating point is within gamma_n * sum_i |x_i| of the exact sum, gamma_n ~ n * u
with u = 2^-24 the fp32 unit roundoff (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., eq. 3.5).
A gradient entry is a chain of such reductions — over the step's tokens, the vocabulary (softmax), the hidden and
MLP widths, the attention span — and the relative errors of a chain add, so each entry is within
u * n_red * sum|terms| of the exact value, with n_red the summed length of those reductions (`reduction_length`).
Two correct implementations that only order their sums differently (AVX2 vs AVX-512 kernels, another BLAS blocking,
another micro-batching) are each within that bound, hence within twice it of each other. The bound is taken relative
to the *tensor's* gradient scale, max |g| over the parameter tensor, not per entry: an entry that cancellation left
tiny carries the rounding of its large terms, which a per-entry relative tolerance cannot allow for (that is how the
old rule, 1e-7 + 1e-5 * |g|, failed on AVX2 machines with 4.2e-7 on embedding gradients of scale ~0.05). So

    |g_ours - g_1.12| <= 2 * u * n_red * max |g_1.12|     (per parameter tensor; ~3e-5 * max |g| here).

A real formula error moves gradients by a sizeable fraction of their scale, orders of magnitude above this;
`test_gradient_tolerance_catches_formula_errors` checks that dropping the advantage whitening, or moving the KL
penalty from the reward into the loss, fails it.

The weights need one justified relaxation of the 1e-5:
AdamW's update lr * m / (sqrt(v) + eps) is ~lr * sign(g) whatever |g|, so on a gradient entry that cancellation left
at ~1e-7 the last bits of the sum decide a visible part of an lr-sized update (seen: 4.3e-6 on one critic weight,
against <= 1.2e-7 everywhere else). The weights are therefore compared with atol = 1e-5 + sum_k 2 * lr * d_k /
(sqrt(v_k) + eps): twice the first-order change of AdamW's update caused by the gradient difference actually measured
(d_k = max over steps <= k of |g_ours - g_1.12|, elementwise), with v_k from 1.12's recorded gradients. Where the
gradients agree bit for bit (e.g. embedding rows of unused tokens) the tolerance is exactly 1e-5.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

from trl_trapo import PPOConfig, PPOTrainer
from trl_trapo.collator import StepContext, collate_rows
from trl_trapo.losses import kl_estimate, masked_whiten, per_token_rewards
from trl_trapo.rollout import cut_after_stop
from trl_trapo.sources import SampledRound


torch.set_num_threads(1)

FIXTURES = Path(__file__).parent / "fixtures" / "ppo_1_12"
CASES = [
    f"exact_{kl}_{whiten}_{penalty}"
    for kl in ("k1", "k3")
    for whiten in ("nowhiten", "whiten")
    for penalty in ("nopenalty", "penalty")
]
ATOL = 1e-5
RTOL = 1e-6  # ~8 fp32 ulps: only matters for the few quantities above 1 (k3 KL reaches 17, log-probs -10)
FP32_UNIT_ROUNDOFF = 2.0**-24
NO_OBJECTIVE_BUT_RL = (0.0, 0.0, 1.0)  # loss weights (pretrain, sft, rl) of a PPO-only step


def close(actual, expected, what: str, atol: float | torch.Tensor = ATOL, rtol: float = RTOL) -> None:
    """Assert |actual - expected| <= atol + rtol * |expected| elementwise (atol may be a tensor)."""
    actual = torch.as_tensor(actual, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    if not actual.numel():
        return
    diff = (actual - expected).abs()
    excess = (diff - atol - rtol * expected.abs()).max().item()
    assert excess <= 0, (
        f"{what}: max |ours - 1.12| = {diff.max().item():.3e} exceeds the tolerance by {excess:.3e}"
        f"\nours={actual}\n1.12={expected}"
    )


def modules(trainer: PPOTrainer):
    return (("policy", trainer.model.policy), ("value_model", trainer.model.value_model))


def reduction_length(case: dict) -> int:
    """n_red of the module docstring: the summed lengths of the reductions a gradient entry goes through — the
    tokens of one optimizer step (every row of the rollout batch, queries without padding plus responses), the
    vocabulary, the hidden and MLP widths and the longest sequence (attention)."""
    config = json.loads((FIXTURES / case["models"]["policy"] / "config.json").read_text())
    pad = case["tokenizer"]["pad_token_id"]
    lengths = [
        sum(t != pad for t in q) + len(r) for q, r in zip(case["rollout"]["queries"], case["rollout"]["responses"])
    ]
    return sum(lengths) + config["vocab_size"] + config["hidden_size"] + config["intermediate_size"] + max(lengths)


def gradient_tolerance(expected: torch.Tensor, case: dict) -> float:
    """2 * u * n_red * max |g| of one parameter tensor (see the module docstring)."""
    return 2 * FP32_UNIT_ROUNDOFF * reduction_length(case) * float(expected.abs().max())


def assert_gradients(ours: dict[str, torch.Tensor], steps: dict, step: int, case: dict) -> None:
    """The accumulated gradient of optimizer step `step` equals 1.12's (`ours`: "<prefix>.<name>" -> grad)."""
    for key, grad in ours.items():
        expected = steps[f"step{step}.grad.{key}"]
        close(grad, expected, f"gradient of {key}, step {step}", gradient_tolerance(expected, case), rtol=0.0)


def adam_tolerance(ours: list[torch.Tensor], theirs: list[torch.Tensor], case: dict) -> torch.Tensor:
    """Elementwise tolerance of a weight after len(ours) AdamW steps with these gradients (see the module docstring)."""
    beta2, eps = case["optimizer"]["betas"][1], case["optimizer"]["eps"]
    lr = case["ppo_config"]["learning_rate"]
    v = torch.zeros_like(theirs[0], dtype=torch.float64)
    difference = torch.zeros_like(v)
    tolerance = torch.full_like(v, ATOL)
    for k, (mine, grad) in enumerate(zip(ours, theirs), start=1):
        v = beta2 * v + (1 - beta2) * grad.double() ** 2
        difference = torch.maximum(difference, (mine.double() - grad.double()).abs())  # bounds |d m|, |d sqrt(v)|
        tolerance += 2 * lr * difference / ((v / (1 - beta2**k)).sqrt() + eps)
    return tolerance


def assert_weights(trainer: PPOTrainer, expected: dict, grads: list[dict], steps: dict, case: dict, when: str) -> None:
    """Policy and critic weights equal 1.12's (`expected["<prefix>.<name>"]`) after the steps whose gradients (ours)
    are `grads`."""
    for prefix, module in modules(trainer):
        for name, param in module.named_parameters():
            key = f"{prefix}.{name}"
            theirs = [steps[f"step{k}.grad.{key}"] for k in range(1, len(grads) + 1)]
            tolerance = adam_tolerance([g[key] for g in grads], theirs, case)
            close(param, expected[key], f"{key} {when}", tolerance, rtol=0.0)


class GradientRecorder(TrainerCallback):
    """Keeps the accumulated gradients right before each optimizer step of `train()`."""

    def __init__(self, trainer: PPOTrainer):
        self.trainer, self.grads = trainer, []

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.grads.append(
            {f"{p}.{n}": w.grad.detach().clone() for p, m in modules(self.trainer) for n, w in m.named_parameters()}
        )


def load_case(name: str) -> dict:
    return json.loads((FIXTURES / "cases" / f"{name}.json").read_text())


def build(case: dict, tmp_path, rollout_source=None, **overrides) -> PPOTrainer:
    """Our PPOTrainer on the fixture's models, tokenizer, dataset and config (`overrides` change config fields)."""
    config = {k: v for k, v in case["ppo_config"].items() if k not in ("output_dir", "report_to")}
    config.update(overrides)
    args = PPOConfig(
        output_dir=str(tmp_path / "out"),
        report_to="none",
        lr_scheduler_type="constant",  # 1.12 steps its (linear) scheduler once per rollout batch, after the update
        max_grad_norm=0.0,  # 1.12 never clipped gradients
        activation_checkpointing=False,
        **config,
    )
    models = FIXTURES / "models"
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "tokenizer")
    return PPOTrainer(
        args,
        tokenizer,
        AutoModelForCausalLM.from_pretrained(models / "policy"),
        AutoModelForCausalLM.from_pretrained(models / "ref"),
        AutoModelForSequenceClassification.from_pretrained(models / "reward", num_labels=1),
        Dataset.from_dict({"input_ids": case["dataset_prompts"]}),
        AutoModelForSequenceClassification.from_pretrained(models / "value", num_labels=1),
        rollout_source=rollout_source,
    )


def injected_rollout(trainer: PPOTrainer, case: dict) -> tuple[list[dict], list[torch.Tensor], list[torch.Tensor]]:
    """The fixture's rollout batch, in 1.12's order: dataset rows (unpadded queries) and the injected responses."""
    pad = case["tokenizer"]["pad_token_id"]
    examples = []
    for query in case["rollout"]["queries"]:
        ids = query[next(i for i, t in enumerate(query) if t != pad) :]  # strip the left padding
        examples.append({"prompt": trainer.processing_class.decode(ids), "prompt_ids": ids})
    completions = [torch.tensor(r) for r in case["rollout"]["responses"]]
    return examples, completions


def process(trainer: PPOTrainer, case: dict) -> tuple[list[dict], torch.Tensor]:
    """`process_rollouts` on the injected rollout; also returns the scores it used (observed, not recomputed)."""
    seen = {}
    make_trajectories = trainer.rollouts.make_trajectories

    def spy(prompt_ids, completion_ids, old_logps, ref_logps, values, scores, is_truncated, group, *rest, **kwargs):
        seen["scores"] = scores.clone()
        return make_trajectories(
            prompt_ids, completion_ids, old_logps, ref_logps, values, scores, is_truncated, group, *rest, **kwargs
        )

    trainer.rollouts.make_trajectories = spy
    try:
        examples, completions = injected_rollout(trainer, case)
        trajectories = trainer.process_rollouts(examples, completions)
    finally:
        del trainer.rollouts.make_trajectories
    return trajectories, seen["scores"]


def stack(trajectories: list[dict], key: str) -> torch.Tensor:
    return torch.stack([getattr(t, key) for t in trajectories])


@pytest.fixture(scope="module", params=CASES)
def case(request):
    return load_case(request.param)


def test_fixture_is_in_the_exact_domain(case):
    """Guard: the fixture only holds what 1.12 gets right (else an exact match would prove nothing)."""
    eos, pad = case["tokenizer"]["eos_token_id"], case["tokenizer"]["pad_token_id"]
    assert case["trl_version"] == "1.12.0" and case["ppo_config"]["num_mini_batches"] == 1
    batch_size = case["derived_args"]["batch_size"]
    assert case["ppo_config"]["total_episodes"] == batch_size and len(case["dataset_prompts"]) >= 2 * batch_size
    for response in case["rollout"]["responses"]:
        assert pad not in response and eos not in response[:-1]
    # one optimizer step per PPO epoch (per mini-batch), at its last micro-batch, at a constant learning rate
    stepped = [mb["optimizer_stepped"] for mb in case["micro_batches"]]
    ga = case["ppo_config"]["gradient_accumulation_steps"]
    assert stepped == ([False] * (ga - 1) + [True]) * case["ppo_config"]["num_ppo_epochs"]
    assert case["step_lrs"] == [case["ppo_config"]["learning_rate"]] * case["ppo_config"]["num_ppo_epochs"]
    # masks from lengths and 1.12's masks from pad ids agree here
    assert not any(any(row) for row in case["rollout"]["padding_mask_p1"])


def test_rollout_matches_trl_1_12(case, tmp_path):
    trainer = build(case, tmp_path)
    rollout = case["rollout"]
    trajectories, scores = process(trainer, case)
    assert len(trajectories) == len(rollout["responses"])
    for t, response in zip(trajectories, rollout["responses"]):
        assert t.completion_ids.tolist() == response and bool(t.completion_mask.all())
    old = stack(trajectories, "old_per_token_logps")
    ref = stack(trajectories, "ref_per_token_logps")
    close(old, rollout["logprobs"], "rollout log-probs")
    close(ref, rollout["ref_logprobs"], "reference log-probs")
    close(stack(trajectories, "old_values"), rollout["values"], "values")
    close(scores, rollout["scores"], "scores (after missing_eos_penalty)")
    penalty = case["ppo_config"]["missing_eos_penalty"] or 0.0
    expected = torch.tensor(rollout["scores_raw"]) - penalty * ~torch.tensor(rollout["contain_eos_token"])
    close(scores, expected, "scores = reward-model score - penalty * (no stop token)")

    # per-token rewards, recomputed from our trajectory fields with our pure functions
    args = trainer.args
    mask = stack(trajectories, "completion_mask")
    kl = kl_estimate(old, ref, args.kl_estimator)
    rewards, non_score = per_token_rewards(scores, kl, mask, args.kl_coef)
    close(kl, rollout["kl"], f"per-token KL ({args.kl_estimator})", atol=kl_tolerance(old, ref, rollout, args))
    close(non_score, rollout["non_score_reward"], "non-score rewards")
    close(rewards, rollout["rewards_before_whiten"], "rewards before whitening")
    if args.whiten_rewards:
        rewards = masked_whiten(rewards, mask, shift_mean=False) * mask
    close(rewards, rollout["rewards"], "rewards (what GAE used)")

    # advantages and returns: straight from our trajectories
    close(stack(trajectories, "advantages"), rollout["advantages"], "advantages (whitened)")
    close(stack(trajectories, "returns"), rollout["returns"], "returns")


def kl_tolerance(old: torch.Tensor, ref: torch.Tensor, rollout: dict, args) -> torch.Tensor:
    """The per-token KL's tolerance: ATOL plus twice the propagation of the log-prob differences actually measured
    against 1.12 (each within ATOL, checked above). With r = ref - old, k1 = -r moves by |dr|, k3 = e^r - 1 - r by
    |e^r - 1| |dr| (+ e^r dr^2 / 2): where the reference is 7x likelier than the policy (k3 ~ 5) a log-prob that
    rounds 2.6e-6 nats differently — fp32 log-softmax over the vocabulary, summed in another order by another kernel —
    moves k3 by 1.8e-5, above a flat 1e-5 (seen on an AVX-512 Xeon). A formula error moves k by O(k)."""
    expected_old = torch.tensor(rollout["logprobs"], dtype=torch.float64)
    expected_ref = torch.tensor(rollout["ref_logprobs"], dtype=torch.float64)
    dr = (old.double() - expected_old).abs() + (ref.double() - expected_ref).abs()
    r = ref.double() - old.double()
    slope = torch.ones_like(r) if args.kl_estimator == "k1" else (r.exp() - 1).abs()
    return ATOL + 2 * (slope * dr + 0.5 * r.exp() * dr**2)


def test_optimizer_steps_match_trl_1_12(case, tmp_path):
    """Both optimizer steps of the update, micro-batch by micro-batch, on 1.12's own micro-batches."""
    trainer = build(case, tmp_path)
    trajectories, _ = process(trainer, case)
    rows = [t.to_row() for t in trajectories]
    model = trainer.model
    model.train()
    optimizer = trainer.create_optimizer()
    recorded = case["optimizer"]
    assert type(optimizer).__name__ == recorded["class"] == "AdamW"
    for key in ("betas", "eps", "fused", "amsgrad", "maximize"):
        value = optimizer.defaults[key]
        assert (list(value) if isinstance(value, tuple) else value) == recorded[key], key
    assert [g["weight_decay"] for g in optimizer.param_groups] == [g["weight_decay"] for g in recorded["param_groups"]]
    assert all(g["lr"] == case["ppo_config"]["learning_rate"] for g in optimizer.param_groups)

    args = trainer.args
    num_micro = args.gradient_accumulation_steps  # per optimizer step (= per mini-batch)
    assert num_micro == case["ppo_config"]["gradient_accumulation_steps"]
    counts = {
        "tokens_pretrain": 0.0,
        "tokens_sft": 0.0,
        "tokens_rl": float(sum(r.mask.sum() for r in rows)),
        "sequences_rl": float(len(rows)),
        "micro_batches_rl": float(num_micro),
    }
    steps = safetensors.torch.load_file(FIXTURES / case["step_weights"])
    pad = trainer.processing_class.pad_token_id
    grads = []  # ours, per optimizer step
    for epoch in range(case["ppo_config"]["num_ppo_epochs"]):
        micro_batches = [mb for mb in case["micro_batches"] if mb["ppo_epoch"] == epoch]
        assert len(micro_batches) == num_micro
        assert [i for mb in micro_batches for i in mb["indices"]] == case["permutations"][epoch]
        info = StepContext(
            weights=NO_OBJECTIVE_BUT_RL,
            counts=counts,
            probe=False,
            step=epoch,
            num_micro=num_micro,
        )
        optimizer.zero_grad(set_to_none=True)
        for mb in micro_batches:
            batch = collate_rows([rows[i] for i in mb["indices"]], pad)
            trainer.metrics.reset()
            loss = trainer.compute_loss(model, batch, num_items_in_batch=info)
            stats = {k: float(v) * num_micro for k, v in trainer.metrics.step_sums.items()}  # per-micro-batch values
            where = f"epoch {epoch} micro-batch {mb['grad_accum_idx']}"
            close(stats["loss/policy_avg"], mb["pg_loss"], f"pg_loss, {where}")
            close(stats["loss/value_avg"], mb["vf_loss"], f"vf_loss, {where}")
            close(loss.detach() * num_micro, mb["loss"], f"loss = pg_loss + vf_coef * vf_loss, {where}")
            close(stats["policy/clipfrac_avg"], mb["pg_clipfrac"], f"pg_clipfrac, {where}")
            close(stats["val/clipfrac_avg"], mb["vf_clipfrac"], f"vf_clipfrac, {where}")
            close(stats["policy/approxkl_avg"], mb["approxkl"], f"approxkl, {where}")
            close(stats["val/ratio"], mb["ratio"], f"ratio mean, {where}")
            close(stats["policy/entropy_avg"], mb["entropy"], f"entropy mean, {where}")
            with torch.no_grad():  # the new log-probs and values themselves
                outputs, values = model(
                    input_ids=batch["input_ids"],
                    attention_mask=batch["attention_mask"],
                    value_rows=torch.arange(len(mb["indices"])),
                )
                logps = torch.log_softmax(outputs.logits[:, :-1] / args.temperature, -1)
                logps = logps.gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
                target = batch["mask"].bool()
                width = len(mb["new_logprobs"][0])
                close(logps[target].view(-1, width), mb["new_logprobs"], f"new log-probs, {where}")
                close(values[:, :-1][target].view(-1, width), mb["vpred"], f"value predictions, {where}")
            loss.backward()
        step = epoch + 1
        grads.append(
            {f"{p}.{n}": w.grad.detach().clone() for p, m in modules(trainer) for n, w in m.named_parameters()}
        )
        assert_gradients(grads[-1], steps, step, case)
        optimizer.step()
        after = {k[len(f"step{step}.") :]: v for k, v in steps.items() if k.startswith(f"step{step}.")}
        assert_weights(trainer, after, grads, steps, case, f"after step {step}")


class InjectedRollouts:
    """A rollout source that returns the fixture's rollout batch every round, sampled by the current policy version
    (the behaviour log-probs are left to the trainer: the current policy's, as 1.12 computed them), its completions cut
    after the stop token as the trainer cuts given ones. `examples`, `completions`, `stop_token_ids` and
    `num_mini_batches` are set once the trainer exists (they need its tokenizer and configuration)."""

    def __init__(self):
        self.examples: list[dict] = []
        self.completions: list[torch.Tensor] = []
        self.stop_token_ids: list[int] = []
        self.num_mini_batches = 1

    def sample(self, rows_needed: int, step: int) -> SampledRound:
        assert rows_needed * self.num_mini_batches == len(self.examples)
        completions = [cut_after_stop(c, self.stop_token_ids) for c in self.completions]
        return SampledRound(self.examples, completions, version=step)


def test_train_loop_reproduces_trl_1_12_weights(case, tmp_path):
    """Our own `train()` (micro-batching, accumulation, optimizer, scheduler) ends where 1.12 ended."""
    source = InjectedRollouts()
    trainer = build(case, tmp_path, rollout_source=source)
    source.examples, source.completions = injected_rollout(trainer, case)
    source.stop_token_ids, source.num_mini_batches = trainer.rollouts.stop_token_ids, trainer.args.num_mini_batches
    recorder = GradientRecorder(trainer)
    trainer.add_callback(recorder)
    trainer.train()
    assert trainer.state.global_step == case["ppo_config"]["num_ppo_epochs"]
    assert trainer.state.episode == case["episode"]
    lrs = [h["lr"] for h in trainer.state.log_history if "lr" in h]
    assert lrs and all(lr == case["ppo_config"]["learning_rate"] for lr in lrs)
    steps = safetensors.torch.load_file(FIXTURES / case["step_weights"])
    assert len(recorder.grads) == trainer.state.global_step
    for step, grads in enumerate(recorder.grads, start=1):
        assert_gradients(grads, steps, step, case)
    final = safetensors.torch.load_file(FIXTURES / case["final_weights"])
    assert_weights(trainer, final, recorder.grads, steps, case, "after train()")


def first_step_gradients(trainer: PPOTrainer, case: dict) -> dict[str, torch.Tensor]:
    """The accumulated gradient of the first optimizer step, on 1.12's first-epoch micro-batches."""
    trajectories, _ = process(trainer, case)
    rows = [t.to_row() for t in trajectories]
    model = trainer.model
    model.train()
    num_micro = trainer.args.gradient_accumulation_steps
    info = StepContext(
        weights=NO_OBJECTIVE_BUT_RL,
        counts={
            "tokens_pretrain": 0.0,
            "tokens_sft": 0.0,
            "tokens_rl": float(sum(r.mask.sum() for r in rows)),
            "sequences_rl": float(len(rows)),
            "micro_batches_rl": float(num_micro),
        },
        probe=False,
        step=0,
        num_micro=num_micro,
    )
    model.zero_grad(set_to_none=True)
    for mb in (mb for mb in case["micro_batches"] if mb["ppo_epoch"] == 0):
        batch = collate_rows([rows[i] for i in mb["indices"]], trainer.processing_class.pad_token_id)
        trainer.compute_loss(model, batch, num_items_in_batch=info).backward()
    return {f"{p}.{n}": w.grad.detach().clone() for p, m in modules(trainer) for n, w in m.named_parameters()}


@pytest.mark.parametrize(
    "mutation",
    [
        pytest.param({"whiten_advantages": False}, id="whitening-dropped"),
        pytest.param({"kl_penalty": "loss", "kl_estimator": "k3"}, id="kl-moved-from-reward-to-loss"),
    ],
)
def test_gradient_tolerance_catches_formula_errors(case, tmp_path, mutation):
    """The error-analysis tolerance is loose enough for another machine's rounding, and still catches a wrong
    formula by a wide margin: the worst parameter tensor misses it by more than 10x."""
    steps = safetensors.torch.load_file(FIXTURES / case["step_weights"])
    grads = first_step_gradients(build(case, tmp_path, **mutation), case)
    with pytest.raises(AssertionError, match="gradient of"):
        assert_gradients(grads, steps, 1, case)
    worst = max(
        float((g.double() - steps[f"step1.grad.{key}"].double()).abs().max())
        / max(gradient_tolerance(steps[f"step1.grad.{key}"], case), 1e-30)
        for key, g in grads.items()
    )
    assert worst > 10, worst
    # control: the unmutated formula passes the same check on the same path
    assert_gradients(first_step_gradients(build(case, tmp_path), case), steps, 1, case)
