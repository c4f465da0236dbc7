"""Probe (f): with a PEFT policy whose adapter is already trained, what does TRL 1.12 PPO use as the reference?

Builds a tiny Llama policy, wraps it with LoRA (``get_peft_model``) and gives the adapter non-zero, seeded weights (a
"trained" adapter, e.g. the SFT result). Passes that ``PeftModel`` as ``model`` with ``ref_model=None`` and no
``peft_config`` (the documented PEFT path), runs one PPO update with injected rollouts, and compares 1.12's
``ref_logprobs`` with the logprobs of (1) the base model (adapter disabled) and (2) the policy with the trained
adapter. Also checks the ``ref_adapter_name`` route (a second adapter "ref" holding a copy of the trained weights).
Run: ``.venv/bin/python dev/ppo_1_12/probes/probe_f_peft_reference.py``.
"""

import copy

import _common as c
import torch
from peft import LoraConfig, get_peft_model


RESPONSES = [[5, 9, c.E, c.P, c.P, c.P], [7, 3, 11, 4, 8, 6], [8, 17, 5, 2, c.E, c.P], [12, c.E, c.P, c.P, c.P, c.P]]
LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "o_proj"], "lora_dropout": 0.0}


def trained_peft_policy(models):
    peft_model = get_peft_model(models["policy"], LoraConfig(**LORA))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return peft_model


def logprobs_of(model, cap, temperature: float) -> torch.Tensor:
    ctx = cap["context_length"]
    with torch.no_grad():
        out = c.ppo_mod.forward(model, cap["query_responses"], c.PAD_ID)
        logits = out.logits[:, ctx - 1 : -1] / (temperature + 1e-7)
        lp = torch.log_softmax(logits, -1).gather(-1, cap["responses"].unsqueeze(-1)).squeeze(-1)
    return torch.masked_fill(lp, cap["padding_mask"], 1.0)


def main() -> None:
    # --- default PEFT path: ref_model=None, no ref_adapter_name --------------------------------------------------
    models = c.make_models(seed=0)
    peft_model = trained_peft_policy(models)
    snapshot = copy.deepcopy(peft_model)  # the trained adapter as handed to the trainer
    models["policy"] = peft_model
    trainer, cap = c.run_ppo(RESPONSES, models=models, ref_model=None)
    print(f"trainer.is_peft_model={trainer.is_peft_model} trainer.ref_model={trainer.ref_model}")
    with snapshot.disable_adapter():
        base_lp = logprobs_of(snapshot, cap, 0.7)
    adapter_lp = logprobs_of(snapshot, cap, 0.7)
    d_base = (cap["ref_logprobs"] - base_lp).abs().max().item()
    d_adapter = (cap["ref_logprobs"] - adapter_lp).abs().max().item()
    d_rollout = (cap["logprobs"] - adapter_lp).abs().max().item()
    print(f"max |ref_logprobs - base(adapter disabled)|   = {d_base:.3e}")
    print(f"max |ref_logprobs - policy(trained adapter)|  = {d_adapter:.3e}")
    print(f"max |rollout logprobs - policy(trained adapter)| = {d_rollout:.3e}")
    print(
        "objective/kl at the first update (policy == trained adapter, nothing trained yet) = "
        f"{cap['metrics']['objective/kl']:.6f}"
    )
    ref_is_base = d_base < 1e-5 and d_adapter > 1e-3

    # --- workaround: a named reference adapter (ref_adapter_name) ------------------------------------------------
    models2 = c.make_models(seed=0)
    peft2 = trained_peft_policy(models2)
    peft2.add_adapter("ref", LoraConfig(**LORA))
    with torch.no_grad():
        params = dict(peft2.named_parameters())
        for name, p in params.items():
            if ".ref." in name:
                p.copy_(params[name.replace(".ref.", ".default.")])
    peft2.set_adapter("default")
    models2["policy"] = peft2
    ref_before = {n: p.detach().clone() for n, p in peft2.named_parameters() if ".ref." in n}
    _, cap2 = c.run_ppo(
        RESPONSES, models=models2, ref_model=None, ref_adapter_name="ref", model_adapter_name="default"
    )
    d2 = (cap2["ref_logprobs"] - cap2["logprobs"]).abs().max().item()
    print(
        f"with ref_adapter_name='ref' (copy of the trained adapter): max |ref_logprobs - rollout logprobs| = {d2:.3e}"
    )
    after = dict(peft2.named_parameters())
    ref_frozen = all(torch.equal(after[n], v) for n, v in ref_before.items())
    default_moved = any(not torch.equal(after[n.replace(".ref.", ".default.")], v) for n, v in ref_before.items())
    print(f"after the update: 'ref' adapter unchanged={ref_frozen}, 'default' adapter changed={default_moved}")

    c.verdict(
        "f",
        ref_is_base,
        "with a PeftModel and ref_model=None the reference is the adapter-DISABLED base model "
        "(null_ref_context -> disable_adapter()), not a frozen copy of the already-trained adapter, so the KL "
        f"anchor is the pre-SFT base (ref==base: {ref_is_base}); only setting ref_adapter_name to an extra adapter "
        f"holding a copy of the trained weights gives the intended reference (diff {d2:.1e})",
    )


if __name__ == "__main__":
    main()
