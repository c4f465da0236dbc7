"""Probe (a): does TRL 1.12 PPO read the reward at the last real token whatever the padding side?

Runs one PPO update twice with the same tiny models and injected responses, once with a left-padding tokenizer and
once with a right-padding one (the collator then right-pads the queries, so the reward-model input is
``query PAD.. response PAD..``). The score 1.12 computed (observed via its ``get_reward``) is compared with the reward
model evaluated on the same tokens with every pad removed, read at the last token.
Run: ``.venv/bin/python dev/ppo_1_12/probes/probe_a_reward_padding_side.py``.
"""

import _common as c
import torch


RESPONSES = [
    [5, 9, c.E, c.P, c.P, c.P],  # EOS then pads
    [7, 3, 11, 4, 8, 6],  # no EOS, full length
    [9, c.P, 10, 11, 12, 13],  # a PAD token mid-response (sampled pad id), no EOS
    [8, 17, 5, 2, c.E, c.P],  # EOS second-to-last
]


def unpadded_score(reward_model, ids: list[int]) -> float:
    with torch.no_grad():
        x = torch.tensor([ids])
        out = reward_model.model(input_ids=x, attention_mask=torch.ones_like(x), output_hidden_states=True)
        return reward_model.score(out.hidden_states[-1])[0, -1, 0].item()


def main() -> None:
    results = {}
    for side in ("left", "right"):
        models = c.make_models(seed=0)
        _, cap = c.run_ppo(RESPONSES, tokenizer=c.make_tokenizer(padding_side=side), models=models)
        qr = torch.cat([cap["queries"], cap["postprocessed_responses"]], 1)
        rows = []
        for i in range(qr.shape[0]):
            real = [t for t in qr[i].tolist() if t != c.PAD_ID]
            read_idx = int(cap["score_token_index"][i])
            rows.append(
                {
                    "queries": cap["queries"][i].tolist(),
                    "response": cap["postprocessed_responses"][i].tolist(),
                    "read_idx": read_idx,
                    "read_token": int(qr[i, read_idx]),
                    "last_real_token": real[-1],
                    "score_1_12": float(cap["scores_raw"][i]),
                    "score_unpadded_last_token": unpadded_score(models["reward"], real),
                }
            )
        results[side] = rows
        print(f"--- tokenizer padding_side={side} (context_length={cap['context_length']})")
        for r in rows:
            match = abs(r["score_1_12"] - r["score_unpadded_last_token"]) < 1e-5
            print(
                f"query={r['queries']} response={r['response']} read idx={r['read_idx']} "
                f"(token {r['read_token']}, last real token {r['last_real_token']}) "
                f"score={r['score_1_12']:.6f} unpadded-last={r['score_unpadded_last_token']:.6f} match={match}"
            )
    ordinary = [0, 1, 3]
    ok_ordinary = all(
        abs(results[s][i]["score_1_12"] - results[s][i]["score_unpadded_last_token"]) < 1e-5
        for s in results
        for i in ordinary
    )
    side_agree = all(
        abs(results["left"][i]["score_1_12"] - results["right"][i]["score_1_12"]) < 1e-5 for i in range(4)
    )
    midpad = [results[s][2]["score_1_12"] for s in results]
    midpad_ok = all(abs(m - results["left"][2]["score_unpadded_last_token"]) < 1e-5 for m in midpad)
    print(
        f"ordinary rows match last real token on both sides: {ok_ordinary}; left/right scores agree: {side_agree}; "
        f"row with a PAD inside the response read at the last real token: {midpad_ok}"
    )
    c.verdict(
        "a",
        not (ok_ordinary and side_agree),
        "padding side does not matter: get_reward uses attention-mask cumsum position ids and reads at "
        "context_length + (first PAD in the response) - 1, so left- and right-padded queries give the same, correct "
        "score" + ("" if midpad_ok else "; caveat: a PAD token inside a response cuts it (score read before it)"),
    )


if __name__ == "__main__":
    main()
