"""A built-in, offline, seeded suite of verifiable tasks, a character-level tokenizer and a tiny causal LM.

Everything here is generated in-process from a seed: nothing is downloaded, so the main job, the examples and the
tests run on a fresh machine without Hub access. The suite is small enough that the tiny model of
`configs/tiny_causal_lm.json`, trained jointly on its three objectives (pretraining, SFT, RL), goes from 0 to
near-perfect held-out greedy exact-match accuracy in ~600 steps (~80 s on one CPU thread in a plain PyTorch loop).

Task families. Every prompt is `"<op> <input>="` (at most 9 characters), every answer at most 4 characters:

| family | prompt → answer | SFT demonstrations | eval split |
|---|---|---|---|
| `rev` | `"rev cfab="` → `"bafc"` (reverse 3–4 letters of a–h) | yes | `sft_tasks` |
| `nxt` | `"nxt bdh="` → `"cei"` (alphabet successor of each of 2–3 letters of a–i) | yes | `sft_tasks` |
| `min` | `"min 4719="` → `"1"` (smallest of 3–4 digits) | yes | `sft_tasks` |
| `lst` | `"lst cfab="` → `"b"` (last of 3–4 letters of a–h) | **no**, RL prompts only | `rl_only` |

Why this design:

- Held-out: each family's input space is enumerated and split once; no SFT row, RL prompt or pretraining sentence
  uses an eval input of its family, so eval measures generalisation to unseen inputs, not recall.
- The pretraining corpus states the facts the tasks rely on in *other surface forms* (`"after c comes d."`,
  `"c d e f."`, `"cfab backwards is bafc."`, `"cfab ends with b."`, `"the smallest digit of 4719 is 1."`) and
  never uses the `"<op> <input>="` format, so it helps without solving any prompt by itself.
- `lst` has no demonstrations. A model trained on `rev` already puts the last letter first when it sees letters,
  and `min` taught it one-character answers, so sampling at temperature 1.0 finds `"<last letter></s>"` in a group
  of 8 completions early on and group-relative RL learns the family within ~100–200 steps. Without RL the model
  answers `"lst ...="` prompts with rev-like strings or pretraining prose and scores ~0: the `rl_only` split
  measures what only RL teaches.
- `max` of digits was tried as the RL-only family and rejected: RL finds the unconditional shortcut "answer 9"
  (right a third of the time) or collapses onto a constant digit, and reaches only 0.1–0.85 depending on the seed.
- Answers of `min` are balanced over digits (see `_split_inputs`), so "always answer 0" is no shortcut either.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import torch
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from ..rewards import exact_match_reward


logger = logging.getLogger(__name__)

PAD_TOKEN = "<pad>"
EOS_TOKEN = "</s>"
BOS_TOKEN = "<s>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN)
# Every printable ASCII character (space included) plus newline and tab: one token each.
CHARACTERS = tuple(chr(i) for i in range(32, 127)) + ("\n", "\t")

# Plain "role: content" lines; the generation prompt ends in "assistant: " so that a conversational prompt renders
# to a plain string the model can continue.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

DEFAULT_MODEL_CONFIG = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "tiny_causal_lm.json")

LETTERS = "abcdefghij"  # successor of the letters a–i stays inside the alphabet
DIGITS = "0123456789"

SPLIT_SFT_TASKS = "sft_tasks"
SPLIT_RL_ONLY = "rl_only"


# ----------------------------------------------------------------------------------------------------------------
# Tokenizer and model
# ----------------------------------------------------------------------------------------------------------------


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Build a character-level tokenizer in-process (no download).

    Every printable ASCII character, newline and tab is one token; `<pad>`, `</s>` (eos), `<s>` (bos) and `<unk>`
    are distinct special tokens (ids 0–3). The tokenizer adds no special tokens on its own (like Qwen2): the
    trainers append eos where they need it. Decoding concatenates the characters, so
    `decode(encode(s)) == s` for every ASCII string `s` (spaces and newlines included).

    Returns:
        `PreTrainedTokenizerFast`: the tokenizer, with `padding_side="right"` and a Jinja `chat_template` that renders
        `[{"role": "user", "content": "x"}]` with `add_generation_prompt=True` as `"user: x\\nassistant: "`.
        It survives `save_pretrained` / `AutoTokenizer.from_pretrained` offline.
    """
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # `[\s\S]` matches any single character, newline included; "isolated" makes each one its own piece.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join pieces with no separator
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="right",
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast, config_path: str | os.PathLike | None = None, seed: int = 0
) -> PreTrainedModel:
    """Build a small randomly initialised causal LM from a JSON config (no download).

    The JSON holds `model_type` (e.g. `"llama"` or `"qwen2"`) and the architecture's config fields; `vocab_size`,
    `pad_token_id`, `bos_token_id` and `eos_token_id` are overwritten from `tokenizer`. Initialisation runs under
    `torch.manual_seed(seed)` inside `torch.random.fork_rng`, so the caller's global RNG state is left untouched
    and the same seed gives the same weights.

    Args:
        tokenizer (`PreTrainedTokenizerFast`): tokenizer whose vocabulary and special-token ids the model uses,
            typically from [`build_char_tokenizer`].
        config_path (`str | os.PathLike | None`): JSON config; defaults to the shipped
            `trl_trapo/configs/tiny_causal_lm.json`.
        seed (`int`): seed of the random initialisation.

    Returns:
        `PreTrainedModel`: an fp32 `AutoModelForCausalLM` in train mode whose `generation_config` carries the
        tokenizer's pad/bos/eos ids. It round-trips through `save_pretrained` / `from_pretrained`.

    Raises:
        FileNotFoundError: if `config_path` does not exist.
        ValueError: if the JSON has no `model_type`, or the tokenizer lacks a pad or eos token.
    """
    config_path = DEFAULT_MODEL_CONFIG if config_path is None else os.fspath(config_path)
    with open(config_path, encoding="utf-8") as handle:
        config_kwargs: dict[str, Any] = json.load(handle)
    model_type = config_kwargs.pop("model_type", None)
    if model_type is None:
        raise ValueError(f'{config_path} has no `model_type`; add e.g. `"model_type": "llama"`.')
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise ValueError("`tokenizer` needs a pad and an eos token; build it with `build_char_tokenizer()`.")
    config_kwargs = {key: value for key, value in config_kwargs.items() if not key.startswith("_")}
    config_kwargs.update(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config = AutoConfig.for_model(model_type, **config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


# ----------------------------------------------------------------------------------------------------------------
# Task families
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskFamily:
    """One family of verifiable tasks: an enumerable input space, a prompt format and an exact answer.

    Args:
        name (`str`): the family's name; also the operator word at the start of its prompts.
        inputs (`tuple[str, ...]`): every possible input string, in a fixed order.
        solve (`Callable[[str], str]`): maps an input string to its answer.
        has_sft (`bool`): whether the suite ships SFT demonstrations for this family (`False` means RL prompts
            only, evaluated under the `rl_only` split).
    """

    name: str
    inputs: tuple[str, ...]
    solve: Callable[[str], str]
    has_sft: bool = True

    def prompt(self, x: str) -> str:
        """Return the prompt for input `x`, e.g. `"rev abc="`."""
        return f"{self.name} {x}="

    @property
    def split(self) -> str:
        """The eval split of this family: `"sft_tasks"` or `"rl_only"`."""
        return SPLIT_SFT_TASKS if self.has_sft else SPLIT_RL_ONLY


def _strings(alphabet: str, lengths: Sequence[int]) -> tuple[str, ...]:
    return tuple("".join(chars) for n in lengths for chars in product(alphabet, repeat=n))


def _interleave(groups: Sequence[Sequence[str]]) -> list[str]:
    """Round-robin over `groups`: first item of each, then second item of each, ..."""
    ordered: list[str] = []
    for depth in range(max((len(group) for group in groups), default=0)):
        ordered.extend(group[depth] for group in groups if depth < len(group))
    return ordered


def _split_inputs(family: TaskFamily, num_eval: int, rng: random.Random) -> tuple[list[str], list[str]]:
    """Split a family's inputs into `num_eval` held-out inputs and a training pool, both with near-uniform answers.

    The inputs are shuffled and grouped by answer; both lists are round-robin interleavings over the answer groups,
    so every prefix of them has near-uniform answers. Without this, `min` of random digits is "0" a third of the
    time: a shortcut a model takes before it learns the family, and one RL finds (see the module docstring on
    `max`). At most a tenth of each answer group is held out (all of a one-input group, so families whose answers
    are unique, like `rev`, are split plainly), which keeps rare answers such as `min 999=` in the training pool.

    Raises:
        ValueError: if `num_eval` is more than the family can hold out under that rule.
    """
    shuffled = list(family.inputs)
    rng.shuffle(shuffled)
    by_answer: dict[str, list[str]] = {}
    for x in shuffled:
        by_answer.setdefault(family.solve(x), []).append(x)
    groups = [by_answer[answer] for answer in sorted(by_answer)]
    rng.shuffle(groups)
    quotas = [1 if len(group) == 1 else len(group) // 10 for group in groups]
    if num_eval > sum(quotas) or num_eval >= len(shuffled):
        raise ValueError(
            f"`num_eval_per_task={num_eval}` is too large for family {family.name!r} ({len(shuffled)} inputs, at most "
            f"{min(sum(quotas), len(shuffled) - 1)} can be held out); use a smaller value."
        )
    held_out = _interleave([group[:quota] for group, quota in zip(groups, quotas)])[:num_eval]
    held_out_set = set(held_out)
    pool = _interleave([[x for x in group if x not in held_out_set] for group in groups])
    return held_out, pool


def successor(letters: str) -> str:
    """The alphabet successor of each letter: `"bdh"` -> `"cei"` (the `nxt` family's answer).

    Args:
        letters (`str`): letters of `LETTERS` but its last (`"a"`–`"i"`).

    Returns:
        `str`: as many letters, each the next one of `LETTERS`.

    Raises:
        ValueError: for a letter outside `LETTERS[:-1]` (it has no successor in the alphabet).
    """
    bad = [c for c in letters if c not in LETTERS[:-1]]
    if bad:
        raise ValueError(
            f"successor({letters!r}): {bad[0]!r} has no successor in the suite's alphabet {LETTERS!r}; pass letters "
            f"of {LETTERS[:-1]!r}."
        )
    return "".join(LETTERS[LETTERS.index(c) + 1] for c in letters)


TASK_FAMILIES: tuple[TaskFamily, ...] = (
    TaskFamily("rev", _strings(LETTERS[:8], (3, 4)), lambda x: x[::-1]),
    TaskFamily("nxt", _strings(LETTERS[:9], (2, 3)), successor),
    TaskFamily("min", _strings(DIGITS, (3, 4)), min),
    TaskFamily("lst", _strings(LETTERS[:8], (3, 4)), lambda x: x[-1], has_sft=False),
)


# ----------------------------------------------------------------------------------------------------------------
# Pretraining corpus: the same knowledge in other surface forms
# ----------------------------------------------------------------------------------------------------------------


def _sentence(rng: random.Random, train_inputs: dict[str, list[str]]) -> str:
    """One pretraining sentence: a fact the tasks rely on, written in a surface form no prompt uses."""
    kind = rng.randrange(9)
    if kind == 0:  # an alphabet run, "c d e f g."
        start = rng.randrange(len(LETTERS) - 2)
        return " ".join(LETTERS[start : rng.randint(start + 3, len(LETTERS))]) + "."
    if kind == 1:
        i = rng.randrange(len(LETTERS) - 1)
        return f"after {LETTERS[i]} comes {LETTERS[i + 1]}."
    if kind == 2:
        i = rng.randrange(1, len(LETTERS))
        return f"{LETTERS[i]} comes after {LETTERS[i - 1]}."
    if kind == 3:
        x = rng.choice(train_inputs["rev"])
        return f"{x} backwards is {x[::-1]}."
    if kind == 4:
        x = rng.choice(train_inputs["lst"])
        return f"{x} ends with {x[-1]}."
    if kind == 5:  # a digit run, "3 4 5 6."
        start = rng.randrange(len(DIGITS) - 2)
        return " ".join(DIGITS[start : rng.randint(start + 3, len(DIGITS))]) + "."
    if kind == 6:
        a, b = sorted(rng.sample(DIGITS, 2))
        return f"{b} is more than {a}."
    x = rng.choice(train_inputs["min"])
    return f"the smallest digit of {x} is {min(x)}." if kind == 7 else f"the largest digit of {x} is {max(x)}."


def _document(rng: random.Random, train_inputs: dict[str, list[str]], max_sentences: int) -> str:
    n = min(max_sentences, 1 + int(rng.expovariate(1 / 4)))  # mostly short documents, a few long ones
    separator = rng.choice((" ", "\n"))
    return separator.join(_sentence(rng, train_inputs) for _ in range(n))


# ----------------------------------------------------------------------------------------------------------------
# The suite
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class TaskSuite:
    """The datasets of the built-in verifiable task suite, in TRL's standard (non-conversational) formats.

    Args:
        pretrain (`Dataset`): language-modelling corpus, column `text` (one document per row).
        sft (`Dataset`): prompt-completion demonstrations, columns `prompt`, `completion` (no eos; the trainer
            appends it) and `task`.
        rl_train (`Dataset`): prompt-only RL data, columns `prompt`, `answer`, `task`, `demonstration` (the answer
            for families with SFT data, "" for the `rl_only` ones: guidance's `demonstration_column`).
        eval (`Dataset`): held-out prompts, columns `prompt`, `answer`, `task`, `split` (`"sft_tasks"` or
            `"rl_only"`). No eval prompt occurs in `pretrain`, `sft` or `rl_train`.
        reward_funcs (`list[Callable]`): reward functions with TRL's signature; `[exact_match_reward]`.
    """

    pretrain: Dataset
    sft: Dataset
    rl_train: Dataset
    eval: Dataset
    reward_funcs: list[Callable[..., list[float]]] = field(default_factory=list)


def make_task_suite(
    seed: int = 0,
    *,
    num_pretrain_docs: int = 3000,
    num_sft_per_task: int = 2000,
    num_rl_per_task: int = 1000,
    rl_only_fraction: float = 0.5,
    num_eval_per_task: int = 100,
    max_doc_sentences: int = 16,
) -> TaskSuite:
    """Generate the seeded task suite (see the module docstring for the task families and why).

    For every family the enumerated input space is shuffled with `seed` and split by [`_split_inputs`]: the first
    `num_eval_per_task` inputs are held out for `eval`, the rest form the training pool from which SFT
    demonstrations, RL prompts and pretraining facts are drawn (cycling through the pool, so a request larger than
    the pool repeats inputs). Rows of `sft` and `rl_train` are shuffled; `eval` is ordered by family.

    Args:
        seed (`int`): seed of every random choice; the same seed gives identical datasets.
        num_pretrain_docs (`int`): number of pretraining documents (1 to `max_doc_sentences` sentences each).
        num_sft_per_task (`int`): SFT rows per family that has demonstrations.
        num_rl_per_task (`int`): RL prompts per family that has demonstrations.
        rl_only_fraction (`float`): fraction of `rl_train` rows taken from the `rl_only` families, in [0, 1). The
            default 0.5 gives them as many RL prompts as all other families together: they get no other signal,
            and RL prompts of families that SFT already solved mostly form all-correct groups with zero advantage.
        num_eval_per_task (`int`): held-out eval prompts per family.
        max_doc_sentences (`int`): longest pretraining document, in sentences.

    Returns:
        `TaskSuite`: `pretrain` (`text`), `sft` (`prompt`, `completion`), `rl_train` (`prompt`, `answer`, `task`,
        `demonstration`),
        `eval` (`prompt`, `answer`, `task`, `split`) and `reward_funcs == [exact_match_reward]`.

    Raises:
        ValueError: if a size is negative, `rl_only_fraction` is outside [0, 1), `max_doc_sentences < 1`, or
            `num_eval_per_task` is more than a family can hold out.
    """
    sizes = {
        "num_pretrain_docs": num_pretrain_docs,
        "num_sft_per_task": num_sft_per_task,
        "num_rl_per_task": num_rl_per_task,
        "num_eval_per_task": num_eval_per_task,
    }
    for name, value in sizes.items():
        if value < 0:
            raise ValueError(f"`{name}` must be >= 0, got {value}.")
    if not 0.0 <= rl_only_fraction < 1.0:
        raise ValueError(f"`rl_only_fraction` must be in [0, 1), got {rl_only_fraction}.")
    if max_doc_sentences < 1:
        raise ValueError(f"`max_doc_sentences` must be >= 1, got {max_doc_sentences}.")

    rng = random.Random(seed)
    num_sft_families = sum(family.has_sft for family in TASK_FAMILIES)
    num_rl_only_families = len(TASK_FAMILIES) - num_sft_families
    # Solve num_rl_only / (num_rl_only + num_sft_families * num_rl_per_task) = rl_only_fraction, per rl_only family.
    num_rl_only_per_task = round(
        rl_only_fraction
        * num_sft_families
        * num_rl_per_task
        / ((1.0 - rl_only_fraction) * max(num_rl_only_families, 1))
    )
    eval_rows: list[dict[str, str]] = []
    sft_rows: list[dict[str, str]] = []
    rl_rows: list[dict[str, str]] = []
    train_inputs: dict[str, list[str]] = {}
    for family in TASK_FAMILIES:
        held_out, pool = _split_inputs(family, num_eval_per_task, rng)
        train_inputs[family.name] = pool
        eval_rows += [
            {"prompt": family.prompt(x), "answer": family.solve(x), "task": family.name, "split": family.split}
            for x in held_out
        ]
        if family.has_sft:
            sft_rows += [
                {"prompt": family.prompt(x), "completion": family.solve(x)}
                for x in (pool[i % len(pool)] for i in range(num_sft_per_task))
            ]
        num_rl = num_rl_per_task if family.has_sft else num_rl_only_per_task
        rl_rows += [
            {
                "prompt": family.prompt(x),
                "answer": family.solve(x),
                "task": family.name,
                # what guidance may show (`demonstration_column="demonstration"`): a family without SFT data has
                # no demonstration either, so only exploration can move it
                "demonstration": family.solve(x) if family.has_sft else "",
            }
            for x in (pool[i % len(pool)] for i in range(num_rl))
        ]
    rng.shuffle(sft_rows)
    rng.shuffle(rl_rows)
    pretrain_texts = [_document(rng, train_inputs, max_doc_sentences) for _ in range(num_pretrain_docs)]
    logger.debug(
        "Task suite (seed %d): %d pretraining documents, %d SFT rows, %d RL prompts, %d eval prompts.",
        seed,
        len(pretrain_texts),
        len(sft_rows),
        len(rl_rows),
        len(eval_rows),
    )

    def to_dataset(rows: list[dict[str, str]], columns: tuple[str, ...]) -> Dataset:
        return Dataset.from_dict({column: [row[column] for row in rows] for column in columns})

    return TaskSuite(
        pretrain=Dataset.from_dict({"text": pretrain_texts}),
        sft=to_dataset(sft_rows, ("prompt", "completion")),
        rl_train=to_dataset(rl_rows, ("prompt", "answer", "task", "demonstration")),
        eval=to_dataset(eval_rows, ("prompt", "answer", "task", "split")),
        reward_funcs=[exact_match_reward],
    )


# ----------------------------------------------------------------------------------------------------------------
# Reward and evaluation
# ----------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    dataset: Dataset,
    batch_size: int = 64,
    max_new_tokens: int | None = None,
) -> dict[str, float]:
    """Greedy-decoding exact-match accuracy of `model` on a dataset with `prompt` and `answer` columns.

    Prompts are left-padded for generation (the tokenizer's `padding_side` is restored afterwards); conversational
    prompts (lists of message dicts) are rendered with the tokenizer's chat template. Each generated completion is
    cut at the first eos and scored with [`exact_match_reward`]'s rule. The model's train/eval mode is restored.

    Args:
        model (`PreTrainedModel`): causal LM with `generate`.
        tokenizer (`PreTrainedTokenizerFast`): its tokenizer; needs a pad and an eos token.
        dataset (`Dataset`): rows with `prompt` and `answer`, optionally `split` (e.g. the suite's `eval`).
        batch_size (`int`): prompts per `generate` call.
        max_new_tokens (`int | None`): generation budget; defaults to the longest tokenized answer + 4 (eos plus
            room for whitespace, which the exact-match rule ignores).

    Returns:
        `dict[str, float]`: `"accuracy"` (fraction of exactly matched rows, in [0, 1]) and, when the dataset has a
        `split` column, `"accuracy_<split>"` for every split present.

    Raises:
        ValueError: if `dataset` lacks `prompt` or `answer`, is empty, or `batch_size < 1`.
    """
    for column in ("prompt", "answer"):
        if column not in dataset.column_names:
            raise ValueError(f"`dataset` needs a `{column}` column; it has {dataset.column_names}.")
    if len(dataset) == 0:
        raise ValueError("`dataset` is empty.")
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1, got {batch_size}.")

    prompts = [
        p if isinstance(p, str) else tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        for p in dataset["prompt"]
    ]
    answers = [str(a) for a in dataset["answer"]]
    if max_new_tokens is None:
        # eos plus a little slack: the exact-match rule ignores surrounding whitespace, and an RL-trained policy may
        # learn to emit some (it costs no reward).
        max_new_tokens = max(len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers) + 4

    was_training = model.training
    padding_side = tokenizer.padding_side
    correct: list[float] = []
    try:
        model.eval()
        tokenizer.padding_side = "left"
        device = next(model.parameters()).device
        for start in range(0, len(prompts), batch_size):
            batch = tokenizer(
                prompts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
            ).to(device)
            output_ids = model.generate(
                **batch,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            completion_ids = output_ids[:, batch["input_ids"].shape[1] :].tolist()  # (B, ≤ max_new_tokens)
            texts = []
            for ids in completion_ids:
                if tokenizer.eos_token_id in ids:
                    ids = ids[: ids.index(tokenizer.eos_token_id)]
                texts.append(tokenizer.decode(ids, skip_special_tokens=True))
            correct.extend(exact_match_reward(None, texts, answers[start : start + batch_size]))
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)

    metrics = {"accuracy": sum(correct) / len(correct)}
    if "split" in dataset.column_names:
        splits = dataset["split"]
        for name in sorted(set(splits)):
            scores = [c for c, s in zip(correct, splits) if s == name]
            metrics[f"accuracy_{name}"] = sum(scores) / len(scores)
    return metrics
