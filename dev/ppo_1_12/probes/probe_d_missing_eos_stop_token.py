"""Probe (d): is TRL 1.12 PPO's ``missing_eos_penalty`` judged by the configured stop token or the tokenizer's EOS?

Runs one PPO update with ``stop_token_id=3`` (token ``t3``, not the tokenizer's EOS id 1) and
``missing_eos_penalty=1.0`` on injected responses: one that stopped at the stop token (what ``generate`` does, since
1.12 sets ``generation_config.eos_token_id = stop_token_id``), one that contains the tokenizer's EOS but never hit
the stop token, and one with neither. Prints the reward-model score before/after the penalty.
Run: ``.venv/bin/python dev/ppo_1_12/probes/probe_d_missing_eos_stop_token.py``.
"""

import _common as c


STOP = 3
RESPONSES = [
    [5, STOP, c.P, c.P, c.P, c.P],  # stopped properly at the configured stop token
    [7, c.E, 9, 10, 11, 12],  # contains tokenizer EOS, never stopped
    [7, 8, 9, 10, 11, 12],  # neither
    [6, 4, STOP, c.P, c.P, c.P],  # stopped properly at the configured stop token
]


def main() -> None:
    trainer, cap = c.run_ppo(RESPONSES, stop_token=None, stop_token_id=STOP, missing_eos_penalty=1.0)
    print(
        f"trainer.stop_token_id={trainer.stop_token_id} tokenizer.eos_token_id={trainer.processing_class.eos_token_id}"
    )
    penalised = []
    for i in range(4):
        raw, final = float(cap["scores_raw"][i]), float(cap["scores"][i])
        pen = abs((raw - final) - 1.0) < 1e-6
        penalised.append(pen)
        print(
            f"response={cap['responses'][i].tolist()} postprocessed={cap['postprocessed_responses'][i].tolist()} "
            f"contain_eos_token={bool(cap['contain_eos_token'][i])} score_raw={raw:.6f} score={final:.6f} "
            f"penalised={pen}"
        )
    has_bug = penalised[0] and penalised[3] and not penalised[1]
    c.verdict(
        "d",
        has_bug,
        "contain_eos_token = any(postprocessed_responses == tokenizer.eos_token_id): the penalty ignores "
        "stop_token_id, so responses that stopped at the configured stop token are penalised and a response "
        "that merely contains the tokenizer EOS (without stopping) is not",
    )


if __name__ == "__main__":
    main()
