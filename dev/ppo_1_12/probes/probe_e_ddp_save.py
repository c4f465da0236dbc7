"""Probe (e): does TRL 1.12 ``PPOTrainer.save_model`` save the policy correctly when the model is DDP-wrapped?

Run plainly, it launches itself with ``accelerate launch --multi_gpu --num_processes 2`` (on this GPU-less machine
that is torchrun + torch.distributed on CPU with the gloo backend; note ``accelerate launch --cpu --num_processes 2``
starts a single process in accelerate 1.15 -- ``--cpu`` always takes the simple launcher), where
each rank trains one PPO update with injected rollouts on tiny seeded models and then calls
``trainer.save_model(<tmp>/saved)`` (exceptions are caught and recorded per rank). Rank 0 also writes the trained
policy's own state dict. The parent then inspects what was saved: file list, tensor names, whether
``AutoModelForCausalLM.from_pretrained`` loads it, and whether the weights equal the trained policy.
Run: ``.venv/bin/python dev/ppo_1_12/probes/probe_e_ddp_save.py``.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


RESPONSES = [[5, 9, 1, 0, 0, 0], [7, 3, 11, 4, 8, 6]]


def worker(out: Path) -> None:
    import _common as c
    import safetensors.torch

    rank = int(os.environ.get("RANK", "0"))
    result = {"rank": rank}
    trainer, cap = c.run_ppo(
        RESPONSES,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        total_episodes=4,
        output_dir=str(out / "run"),
    )
    result["world_size"] = trainer.accelerator.num_processes
    result["trainer.model type"] = type(trainer.model).__name__
    result["hasattr(trainer.model, 'policy')"] = hasattr(trainer.model, "policy")
    if rank == 0:
        policy = trainer.accelerator.unwrap_model(trainer.model).policy
        safetensors.torch.save_file(
            {k: v.detach().contiguous() for k, v in policy.state_dict().items()},
            str(out / "expected_policy.safetensors"),
        )
    try:
        trainer.save_model(str(out / "saved"))
        result["save_model"] = "ok"
    except Exception as exc:  # noqa: BLE001 - recorded for the report
        result["save_model"] = f"{type(exc).__name__}: {exc}"
    (out / f"rank{rank}.json").write_text(json.dumps(result))


def main() -> None:
    import _common as c  # noqa: F401 - asserts TRL 1.12 is importable
    import safetensors.torch
    import torch
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29517",
            __file__, "--worker", str(out),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent)}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        print(f"accelerate launch exit code: {proc.returncode}")
        if proc.returncode != 0:
            print(proc.stderr[-3000:])
        for rank in (0, 1):
            f = out / f"rank{rank}.json"
            print(f"rank {rank}: {json.loads(f.read_text()) if f.exists() else 'no result file'}")
        saved = out / "saved"
        files = sorted(p.name for p in saved.iterdir()) if saved.exists() else []
        print(f"saved files: {files}")
        has_bug = True
        if (saved / "model.safetensors").exists():
            tensors = safetensors.torch.load_file(str(saved / "model.safetensors"))
            names = sorted(tensors)
            print(f"saved tensor names ({len(names)}): {names[:4]} ... {names[-2:]}")
            expected = safetensors.torch.load_file(str(out / "expected_policy.safetensors"))
            try:
                model = AutoModelForCausalLM.from_pretrained(saved)
                sd = model.state_dict()
                same = all(torch.equal(sd[k], v) for k, v in expected.items())
                print(f"AutoModelForCausalLM.from_pretrained(saved) loaded; weights == trained policy: {same}")
                has_bug = not same or any(k.startswith(("module.", "policy.", "value_model.")) for k in names)
            except Exception as exc:  # noqa: BLE001
                print(f"AutoModelForCausalLM.from_pretrained(saved) failed: {type(exc).__name__}: {str(exc)[:300]}")
        results = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1) if (out / f"rank{r}.json").exists()]
        errors = "; ".join(f"rank {r['rank']}: {' '.join(r['save_model'].split())[:110]}" for r in results)
        c_summary = (
            "under DDP trainer.model is DistributedDataParallel(PolicyAndValueWrapper) and hasattr(DDP, 'policy') is "
            "False, so save_model does not swap in the policy; Trainer._save then tries to write the whole wrapper's "
            f"state dict (module.policy.*, module.value_model.*, module.critic_backbone.* aliases) -> {errors}; "
            f"no loadable policy was written (files: {files})"
        )
        import _common

        _common.verdict("e", has_bug, c_summary if has_bug else "save_model saved a loadable policy under DDP")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(Path(sys.argv[2]))
    else:
        main()
