"""Probe (b): what breaks in TRL 1.12 PPO when the tokenizer's pad token equals its EOS token?

Runs one PPO update with a tokenizer whose ``pad_token`` is ``[EOS]`` (pad_token_id == eos_token_id == 1) on injected
responses shaped like HF ``generate`` output with pad == EOS (after the first EOS the sequence is filled with EOS),
and, for comparison, the same sequences with a distinct ``[PAD]`` token. Prints what 1.12 computes for each row:
``sequence_lengths`` (last "real" response index), the token the reward is read at, whether the EOS position is masked
out of the policy loss (``padding_mask``), ``contain_eos_token`` and the response's attention mask.
Run: ``.venv/bin/python dev/ppo_1_12/probes/probe_b_pad_equals_eos.py``.
"""

import _common as c


def responses_for(pad: int) -> list[list[int]]:
    return [
        [5, 9, c.E, pad, pad, pad],  # EOS at index 2
        [7, 3, 11, 4, 8, 6],  # no EOS
        [c.E, pad, pad, pad, pad, pad],  # EOS first
        [8, 17, 5, 2, c.E, pad],  # EOS at index 4
    ]


def main() -> None:
    runs = {}
    for name, pad_token, pad_id in (("distinct [PAD]", "[PAD]", c.PAD_ID), ("pad == EOS", "[EOS]", c.EOS_ID)):
        tok = c.make_tokenizer(pad_token=pad_token)
        assert tok.pad_token_id == pad_id
        models = c.make_models(seed=0, pad_token_id=pad_id)
        _, cap = c.run_ppo(responses_for(pad_id), tokenizer=tok, models=models)
        runs[name] = cap
        ctx = cap["context_length"]
        print(f"--- {name}: pad_token_id={tok.pad_token_id} eos_token_id={tok.eos_token_id} context_length={ctx}")
        for i in range(4):
            resp = cap["postprocessed_responses"][i].tolist()
            eos_idx = resp.index(c.E) if c.E in resp else None
            read = int(cap["score_token_index"][i])
            qr = cap["query_responses"][i]
            masked = bool(cap["padding_mask"][i, eos_idx]) if eos_idx is not None else "-"
            print(
                f"response={resp} eos_idx={eos_idx} sequence_length={int(cap['sequence_lengths'][i])} "
                f"score read at seq idx {read} (token {int(qr[read])}) "
                f"eos position masked in policy loss={masked} "
                f"contain_eos_token={bool(cap['contain_eos_token'][i])} "
                f"response attention mask={(qr[ctx:] != tok.pad_token_id).int().tolist()} "
                f"score placed at response idx {int(cap['actual_end'][i])}"
            )
        print(f"metrics val/num_eos_tokens={cap['metrics']['val/num_eos_tokens']}")
    same = runs["pad == EOS"]
    eos_rows = [0, 2, 3]
    eos_masked = all(
        bool(same["padding_mask"][i, same["postprocessed_responses"][i].tolist().index(c.E)]) for i in eos_rows
    )
    read_before_eos = all(int(same["query_responses"][i, int(same["score_token_index"][i])]) != c.E for i in eos_rows)
    seq_len_neg = int(same["sequence_lengths"][2])
    c.verdict(
        "b",
        eos_masked or read_before_eos,
        f"with pad == EOS every EOS is treated as padding: EOS token's logprob masked out of the policy loss, "
        f"KL and entropy ({eos_masked}), reward read at the token BEFORE EOS ({read_before_eos}), EOS removed from "
        f"every attention mask (also EOS inside prompts), the score lands on the EOS slot (seq_len+1), an EOS-first "
        f"response gets sequence_length={seq_len_neg} (all tokens masked, score read at the last "
        f"prompt token), and val/num_eos_tokens counts the trailing pad-EOS fill",
    )


if __name__ == "__main__":
    main()
