"""Probe (c): does TRL 1.12 PPO put the sequence score on the EOS token or on a padding position after it?

Runs one PPO update with ``kl_coef=0`` (so the per-token ``rewards`` tensor holds only the score) on injected
responses with EOS at different positions (distinct ``[PAD]`` token) and prints, per row, the EOS index, where the
reward model read the score, and the response index whose reward is non-zero (the score's placement, which GAE uses).
Run: ``.venv/bin/python dev/ppo_1_12/probes/probe_c_score_position.py``.
"""

import _common as c


RESPONSES = [
    [5, 9, c.E, c.P, c.P, c.P],  # EOS at 2, pads after
    [8, 17, 5, 2, c.E, c.P],  # EOS at 4 (second-to-last)
    [3, 3, 7, 21, 30, c.E],  # EOS last
    [7, 3, 11, 4, 8, 6],  # no EOS
]


def main() -> None:
    _, cap = c.run_ppo(RESPONSES, kl_coef=0.0)
    after_eos_on_pad = []
    for i in range(4):
        resp = cap["postprocessed_responses"][i].tolist()
        eos_idx = resp.index(c.E) if c.E in resp else None
        rewards = cap["rewards"][i]
        nz = [j for j, v in enumerate(rewards.tolist()) if v != 0.0]
        placed = int(cap["actual_end"][i])
        read = int(cap["score_token_index"][i]) - cap["context_length"]
        token_at_placement = resp[placed]
        print(
            f"response={resp} eos_idx={eos_idx} score read by RM at response idx {read} (token {resp[read]}); "
            f"score={float(cap['scores'][i]):.6f} placed at response idx {placed} (token {token_at_placement}, "
            f"{'PAD' if token_at_placement == c.P else 'EOS' if token_at_placement == c.E else 'real token'}); "
            f"non-zero reward indices={nz}; values[placed]={float(cap['values'][i, placed]):.6f} "
            f"(kept: padding_mask_p1={bool(cap['padding_mask_p1'][i, placed])})"
        )
        if eos_idx is not None and eos_idx < len(resp) - 1:
            after_eos_on_pad.append(placed == eos_idx + 1 and token_at_placement == c.P)
    c.verdict(
        "c",
        all(after_eos_on_pad) and bool(after_eos_on_pad),
        "the RM reads the score AT the EOS token, but rewards[actual_end] += score puts it at sequence_length + 1, "
        "i.e. on the first PAD after EOS (only when EOS is the last token, or there is no EOS, does it land on the "
        "last token); GAE then credits the EOS action with gamma*lam*(score - V(pad slot)) and the value head is "
        "trained on "
        "that pad slot (padding_mask_p1)",
    )


if __name__ == "__main__":
    main()
