"""Probe (g): does TRL 1.12 PPO deep-copy the reference model under DeepSpeed ZeRO-3?

Code (``ppo_trainer.py``, ``PPOTrainer.__init__``): ``if ref_model: use it; elif PEFT: None; else:
create_reference_model(self.policy_model)``, and ``create_reference_model`` (``trl/experimental/utils.py``) raises
``ValueError`` when ``transformers``' ``is_deepspeed_zero3_enabled()`` is true, otherwise ``deepcopy(model)``.
This runs the constructor (only the constructor: no DeepSpeed engine is started, that needs a real ZeRO-3 launch) with
ZeRO-3 switched on the two ways users do it, each in a fresh subprocess:

* ``env``: the environment ``accelerate launch --use_deepspeed --zero_stage 3`` sets (``ACCELERATE_USE_DEEPSPEED``,
  ``ACCELERATE_DEEPSPEED_ZERO_STAGE=3``), which ``TrainingArguments.__post_init__`` turns into a ``DeepSpeedPlugin``
  plus the global ZeRO-3 weakref;
* ``args``: ``PPOConfig(deepspeed={... "zero_optimization": {"stage": 3}})``;

and, as a control, ``none`` (no DeepSpeed: the reference is a deepcopy of the policy). DeepSpeed is not a venv
dependency; install it beside TRL 1.12 (about 20 s, no compiled ops)::

    .venv/bin/pip install --no-deps --target /work/ds019 "deepspeed==0.19.8" hjson msgpack ninja py-cpuinfo einops

and point ``$DEEPSPEED_PATH`` at it (default ``/work/ds019``).
Run: ``.venv/bin/python dev/ppo_1_12/probes/probe_g_zero3_reference.py``.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


DS_PATH = os.environ.get("DEEPSPEED_PATH", "/work/ds019")
DS_CONFIG = {
    "zero_optimization": {"stage": 3},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
}


def scenario(name: str) -> None:
    sys.path.insert(0, DS_PATH)
    if name == "env":
        os.environ.update(
            {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3", "ACCELERATE_USE_CPU": "true"}
        )
    import _common as c
    from datasets import Dataset
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    models = c.make_models(seed=0)
    extra = {"deepspeed": DS_CONFIG} if name == "args" else {}
    out = {"scenario": name}
    try:
        args = c.PPOConfig(output_dir=tempfile.mkdtemp(prefix="probe_g_"), **{**c._BASE_PROBE_CFG, **extra})
    except Exception as exc:  # noqa: BLE001 - recorded for the report
        out["PPOConfig"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        print("RESULT " + json.dumps(out))
        return
    out["PPOConfig"] = "ok"
    out["is_deepspeed_zero3_enabled"] = is_deepspeed_zero3_enabled()
    try:
        trainer = c.PPOTrainer(
            args, c.make_tokenizer(), models["policy"], None, models["reward"],
            Dataset.from_dict({"input_ids": c.PROMPTS}), models["value"],
        )  # fmt: skip
        ref = trainer.ref_model
        out["PPOTrainer"] = "ok"
        out["ref_is_separate_copy"] = ref is not None and ref is not models["policy"]
        out["ref_shares_storage_with_policy"] = any(
            a.data_ptr() == b.data_ptr() for a, b in zip(ref.parameters(), models["policy"].parameters())
        )
    except Exception as exc:  # noqa: BLE001 - recorded for the report
        out["PPOTrainer"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    print("RESULT " + json.dumps(out))


def main() -> None:
    if not Path(DS_PATH, "deepspeed").exists():
        print(f"deepspeed not found under {DS_PATH}; reporting from code reading only (see module docstring)")
    results = {}
    for name in ("none", "env", "args"):
        proc = subprocess.run(
            [sys.executable, __file__, "--scenario", name], capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
        )  # fmt: skip
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        results[name] = json.loads(line[-1][7:]) if line else {"error": proc.stderr[-1500:]}
        print(f"{name}: {results[name]}")
    refused = str(results["env"].get("PPOTrainer", "")).startswith("ValueError: DeepSpeed ZeRO-3 is enabled")
    copied_none = results["none"].get("ref_is_separate_copy") and not results["none"].get(
        "ref_shares_storage_with_policy"
    )
    args_cfg = results["args"].get("PPOConfig", "?")
    print(f"no DeepSpeed -> reference deep-copied from the policy: {copied_none}")
    import _common

    _common.verdict(
        "g",
        not refused,
        (
            "1.12 does not deep-copy under ZeRO-3: with ref_model=None and a non-PEFT policy, create_reference_model "
            "raises ValueError('DeepSpeed ZeRO-3 is enabled and is not compatible with create_reference_model()') "
            "in the constructor (users must pass ref_model, which is then wrapped by prepare_deepspeed, or use PEFT); "
            "without DeepSpeed the reference is a deepcopy of the policy. Separate bug: PPOConfig(deepspeed=...) "
            f"fails in __post_init__ ({args_cfg}) because PPOConfig's `world_size` field (None) shadows "
            "TrainingArguments.world_size"
        )
        if refused
        else "ZeRO-3 did not stop the deepcopy of the reference model",
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--scenario":
        scenario(sys.argv[2])
    else:
        main()
