# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Reward functions with TRL's reward-function signature, and the registry the main job picks them from.

`numeric_answer_reward` parses GSM8K-style answers (`... #### 72`) with `math-verify` using a plain-number
extraction config. TRL's `accuracy_reward` expects LaTeX and returns 0 or None on `#### 72`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from .tasks import exact_match_reward


def _text(completion: str | list[dict[str, Any]]) -> str:
    if isinstance(completion, list):
        return "".join(str(m.get("content") or "") for m in completion if m.get("role", "assistant") == "assistant")
    return str(completion)


def final_answer(text: str) -> str:
    """The part of a GSM8K-style answer after its last `####` (the whole text when there is none), stripped."""
    return text.rsplit("####", 1)[-1].strip() if "####" in text else text.strip()


def numeric_answer_reward(completions: list, answer: list[str], **kwargs: Any) -> list[float | None]:
    """1.0 if the completion's final number equals the reference answer's, else 0.0; None if the reference has none.

    The reference is read after its last `####` (GSM8K's format) with a plain-number extraction; the completion's
    answer is read after its last `####` if it has one, else from the whole text, with LaTeX (`\\boxed{..}`) and
    plain-number extraction. Numbers compare mathematically (`72`, `72.0` and `1,000` / `1000` match).

    Args:
        completions (`list[str]` or `list[list[dict]]`): standard or conversational completions.
        answer (`list[str]`): reference answers (the dataset's `answer` column).
        **kwargs: other dataset columns and trainer extras; ignored.

    Returns:
        `list[float | None]`: one reward per completion; None means "no reward for this sample" (unparsable
        reference), which the trainer leaves out of the RL loss.

    Raises:
        ValueError: if `completions` and `answer` have different lengths.
    """
    if len(completions) != len(answer):
        raise ValueError(f"Got {len(completions)} completions but {len(answer)} answers; they must match one to one.")
    rewards: list[float | None] = []
    for completion, reference in zip(completions, answer):
        gold = parse(final_answer(str(reference)), extraction_config=[ExprExtractionConfig()])
        if not gold:
            rewards.append(None)
            continue
        prediction = parse(
            final_answer(_text(completion)), extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()]
        )
        rewards.append(1.0 if prediction and verify(gold, prediction) else 0.0)
    return rewards


REWARD_FUNCTIONS: dict[str, Callable[..., list[float | None]]] = {
    "exact_match": exact_match_reward,
    "numeric_answer": numeric_answer_reward,
}
"""Reward functions selectable by name from the main job's `--reward_funcs`."""
