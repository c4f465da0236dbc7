# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Format checks, SFT / prompt tokenisation, per-rank sampling and pretraining packing, with a char-level tokenizer."""

import json
import re

import pytest
import torch
from datasets import Dataset

from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.config import PRETRAIN, SFT
from trl_trapo.data import (
    PretrainStream,
    ShardedSampler,
    check_cells,
    check_conversations_renderable,
    check_pretrain_dataset,
    check_prompt_dataset,
    check_sft_dataset,
    dataset_columns,
    sft_row,
    strip_pad_runs,
    tokenize_prompt,
    tokenize_prompt_dataset,
    tokenize_sft_dataset,
)
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------------------------------------------------
# Format checks
# ---------------------------------------------------------------------------------------------------------------------
def test_check_pretrain_dataset():
    check_pretrain_dataset(Dataset.from_dict({"text": ["a"]}))
    check_pretrain_dataset(Dataset.from_dict({"text": ["a"]}).to_iterable_dataset())
    with pytest.raises(ValueError, match=r"`pretrain_dataset` must have a 'text' column.*'content'"):
        check_pretrain_dataset(Dataset.from_dict({"content": ["a"]}))
    with pytest.raises(ValueError, match=r"`pretrain_dataset` must have a 'text' column"):
        check_pretrain_dataset(Dataset.from_dict({"content": ["a"]}).to_iterable_dataset())
    with pytest.raises(ValueError, match=r"`pretrain_dataset` is empty"):
        check_pretrain_dataset(Dataset.from_dict({"text": []}))


def test_check_sft_dataset():
    check_sft_dataset(Dataset.from_dict({"prompt": ["a"], "completion": ["b"]}))
    check_sft_dataset(Dataset.from_dict({"messages": [[{"role": "user", "content": "a"}]]}))
    with pytest.raises(ValueError, match=r"`sft_dataset` must have 'prompt' and 'completion' columns.*\['prompt'\]"):
        check_sft_dataset(Dataset.from_dict({"prompt": ["a"]}))
    with pytest.raises(ValueError, match=r"`sft_dataset` is empty"):
        check_sft_dataset(Dataset.from_dict({"prompt": [], "completion": []}))


def test_kto_rows_with_a_boolean_label_are_refused_as_sft_demonstrations():
    """TRL's unpaired preference rows (KTO: prompt / completion / label) trained as SFT without a word, the
    label=False (undesirable) completions imitated as demonstrations (trial 8's DF02)."""
    kto = {"prompt": ["2+2="] * 4, "completion": ["4", "5", "4", "9"], "label": [True, False, True, False]}
    with pytest.raises(ValueError, match=r"`sft_dataset` has a boolean 'label' column.*label=False.*\.filter\("):
        check_sft_dataset(Dataset.from_dict(kto))
    with pytest.raises(ValueError, match=r"boolean 'label' column"):  # an iterable dataset: by its features
        check_sft_dataset(Dataset.from_dict(kto).to_iterable_dataset())
    fixed = Dataset.from_dict(kto).filter(lambda row: row["label"]).remove_columns("label")
    check_sft_dataset(fixed)  # the fix the message gives passes
    check_sft_dataset(Dataset.from_dict({**kto, "label": ["math"] * 4}))  # a label that is no preference passes


PREFERENCE_FORMS = {  # TRL's preference formats (huggingface.co/docs/trl/dataset_formats)
    "explicit prompt": {"prompt": ["rev ab="] * 4, "chosen": ["ba"] * 4, "rejected": ["ab"] * 4},
    "implicit prompt, conversational": {  # as trl-lib/ultrafeedback_binarized
        "chosen": [[{"role": "user", "content": "rev ab="}, {"role": "assistant", "content": "ba"}]] * 4,
        "rejected": [[{"role": "user", "content": "rev ab="}, {"role": "assistant", "content": "ab"}]] * 4,
    },
    "implicit prompt, text": {"chosen": ["rev ab= ba"] * 4, "rejected": ["rev ab= ab"] * 4},
}


def code_spans(message: str) -> list[str]:
    return re.findall(r"`(dataset[^`]*)`", message)


@pytest.mark.parametrize("form", PREFERENCE_FORMS)
def test_preference_rows_are_named_as_such_with_a_fix_that_works(form):
    """Trial 15's N12: preference rows as `sft_dataset` were told to rename a '<prompt column>' that does not exist.
    In each slot they are named as preference data (TRAPO trains no preference loss), and the `dataset...` code the
    message gives, run as written (with TRL's `extract_prompt`), makes demonstrations `sft_dataset` accepts and, for
    `train_dataset`, prompts."""
    from trl.data_utils import extract_prompt

    dataset = Dataset.from_dict(PREFERENCE_FORMS[form])
    checks = {"sft_dataset": check_sft_dataset, "pretrain_dataset": check_pretrain_dataset}
    if form != "explicit prompt":  # with a 'prompt' column they are valid RL prompts (chosen/rejected: reward kwargs)
        checks["train_dataset"] = check_prompt_dataset
    for name, check in checks.items():
        with pytest.raises(ValueError) as raised:
            check(dataset)
        message = str(raised.value)
        for needle in (f"`{name}` holds preference data", "'chosen' / 'rejected' columns", "no preference loss"):
            assert needle in message, (needle, message)
        assert "<prompt column>" not in message and "<completion column>" not in message, message
        spans = code_spans(message)
        assert spans, message
        fixed = [eval(span, {"dataset": dataset, "extract_prompt": extract_prompt}) for span in spans]  # noqa: S307
        check_sft_dataset(fixed[0])  # the demonstrations
        answer = fixed[0][0]["completion" if "completion" in fixed[0].column_names else "messages"]
        answer = answer if isinstance(answer, str) else answer[-1]["content"]
        assert answer.strip() == "ba", answer  # the chosen answer, not the rejected one
        if name == "train_dataset":
            check_prompt_dataset(fixed[1])
            assert fixed[1].column_names == ["prompt"], fixed[1].column_names
    streamed = Dataset.from_dict(PREFERENCE_FORMS[form]).to_iterable_dataset()  # its rows are not read: every form
    with pytest.raises(ValueError, match="`sft_dataset` holds preference data"):
        check_sft_dataset(streamed)


def test_check_prompt_dataset():
    check_prompt_dataset(Dataset.from_dict({"prompt": ["a"]}))
    check_prompt_dataset(Dataset.from_dict({"input_ids": [[1, 2]]}))
    with pytest.raises(ValueError, match=r"`eval_dataset` \(RL prompts\) must have a 'prompt' column.*'question'"):
        check_prompt_dataset(Dataset.from_dict({"question": ["a"]}), name="eval_dataset")
    with pytest.raises(ValueError, match=r"`train_dataset` is empty"):
        check_prompt_dataset(Dataset.from_dict({"prompt": []}))


GSM8K_RAW = {"question": ["Tom has 3 apples and buys 4. How many?"], "answer": ["3 + 4 = 7\n#### 7"]}


@pytest.mark.parametrize(
    "check, columns, example",
    [
        (check_prompt_dataset, GSM8K_RAW, "`dataset.rename_column('question', 'prompt')`"),
        (check_sft_dataset, GSM8K_RAW, "`dataset.rename_columns({'question': 'prompt', 'answer': 'completion'})`"),
        (
            check_pretrain_dataset,
            GSM8K_RAW,
            "`dataset.map(lambda row: {'text': row['question'] + '\\n' + row['answer']})`",
        ),
        (
            check_prompt_dataset,
            {"Instruction": ["a"], "output": ["b"]},
            "dataset.rename_column('Instruction', 'prompt')",
        ),
        (check_sft_dataset, {"prompt": ["a"], "response": ["b"]}, "`dataset.rename_column('response', 'completion')`"),
        (check_pretrain_dataset, {"document": ["a"], "id": [1]}, "`dataset.rename_column('document', 'text')`"),
    ],
)
def test_each_slot_refusal_gives_the_mapping_that_fixes_the_dataset(check, columns, example):
    """Trial 13's N26: a raw GSM8K file (`question` / `answer`) was refused in each slot, with a mapping example only in
    the pretraining one (and a made-up column there). Each refusal gives the one-line call built from the dataset's own
    columns, and that call, run, makes the dataset pass."""
    dataset = Dataset.from_dict(columns)
    with pytest.raises(ValueError) as raised:
        check(dataset)
    message = str(raised.value)
    assert example in message, message
    call = re.search(r"`(dataset\.[^`]+)`", message).group(1)
    check(eval(call, {"dataset": dataset}))  # the fix it gives works


CHAT = [{"role": "user", "content": "rev ab="}, {"role": "assistant", "content": "ba"}]


def test_a_conversation_column_as_pretraining_text_gets_a_fix_the_next_check_accepts():
    """Trial 14's N46: a `messages` column in the pretraining slot was told `rename_column('messages', 'text')`, and
    the renamed column was refused next for holding lists. The fix given now renders the conversations with the chat
    template (run here, it passes the column and the cell checks) or passes them as `sft_dataset`; a conversation
    renamed 'text' anyway is told the same."""
    tokenizer = build_char_tokenizer()
    dataset = Dataset.from_dict({"messages": [CHAT] * 3})
    with pytest.raises(ValueError) as raised:
        check_pretrain_dataset(dataset)
    message = str(raised.value)
    assert "rename_column" not in message and "pass the dataset as `sft_dataset=`" in message, message
    call = re.search(r"`(dataset\.map\([^`]+)`", message).group(1)
    assert "tokenizer.apply_chat_template(row['messages'], tokenize=False)" in call
    rendered = eval(call, {"dataset": dataset, "tokenizer": tokenizer})
    check_pretrain_dataset(rendered)
    check_cells(rendered, "pretrain_dataset", "pretrain")  # the check that refused the rename
    check_sft_dataset(dataset)  # the other fix
    check_cells(dataset, "sft_dataset", "sft")
    with pytest.raises(
        ValueError, match=r"column 'text' holds .*Fix: render each conversation with the chat template"
    ):
        check_cells(dataset.rename_column("messages", "text"), "pretrain_dataset", "pretrain")


@pytest.mark.parametrize(
    "check, columns, column",
    [
        (check_pretrain_dataset, {"content": [{"title": "a", "body": "b"}]}, "content"),
        (check_pretrain_dataset, {"document": [["a", "b"]], "id": [1]}, "document"),
        (check_prompt_dataset, {"question": [{"text": "a"}]}, "question"),
        (check_sft_dataset, {"prompt": ["a"], "answer": [{"value": 7}]}, "answer"),
    ],
)
def test_a_slot_refusal_suggests_no_rename_the_cell_check_would_refuse(check, columns, column):
    """The same trap in each slot: a likely column whose cells are neither text nor (for prompts and completions) a
    conversation is not offered as a rename; the fix says to build the column from it."""
    with pytest.raises(ValueError) as raised:
        check(Dataset.from_dict(columns))
    message = str(raised.value)
    assert "rename_column" not in message and f"its {column!r} column holds values of type" in message, message


def test_a_slot_refusal_without_a_likely_column_names_placeholders():
    with pytest.raises(ValueError, match=re.escape("`dataset.rename_column('<prompt column>', 'prompt')`")):
        check_prompt_dataset(Dataset.from_dict({"a": ["x"], "b": ["y"]}))
    with pytest.raises(ValueError) as raised:
        check_sft_dataset(Dataset.from_dict({"a": ["x"], "b": ["y"]}))
    assert "`dataset.rename_columns({'<prompt column>': 'prompt', '<completion column>': 'completion'})`" in str(
        raised.value
    )
    with pytest.raises(ValueError) as raised:  # SFT rows in the RL slot: pointed to sft_dataset, no mapping
        check_prompt_dataset(Dataset.from_dict({"question": ["x"], "completion": ["y"]}))
    assert "pass them as `sft_dataset=`" in str(raised.value) and "rename_column" not in str(raised.value)


def test_dataset_columns():
    assert dataset_columns(Dataset.from_dict({"text": ["a"], "id": [1]})) == ["text", "id"]
    assert dataset_columns(Dataset.from_dict({"text": ["a"]}).to_iterable_dataset()) == ["text"]


# ---------------------------------------------------------------------------------------------------------------------
# SFT tokenisation
# ---------------------------------------------------------------------------------------------------------------------
def test_tokenize_sft_prompt_completion(tokenizer):
    dataset = Dataset.from_dict({"prompt": ["ab", "x"], "completion": ["cd", ""], "extra": [1, 2]})
    out = tokenize_sft_dataset(dataset, tokenizer, max_length=32)
    assert out.column_names == ["input_ids", "completion_mask"]
    eos = tokenizer.eos_token_id
    assert out[0]["input_ids"] == ids(tokenizer, "abcd") + [eos]
    assert out[0]["completion_mask"] == [0, 0, 1, 1, 1]  # completion + EOS only
    assert out[1]["input_ids"] == ids(tokenizer, "x") + [eos]  # empty completion: the EOS alone is learned
    assert out[1]["completion_mask"] == [0, 1]


def test_tokenize_sft_appends_eos_only_once(tokenizer):
    dataset = Dataset.from_dict({"prompt": ["ab"], "completion": ["cd" + tokenizer.eos_token]})
    out = tokenize_sft_dataset(dataset, tokenizer, max_length=32)
    assert out[0]["input_ids"] == ids(tokenizer, "abcd") + [tokenizer.eos_token_id]
    assert out[0]["input_ids"].count(tokenizer.eos_token_id) == 1
    assert out[0]["completion_mask"] == [0, 0, 1, 1, 1]


def test_tokenize_sft_messages_trains_every_token_as_trl(tokenizer):
    """A `messages` row is TRL's language-modeling form: the conversation rendered whole, every token trained (TRL's
    SFTTrainer sets labels = input_ids; TRAPO used to train the last assistant turn only, issue 37)."""
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "y"},
        {"role": "user", "content": "z"},
        {"role": "assistant", "content": "w"},
    ]
    out = tokenize_sft_dataset(Dataset.from_dict({"messages": [messages]}), tokenizer, max_length=200)
    row = out[0]
    full = tokenizer.apply_chat_template(messages, tokenize=False)  # nothing appended, no generation prompt
    assert row["input_ids"] == ids(tokenizer, full)
    assert row["completion_mask"] == [1] * len(row["input_ids"])


def test_tokenize_sft_conversational_prompt_completion(tokenizer):
    dataset = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": "q"}]], "completion": [[{"role": "assistant", "content": "ok"}]]}
    )
    row = tokenize_sft_dataset(dataset, tokenizer, max_length=200)[0]
    learned = [t for t, m in zip(row["input_ids"], row["completion_mask"]) if m]
    assert tokenizer.decode(learned) == "ok\n"  # as the template renders the turn (TRL's SFTTrainer appends no EOS)
    assert tokenizer.decode(row["input_ids"][: len(row["input_ids"]) - len(learned)]).endswith("assistant: ")


def test_a_text_sft_dataset_is_pointed_to_pretrain_dataset():
    """TRL's SFTTrainer takes a `text` column (language modeling, every token trained); TRAPO's `sft_dataset` does not,
    and its message names the argument that trains such rows so."""
    from trl_trapo.data import check_sft_dataset

    with pytest.raises(
        ValueError, match=r"it has \['text'\]\. A 'text' column .* pass such rows as `pretrain_dataset`"
    ):
        check_sft_dataset(Dataset.from_dict({"text": ["abc"]}))


@pytest.mark.parametrize("last", ["user", "tool", "system"])
def test_tokenize_sft_messages_may_end_with_any_role(tokenizer, last):
    """TRL's SFTTrainer trains a `messages` row ending with any role (and one without an assistant turn): so does
    TRAPO (it used to refuse rows not ending with the assistant's message)."""
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "y"},
        {"role": last, "content": "z"},
    ]
    dataset = Dataset.from_dict({"messages": [messages, messages[:1]]})
    check_cells(dataset, "sft_dataset", "sft")
    out = tokenize_sft_dataset(dataset, tokenizer, max_length=64)
    assert out[0]["input_ids"] == ids(tokenizer, tokenizer.apply_chat_template(messages, tokenize=False))
    assert all(out[0]["completion_mask"]) and all(out[1]["completion_mask"])
    with pytest.raises(ValueError, match="no assistant turn at row 1"):  # TRL fails on it: nothing to mask in
        check_cells(dataset, "sft_dataset", "sft", assistant_only_loss=True)


def test_tokenize_sft_truncates_from_the_right(tokenizer):
    dataset = Dataset.from_dict({"prompt": ["ab", "abcdef"], "completion": ["cdef", "g"]})
    out = tokenize_sft_dataset(dataset, tokenizer, max_length=4)
    # row 0: a b c d (e f </s> cut); row 1: the prompt alone fills 4 tokens -> no completion token left -> dropped
    assert len(out) == 1
    assert out[0]["input_ids"] == ids(tokenizer, "abcd")
    assert out[0]["completion_mask"] == [0, 0, 1, 1]


def test_tokenize_sft_errors_when_nothing_survives_truncation(tokenizer):
    dataset = Dataset.from_dict({"prompt": ["abc"], "completion": ["d"]})
    with pytest.raises(ValueError, match="sft_max_length=3"):
        tokenize_sft_dataset(dataset, tokenizer, max_length=3)


def test_sft_row_is_target_aligned():
    row = sft_row([5, 6, 7, 8], [0, 0, 1, 1])
    assert row.objective == SFT
    assert row.input_ids.tolist() == [5, 6, 7, 8]
    # target t predicts token t + 1: targets 7 and 8 (positions 1 and 2) count
    assert row.mask.tolist() == [0.0, 1.0, 1.0]


# ---------------------------------------------------------------------------------------------------------------------
# Prompt tokenisation
# ---------------------------------------------------------------------------------------------------------------------
def test_tokenize_prompt_dataset_text_and_conversational(tokenizer):
    out = tokenize_prompt_dataset(Dataset.from_dict({"prompt": ["ab=", "xyz"], "answer": ["1", "2"]}), tokenizer, 8)
    assert out["prompt_ids"] == [ids(tokenizer, "ab="), ids(tokenizer, "xyz")]
    assert out["answer"] == ["1", "2"]  # other columns are kept for the reward functions
    conversational = Dataset.from_dict({"prompt": [[{"role": "user", "content": "x"}]]})
    out = tokenize_prompt_dataset(conversational, tokenizer, 64)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True
    )
    assert out[0]["prompt_ids"] == ids(tokenizer, rendered)


def test_tokenize_prompt_dataset_strips_left_padding(tokenizer):
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    a, b, c, d = ids(tokenizer, "abcd")
    dataset = Dataset.from_dict(
        {
            # row 1 is left-padded with the EOS id (pad == eos tokenizers): the attention mask decides, not the id
            "input_ids": [[pad, pad, a, b], [eos, a, b, c], [a, b, c, d]],
            "attention_mask": [[0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]],
        }
    )
    out = tokenize_prompt_dataset(dataset, tokenizer, 4)
    assert out["prompt_ids"] == [[a, b], [a, b, c], [a, b, c, d]]
    assert out["prompt"] == ["ab", "abc", "abcd"]
    # without an attention mask the ids are taken as they are
    out = tokenize_prompt_dataset(Dataset.from_dict({"input_ids": [[a, b]]}), tokenizer, 4)
    assert out[0]["prompt_ids"] == [a, b] and out[0]["prompt"] == "ab"


def test_padded_input_ids_without_an_attention_mask_lose_their_padding(tokenizer, caplog):
    """TRL-PPO-style prompts padded to a fixed length and given without an `attention_mask`: the runs of the pad id
    at either end are padding, not prompt (trial 11's N59: every completion was sampled after them)."""
    pad = tokenizer.pad_token_id
    a, b, c = ids(tokenizer, "abc")
    dataset = Dataset.from_dict(
        # right-padded, left-padded, unpadded, and a pad id inside the prompt (kept)
        {"input_ids": [[a, b, pad, pad, pad], [pad, pad, a, b, c], [a, b, c, a, b], [pad, a, pad, b, pad]]}
    )
    with caplog.at_level("INFO", logger="trl_trapo.data"):
        out = tokenize_prompt_dataset(dataset, tokenizer, 5)
    assert out["prompt_ids"] == [[a, b], [a, b, c], [a, b, c, a, b], [a, pad, b]]
    assert out["prompt"] == ["ab", "abc", "abcab", "ab"]
    logged = [r.getMessage() for r in caplog.records if "pad id" in r.getMessage()]
    assert len(logged) == 1 and "3 of 4 rows" in logged[0] and "'attention_mask' column" in logged[0]
    # an all-padding row is an empty prompt, refused as one
    with pytest.raises(ValueError, match="empty"):
        tokenize_prompt_dataset(Dataset.from_dict({"input_ids": [[a], [pad, pad]]}), tokenizer, 4)


def test_strip_pad_runs_with_pad_as_eos_or_bos():
    # pad == EOS: a trailing EOS is padding (a prompt ending in end-of-text is not one a completion follows)
    assert strip_pad_runs([7, 8, 1, 1], pad_token_id=1) == [7, 8]
    # pad == BOS: the prompt's own BOS stays
    assert strip_pad_runs([2, 2, 2, 7, 8], pad_token_id=2, bos_token_id=2) == [2, 7, 8]
    assert strip_pad_runs([2, 7, 8, 2, 2], pad_token_id=2, bos_token_id=2) == [2, 7, 8]
    assert strip_pad_runs([2, 2], pad_token_id=2, bos_token_id=2) == []
    assert strip_pad_runs([0, 7, 0], pad_token_id=None) == [0, 7, 0]


def test_tokenize_prompt_dataset_never_truncates(tokenizer):
    dataset = Dataset.from_dict({"prompt": ["ab", "abcdef", "abcde"]})
    with pytest.raises(ValueError, match=r"2 prompts of `eval_dataset`.*max_prompt_length=4.*longest: 6.*row 1"):
        tokenize_prompt_dataset(dataset, tokenizer, 4, name="eval_dataset")


def test_tokenize_prompt_dataset_rejects_empty_prompts(tokenizer):
    with pytest.raises(ValueError, match=r"1 prompts of `train_dataset` are empty \(first at row 1\)"):
        tokenize_prompt_dataset(Dataset.from_dict({"prompt": ["ab", ""]}), tokenizer, 4)
    dataset = Dataset.from_dict({"input_ids": [[5, 6], [0, 0]], "attention_mask": [[1, 1], [0, 0]]})
    with pytest.raises(ValueError, match="empty"):
        tokenize_prompt_dataset(dataset, tokenizer, 4)


def test_text_in_input_ids_is_refused_with_the_prompt_column_as_the_fix():
    """Arrow stores a column of strings as text, and text columns skip the per-cell check; `input_ids` must not (a
    PPO script's text in `input_ids` used to reach `tokenizer.decode`: "'str' object cannot be interpreted as an
    integer")."""
    dataset = Dataset.from_dict({"input_ids": ["1+1=", "2+2="] * 4})
    with pytest.raises(ValueError) as raised:
        check_cells(dataset, "train_dataset", "prompts")
    message = str(raised.value)
    assert "`train_dataset` column 'input_ids' holds a value of type str at row 0 (and 7 more rows): '1+1='" in message
    assert "a list of token ids (ints)" in message and "dataset.rename_column('input_ids', 'prompt')" in message
    check_cells(Dataset.from_dict({"prompt": ["1+1="]}), "train_dataset", "prompts")  # text where text belongs


@pytest.mark.parametrize(
    "row, needles",
    [
        # TRL's apply_chat_template: "TypeError: can only concatenate list (not "str") to list" (D06)
        (
            {"prompt": [{"role": "user", "content": "ab="}], "completion": "ba"},
            [
                "`sft_dataset` row 0 (and 1 more rows): 'prompt' is a list of messages but 'completion' is text",
                "'role': 'assistant'",
            ],
        ),
        (
            {"prompt": "ab=", "completion": [{"role": "assistant", "content": "ba"}]},
            [
                "`sft_dataset` row 0 (and 1 more rows): 'prompt' is text but 'completion' is a list of messages",
                "'role': 'user'",
            ],
        ),
    ],
    ids=["messages-prompt-text-completion", "text-prompt-messages-completion"],
)
def test_a_prompt_and_completion_of_different_forms_are_refused_by_row(tmp_path, tokenizer, row, needles):
    """Refused with the other cell checks, before the model loads (the model is a path that does not exist)."""
    config = TRAPOConfig(output_dir=str(tmp_path), max_steps=1, report_to="none", save_strategy="no")
    with pytest.raises(ValueError) as error:
        TRAPOTrainer(
            "no/such/model-folder", args=config, processing_class=tokenizer, sft_dataset=Dataset.from_list([row] * 2)
        )
    for needle in [*needles, "both must have the same form"]:
        assert needle in str(error.value), error.value


# RL rows whose prompt's content is a list of text parts
CONTENT_PARTS = [{"prompt": [{"role": "user", "content": [{"type": "text", "text": "ab="}]}], "answer": "ba"}] * 2


def content_parts_refusal(tmp_path, tokenizer) -> str:
    """The message of the `ValueError` that building a trainer on `CONTENT_PARTS` under `tokenizer` raises."""
    config = TRAPOConfig(output_dir=str(tmp_path), max_steps=1, report_to="none", save_strategy="no")
    with pytest.raises(ValueError) as error:
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            args=config,
            processing_class=tokenizer,
            reward_funcs=exact_match_reward,
            train_dataset=Dataset.from_list(CONTENT_PARTS),
        )
    return str(error.value)


PARTS_TEMPLATE = (  # reads content parts, as Qwen3's template does
    "{% for message in messages %}{{ message['role'] }}: {% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def test_content_parts_are_refused_only_where_the_template_would_render_the_list(tmp_path, tokenizer):
    """Content given as `[{"type": "text", "text": ...}]` reaches a text-only model's chat template unchanged, as in
    TRL: a template that renders content as a string put the list's Python text in the prompt and trained on it
    (D02); it is refused, naming the row and the fix. A template that reads parts renders the text, and is taken."""
    message = content_parts_refusal(tmp_path, tokenizer)
    for needle in (
        "`train_dataset` column 'prompt' row 0: a message's content is a list of parts",
        "\"user: [{'type': 'text', 'text': 'ab='}]\\n\"",
        "''.join(p['text'] for p in m['content'])",
    ):
        assert needle in message, message
    reader = build_char_tokenizer()
    reader.chat_template = PARTS_TEMPLATE
    check_conversations_renderable(Dataset.from_list(CONTENT_PARTS), "train_dataset", reader)  # taken
    assert tokenize_prompt(CONTENT_PARTS[0]["prompt"], reader) == tokenize_prompt([user("ab=")], reader)


CONCAT_TEMPLATE = (  # joins content with `+`, as SmolLM2's template does: a list of parts is jinja's TypeError
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def test_content_parts_a_template_cannot_concatenate_are_refused_by_row(tmp_path):
    """Content parts on a template that concatenates content (SmolLM2's) were jinja's bare `TypeError: can only
    concatenate str (not "list") to str` at init, naming no dataset or row (trial 14, N37); TRL does not join text
    parts for a text-only model either. Refused at init, naming the row and the fix."""
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = CONCAT_TEMPLATE
    message = content_parts_refusal(tmp_path, tokenizer)
    for needle in (
        "`train_dataset` column 'prompt' row 0: a message's content is a list of parts",
        "cannot render (TypeError: can only concatenate str",
        "''.join(p['text'] for p in m['content'])",
    ):
        assert needle in message, message
    joined = [{"prompt": [user("ab=")], "answer": "ba"}] * 2
    check_conversations_renderable(Dataset.from_list(joined), "train_dataset", tokenizer)  # the fix is taken


def test_any_error_of_rendering_a_row_names_the_dataset_and_the_row():
    """Only Jinja's `TemplateError` was named by dataset and row; a Python error raised inside the template (here
    `str + int`) or by `apply_chat_template` itself came bare (trial 14, N37)."""
    from trl_trapo.data import check_templates_render

    prompts = Dataset.from_dict({"prompt": [[user("ab=")], [user("cd=")]]})
    typed = build_char_tokenizer()
    typed.chat_template = "{% for m in messages %}{{ m['content'] + 1 }}{% endfor %}"
    message = r"`train_dataset` row 0 could not be rendered \(TypeError: .*Fix the row to what the chat template takes"
    with pytest.raises(ValueError, match=message):
        check_templates_render([("train_dataset", prompts)], typed)
    with pytest.raises(ValueError, match=message):
        tokenize_prompt_dataset(prompts, typed, 64)


def user(text):
    return {"role": "user", "content": text}


@pytest.mark.parametrize(
    ("role", "kind", "column", "rows", "needles", "kept"),
    [
        (  # it used to say "has an empty assistant turn"
            "sft_dataset",
            "sft",
            "messages",
            [[user("a"), user("b")]] * 3,
            ["has no assistant turn at row 0, whose roles are user, user (and 2 more rows)", "Add the assistant's"],
            [False] * 3,
        ),
        (  # it used to say "missing value (None content in message 0)", with a filter that kept every row
            "train_dataset",
            "prompts",
            "prompt",
            [[{"role": "user", "text": "hi"}]] * 2,
            ["has a message without a 'content' key at row 0", "(its keys: 'role', 'text')", "'content': m['text']"],
            None,  # converted, not dropped: every row is in that format
        ),
        (  # a None inside a message or a token list: the filter drops exactly such rows
            "train_dataset",
            "prompts",
            "prompt",
            [[user("a")], [user(None)]],
            ["(None content in message 0) at row 1", "all(m['content'] is not None for m in row['prompt'])"],
            [True, False],
        ),
        (
            "train_dataset",
            "prompts",
            "input_ids",
            [[5, 6], [5, None]],
            ["(None at position 1) at row 1", "`dataset.filter(lambda row: None not in row['input_ids'])`"],
            [True, False],
        ),
    ],
    ids=["no-assistant-turn", "text-not-content", "none-content", "none-token"],
)
def test_messages_and_missing_values_are_named_for_what_they_are(role, kind, column, rows, needles, kept):
    dataset = Dataset.from_dict({column: rows})
    with pytest.raises(ValueError) as raised:  # a `messages` row needs an assistant turn with assistant_only_loss
        check_cells(dataset, role, kind, assistant_only_loss=column == "messages")
    message = str(raised.value)
    assert message.startswith(f"`{role}` column {column!r}")
    for needle in needles:
        assert needle in message, (needle, message)
    filter_ = re.search(r"dataset\.filter\((lambda row: .*)\)`", message)
    assert (filter_ is None) == (kept is None)
    if kept is not None:  # the suggested filter drops exactly the bad rows (it used to keep rows with a None inside)
        keep = eval(filter_[1])
        assert [bool(keep(row)) for row in dataset] == kept


def out_of_vocabulary_trainer(tmp_path, tokenizer, **datasets):
    return TRAPOTrainer(
        build_tiny_model(tokenizer),
        reward_funcs=exact_match_reward,
        args=TRAPOConfig(output_dir=str(tmp_path), report_to="none", max_steps=1, num_generations=2),
        processing_class=tokenizer,
        **{"train_dataset": Dataset.from_dict({"prompt": ["ab="] * 2, "answer": ["x"] * 2}), **datasets},
    )


@pytest.mark.parametrize("role", ["train_dataset", "eval_dataset"])
def test_a_token_id_outside_the_vocabulary_is_refused_at_construction(tmp_path, tokenizer, role):
    """It used to pass construction and fail in the first rollout's embedding ("index out of range in self")."""
    vocabulary = len(tokenizer)
    dataset = Dataset.from_dict({"input_ids": [[5, 6], [5, 6, 7, vocabulary + 10]], "answer": ["x", "y"]})
    with pytest.raises(ValueError) as raised:
        out_of_vocabulary_trainer(tmp_path, tokenizer, **{role: dataset})
    assert str(raised.value).startswith(
        f"`{role}` column 'input_ids' holds token id {vocabulary + 10} at row 1, outside the policy's vocabulary "
        f"[0, {vocabulary})"
    )
    negative = Dataset.from_dict({"input_ids": [[5, -1]], "answer": ["x"]})
    with pytest.raises(ValueError, match=r"holds token id -1 at row 0"):
        out_of_vocabulary_trainer(tmp_path, tokenizer, **{role: negative})


def test_evaluate_refuses_a_token_id_outside_the_vocabulary_before_generating(tmp_path, tokenizer):
    trainer = out_of_vocabulary_trainer(tmp_path, tokenizer)
    late = Dataset.from_dict({"input_ids": [[5, len(tokenizer)]], "answer": ["x"]})
    with pytest.raises(ValueError, match=r"`eval_dataset` column 'input_ids' holds token id \d+ at row 0"):
        trainer.evaluate(eval_dataset=late)


def test_padding_outside_the_vocabulary_is_not_a_token(tmp_path, tokenizer):
    """Positions the attention mask marks as padding are dropped before the ids are read (left padding with -100)."""
    a, b = ids(tokenizer, "ab")
    padded = Dataset.from_dict({"input_ids": [[-100, a, b], [a, b, a]], "attention_mask": [[0, 1, 1], [1, 1, 1]]})
    padded = padded.add_column("answer", ["x", "y"])
    trainer = out_of_vocabulary_trainer(tmp_path, tokenizer, train_dataset=padded)
    assert trainer.train_dataset is not None


# ---------------------------------------------------------------------------------------------------------------------
# ShardedSampler
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size, world_size", [(12, 3), (10, 3), (7, 2), (5, 1)])
def test_sharded_sampler_shards_are_disjoint_and_cover_each_epoch(size, world_size):
    samplers = [ShardedSampler(size, seed=4, rank=r, world_size=world_size) for r in range(world_size)]
    shard_sizes = [len(range(r, size, world_size)) for r in range(world_size)]
    orders = []
    for epoch in range(3):
        shards = [s.take(n) for s, n in zip(samplers, shard_sizes)]
        union = [i for shard in shards for i in shard]
        assert sorted(union) == list(range(size))  # disjoint and covering
        orders.append(union)
        assert all(s.epoch == epoch for s in samplers)
    assert len({tuple(o) for o in orders}) > 1  # a fresh permutation per epoch


def test_sharded_sampler_is_deterministic_and_crosses_epochs():
    a, b = ShardedSampler(9, seed=1), ShardedSampler(9, seed=1)
    assert a.take(20) == b.take(20)
    c = ShardedSampler(9, seed=1)
    first = c.take(20)
    assert sorted(first[:9]) == sorted(first[9:18]) == list(range(9))
    assert c.epoch == 2 and c.position == 2
    assert ShardedSampler(9, seed=2).take(9) != first[:9]


def test_sharded_sampler_without_shuffle_and_with_more_ranks_than_rows():
    assert ShardedSampler(5, shuffle=False).take(7) == [0, 1, 2, 3, 4, 0, 1]
    assert ShardedSampler(6, shuffle=False, rank=1, world_size=2).take(4) == [1, 3, 5, 1]
    # 2 rows, 3 ranks: every rank cycles through all rows, starting at a different one
    starts = [ShardedSampler(2, shuffle=False, rank=r, world_size=3).take(4) for r in range(3)]
    assert starts == [[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1]]


def test_sharded_sampler_state_round_trip():
    sampler = ShardedSampler(10, seed=3, rank=1, world_size=2)
    sampler.take(7)
    state = json.loads(json.dumps(sampler.state_dict()))
    restored = ShardedSampler(10, seed=3, rank=1, world_size=2)
    restored.load_state_dict(state)
    assert restored.take(13) == sampler.take(13)
    with pytest.raises(ValueError, match="dataset of 10 rows, this dataset has 11"):
        ShardedSampler(11, seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match="non-empty"):
        ShardedSampler(0)


# ---------------------------------------------------------------------------------------------------------------------
# PretrainStream
# ---------------------------------------------------------------------------------------------------------------------
def decoded_rows(tokenizer, rows):
    return [tokenizer.convert_ids_to_tokens(r.input_ids.tolist()) for r in rows]


def test_pretrain_packing_single_document_by_hand(tokenizer):
    stream = PretrainStream(Dataset.from_dict({"text": ["abc"]}), tokenizer, max_length=3)
    rows = stream.take(3)
    # a b c </s> a b c </s> a ... cut every 3 tokens
    assert decoded_rows(tokenizer, rows) == [["a", "b", "c"], ["</s>", "a", "b"], ["c", "</s>", "a"]]
    for r in rows:
        assert r.objective == PRETRAIN
        assert r.input_ids.dtype == torch.long and r.input_ids.numel() == 3
        assert r.mask.tolist() == [1.0, 1.0]


def test_pretrain_packing_follows_sampler_order_with_eos_between_documents(tokenizer):
    texts = ["ab", "cde", "", "f"]
    stream = PretrainStream(Dataset.from_dict({"text": texts}), tokenizer, max_length=5, seed=2)
    rows = stream.take(6)
    order = ShardedSampler(len(texts), seed=2).take(64)
    expected = [tok for i in order if texts[i] for tok in list(texts[i]) + ["</s>"]]  # empty documents are skipped
    packed = [tok for r in decoded_rows(tokenizer, rows) for tok in r]
    assert packed == expected[: len(packed)]
    assert all(r.input_ids.numel() == 5 and r.mask.numel() == 4 for r in rows)


def test_pretrain_chunked_mode(tokenizer):
    stream = PretrainStream(Dataset.from_dict({"text": ["abcdefg"]}), tokenizer, max_length=3, packing=False)
    # a..g + </s> = 8 tokens -> [a b c] [d e f] [g </s>]; each document chunked on its own
    rows = stream.take(4)
    assert decoded_rows(tokenizer, rows) == [["a", "b", "c"], ["d", "e", "f"], ["g", "</s>"], ["a", "b", "c"]]
    assert [r.mask.tolist() for r in rows[2:3]] == [[1.0]]
    # a 1-token tail (nothing to predict) is dropped: a..f + </s> = 7 -> [a b c] [d e f] ([</s>] dropped)
    stream = PretrainStream(Dataset.from_dict({"text": ["abcdef"]}), tokenizer, max_length=3, packing=False)
    assert decoded_rows(tokenizer, stream.take(3)) == [["a", "b", "c"], ["d", "e", "f"], ["a", "b", "c"]]


@pytest.mark.parametrize("packing", [True, False])
def test_pretrain_state_round_trip_continues_identically(tokenizer, packing):
    dataset = Dataset.from_dict({"text": ["hello", "ab", "xyz", "q", "long document"]})
    stream = PretrainStream(dataset, tokenizer, max_length=4, packing=packing, seed=1)
    stream.take(3)
    state = json.loads(json.dumps(stream.state_dict()))
    assert state["buffer"] or state["pending"]  # mid-stream: leftover tokens are part of the state
    restored = PretrainStream(dataset, tokenizer, max_length=4, packing=packing, seed=1)
    restored.load_state_dict(state)
    expected = [r.input_ids.tolist() for r in stream.take(40)]
    assert [r.input_ids.tolist() for r in restored.take(40)] == expected


def test_pretrain_streaming_dataset_by_hand(tokenizer):
    stream = PretrainStream(Dataset.from_dict({"text": ["ab", "cde", "f"]}).to_iterable_dataset(), tokenizer, 4)
    assert stream.streaming
    # streamed in order, restarted when exhausted: a b </s> c | d e </s> f | </s> a b </s> | c d e </s>
    assert decoded_rows(tokenizer, stream.take(4)) == [
        ["a", "b", "</s>", "c"],
        ["d", "e", "</s>", "f"],
        ["</s>", "a", "b", "</s>"],
        ["c", "d", "e", "</s>"],
    ]


def test_pretrain_streaming_state_round_trip(tokenizer):
    def make():
        dataset = Dataset.from_dict({"text": ["one", "two", "three", "four", "five"]}).to_iterable_dataset()
        return PretrainStream(dataset, tokenizer, max_length=6)

    stream = make()
    stream.take(2)
    state = json.loads(json.dumps(stream.state_dict()))
    assert {"epoch", "consumed", "buffer"} <= set(state)
    restored = make()
    restored.load_state_dict(state)
    assert [r.input_ids.tolist() for r in restored.take(30)] == [r.input_ids.tolist() for r in stream.take(30)]


def test_pretrain_streaming_split_by_rank(tokenizer):
    texts = ["a", "b", "c", "d"]
    firsts = []
    for rank in range(2):
        dataset = Dataset.from_dict({"text": texts}).to_iterable_dataset()
        stream = PretrainStream(dataset, tokenizer, max_length=8, packing=False, rank=rank, world_size=2)
        firsts.append([r[0] for r in decoded_rows(tokenizer, stream.take(2))])
    assert sorted(firsts[0] + firsts[1]) == texts  # disjoint halves of the stream


def test_pretrain_streaming_empty_raises(tokenizer):
    empty = Dataset.from_dict({"text": ["a"]}).to_iterable_dataset().filter(lambda example: False)
    stream = PretrainStream(empty, tokenizer, max_length=4)
    with pytest.raises(ValueError, match="yielded no rows"):
        stream.take(1)


def test_pretrain_all_empty_texts_raise(tokenizer):
    stream = PretrainStream(Dataset.from_dict({"text": ["", ""]}), tokenizer, max_length=4)
    with pytest.raises(ValueError, match="produced no tokens"):
        stream.take(1)


def test_pretrain_many_fills_for_one_request_do_not_raise(tokenizer):
    # every document is 1 character + EOS = 2 tokens; one fill reads 64 documents = 128 tokens, exactly one row of 128.
    # 1001 rows need 1001 productive fills.
    stream = PretrainStream(Dataset.from_dict({"text": ["a"]}), tokenizer, max_length=128)
    rows = stream.take(1001)
    assert len(rows) == 1001


def test_conversational_sft_row_gets_no_second_eos_when_the_template_ends_the_turn(tokenizer, caplog):
    """A chat template that ends each turn with EOS + newline: the row trains on `ok</s>\\n`, not `ok</s>\\n</s>`;
    a template without EOS gets none appended either (TRL's SFTTrainer trains what the template renders), and a
    warning says the model is not trained to stop."""
    import copy

    ending = copy.deepcopy(tokenizer)
    ending.chat_template = (
        "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    row = {"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "ok"}]}
    out = tokenize_sft_dataset(Dataset.from_list([row]), ending, max_length=64)[0]
    learned = [t for t, m in zip(out["input_ids"], out["completion_mask"]) if m]
    assert ending.convert_ids_to_tokens(learned) == ["o", "k", "</s>", "\n"]
    assert "train no EOS token" not in caplog.text
    with caplog.at_level("WARNING", logger="trl_trapo.data"):
        plain = tokenize_sft_dataset(Dataset.from_list([row]), tokenizer, max_length=64)[0]  # template without EOS
    learned = [t for t, m in zip(plain["input_ids"], plain["completion_mask"]) if m]
    assert tokenizer.convert_ids_to_tokens(learned) == ["o", "k", "\n"]
    assert "1 of 1 `sft_dataset` rows train no EOS token" in caplog.text


# ---------------------------------------------------------------------------------------------------------------------
# Streamed pretraining rows are checked as they are read (they cannot be scanned before training)
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("streaming", [True, False])
def test_a_missing_pretraining_text_is_refused_as_it_is_read(tokenizer, streaming):
    dataset = Dataset.from_dict({"text": ["abc", "def", None, "ghi"]})
    stream = PretrainStream(dataset.to_iterable_dataset() if streaming else dataset, tokenizer, max_length=4)
    row = r"2 of this process's stream" if streaming else r"2"
    with pytest.raises(
        ValueError, match=rf"`pretrain_dataset` column 'text' has a missing value \(None\) at row {row}"
    ):
        stream.take(8)


def test_a_streamed_document_of_nothing_but_unknown_tokens_is_refused(tokenizer, caplog):
    dataset = Dataset.from_dict({"text": ["abc", "d🙂f", "🙂 🙂"]}).to_iterable_dataset()
    stream = PretrainStream(dataset, tokenizer, max_length=4)
    with caplog.at_level("WARNING", logger="trl_trapo.data"):
        with pytest.raises(
            ValueError, match=r"`pretrain_dataset` column 'text' row 2 of this process's stream is nothing"
        ):
            stream.take(8)
    assert "`pretrain_dataset` row 1 of this process's stream holds 1 characters" in caplog.text


def test_flat_string_columns_are_checked_without_reading_them_and_selections_keep_their_rows():
    from trl_trapo.data import check_missing_values

    dataset = Dataset.from_dict({"prompt": ["a", None, "b", None]})
    check_missing_values(dataset.select([0, 2]), "train_dataset", ["prompt"])  # the selection has no missing value
    with pytest.raises(ValueError, match=r"at row 1 \(and 1 more rows\)"):
        check_missing_values(dataset.select([0, 1, 2, 3]), "train_dataset", ["prompt"])


# ---------------------------------------------------------------------------------------------------------------------
# disable_tqdm reaches the datasets' own progress bars (a fresh user's report: "Tokenizing ..." bars despite it)
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("disable_tqdm", [True, False])
def test_disable_tqdm_governs_tokenizing_bars_and_restores_the_setting(
    tmp_path, tokenizer, suite, tiny_trainer, capsys, disable_tqdm
):
    import datasets

    datasets.enable_progress_bars()
    try:
        tiny_trainer(tmp_path, tokenizer, suite, disable_tqdm=disable_tqdm)
        assert ("Tokenizing" in capsys.readouterr().err) is not disable_tqdm
        assert datasets.is_progress_bar_enabled()  # the process-wide setting the caller had is back
        datasets.disable_progress_bars()  # the caller's own "off" wins over disable_tqdm=False
        tiny_trainer(tmp_path, tokenizer, suite, disable_tqdm=disable_tqdm)
        assert "Tokenizing" not in capsys.readouterr().err
        assert not datasets.is_progress_bar_enabled()
    finally:
        datasets.enable_progress_bars()


def test_disable_tqdm_also_governs_the_bars_of_evaluation(tmp_path, tokenizer, suite, tiny_trainer, capsys):
    """The evaluator tokenizes its shards at every `evaluate()` call: those bars follow `disable_tqdm` too."""
    import datasets

    datasets.enable_progress_bars()
    try:
        trainer = tiny_trainer(tmp_path, tokenizer, suite, disable_tqdm=True)
        capsys.readouterr()
        metrics = trainer.evaluate(suite.eval)
        assert any(k.startswith("eval_") for k in metrics)  # it evaluated
        assert "Tokenizing" not in capsys.readouterr().err
        assert datasets.is_progress_bar_enabled()
    finally:
        datasets.enable_progress_bars()


@pytest.mark.parametrize("last", ["user", "tool", "assistant", "system", "developer", "ipython", "wizard"])
def test_a_prompt_may_end_with_any_role_and_gets_a_new_generation_prompt(tokenizer, last):
    """TRL 1.16's GRPOTrainer renders every prompt with `add_generation_prompt=True` whatever its last role (the
    roles are the chat template's to judge), and its SFTTrainer renders an SFT row's prompt so: `check_cells` accepts
    every last role, and the prompt is the template's rendering with a new generation prompt (TRAPO used to refuse
    a final `system` message and to continue a final assistant message; issue 37)."""
    prompt = [user("a"), {"role": last, "content": "b"}]
    expected = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    assert expected.endswith(f"{last}: b\nassistant: ")
    prompts = Dataset.from_dict({"prompt": [prompt]})
    check_cells(prompts, "train_dataset", "prompts")
    assert tokenize_prompt_dataset(prompts, tokenizer, 64)[0]["prompt_ids"] == ids(tokenizer, expected)
    sft = Dataset.from_dict({"prompt": [prompt], "completion": [[{"role": "assistant", "content": "c"}]]})
    check_cells(sft, "sft_dataset", "sft")
    row = tokenize_sft_dataset(sft, tokenizer, 64)[0]
    assert tokenizer.decode(row["input_ids"]) == expected + "c\n"
    assert tokenizer.decode([t for t, m in zip(row["input_ids"], row["completion_mask"]) if m]) == "c\n"


def test_roles_before_the_last_pass_and_are_tokenized(tokenizer):
    """A role anywhere in a prompt is the chat template's to render (`developer`, `ipython`, ...): TRL accepts it,
    and so does TRAPO, through the checks and the tokenization, with or without assistant_only_loss."""
    developer = {"role": "developer", "content": "be brief"}
    sft = Dataset.from_dict({"messages": [[developer, user("ab="), {"role": "assistant", "content": "ab"}]]})
    check_cells(sft, "sft_dataset", "sft")
    out = tokenize_sft_dataset(sft, tokenizer, 64)
    assert "be brief" in tokenizer.decode(out[0]["input_ids"])
    prompts = Dataset.from_dict({"prompt": [[user("x"), developer, user("ab=")]]})
    check_cells(prompts, "train_dataset", "prompts")
    assert "be brief" in tokenizer.decode(tokenize_prompt_dataset(prompts, tokenizer, 64)[0]["prompt_ids"])
    whole = Dataset.from_dict({"messages": [[user("a"), developer, {"role": "assistant", "content": "c"}]]})
    check_cells(whole, "sft_dataset", "sft", assistant_only_loss=True)
    check_cells(whole, "sft_dataset", "sft")


def test_the_distillation_prompts_are_checked_with_the_other_datasets(tmp_path):
    from trl_trapo.data import check_datasets
    from trl_trapo.objectives import WITH_DATA

    config = TRAPOConfig(output_dir=str(tmp_path), distillation_weight=1.0, report_to="none")
    prompts = Dataset.from_dict({"prompt": [[user("a")], [{"role": "system", "content": "s"}], None]})
    with pytest.raises(
        ValueError, match=r"`distillation_dataset` column 'prompt' has a missing value \(None\) at row 2"
    ):
        check_datasets(config, {"distill": prompts}, None, WITH_DATA)


def test_eval_messages_rows_are_checked_as_training_reads_them():
    """Evaluation tokenizes `messages` rows as the SFT objective does (rendered whole, as TRL): a row ending with a
    user turn passes `check_eval_dataset` (also run by `evaluate(eval_dataset=...)`) with and without
    assistant_only_loss (it used to be refused without); one without an assistant turn only without it."""
    from trl_trapo.data import check_eval_dataset

    row = [user("a"), {"role": "assistant", "content": "c"}, user("d")]
    dataset = Dataset.from_dict({"messages": [row]})
    check_eval_dataset({"held": dataset}, assistant_only_loss=True)
    check_eval_dataset({"held": dataset})
    no_reply = Dataset.from_dict({"messages": [row[:1]]})
    check_eval_dataset({"held": no_reply})
    with pytest.raises(ValueError, match=r"`eval_dataset\['held'\]` column 'messages' has no assistant turn at row 0"):
        check_eval_dataset({"held": no_reply}, assistant_only_loss=True)


@pytest.mark.parametrize("middle", ["system", "tool", "developer", "wizard"])
def test_a_vlm_rows_roles_are_refused_exactly_when_trls_prepare_multimodal_messages_refuses_them(middle):
    """A dataset with an image column goes through TRL's `prepare_multimodal_messages` (which places the images), and
    that refuses a role outside system / user / assistant / tool anywhere in the conversation: the processor's
    `datasets.map` said "its messages and its 0 images do not match (Invalid role in message: developer ...)", a
    wrong cause. `check_cells` refuses exactly those rows first, by dataset, row and role."""
    from trl.data_utils import prepare_multimodal_messages

    messages = [user("a"), {"role": middle, "content": "b"}, user("c"), {"role": "assistant", "content": "d"}]
    try:
        prepare_multimodal_messages(messages, [])
        trl_refuses = False
    except ValueError as error:
        assert f"Invalid role in message: {middle}" in str(error)
        trl_refuses = True
    assert trl_refuses == (middle not in ("system", "user", "assistant", "tool"))
    for kind, columns in [
        ("sft", {"messages": [messages]}),
        ("prompts", {"prompt": [messages[:3]]}),
        ("sft", {"prompt": [messages[:1]], "completion": [[{"role": middle, "content": "d"}]]}),
    ]:
        dataset = Dataset.from_dict({**columns, "images": [[]]})
        if trl_refuses:
            with pytest.raises(ValueError, match=rf"row 0: has a message of role '{middle}'.*prepare_multimodal"):
                check_cells(dataset, "sft_dataset" if kind == "sft" else "train_dataset", kind)
        else:
            check_cells(dataset, "sft_dataset" if kind == "sft" else "train_dataset", kind)


@pytest.mark.parametrize(
    "column, cell, message",
    [
        ("tools", "[{not json", r"`train_dataset` row 0, `tools`: the JSON string does not parse .*'\[\{not json'"),
        ("tools", ["multiply"], r"`train_dataset` row 0, `tools`\[0\]: the str 'multiply', not a JSON schema"),
        ("tools", {"name": "multiply"}, r"`train_dataset` row 0, `tools`: a dict where a list of tool schemas"),
        ("chat_template_kwargs", "enable_thinking=False", r"row 0, `chat_template_kwargs`: a str .*'enable_thinking"),
        ("chat_template_kwargs", [1, 2], r"`train_dataset` row 0, `chat_template_kwargs`: a list \('\[1, 2\]'\)"),
        # read as the row's tools: transformers' `'int' object is not iterable` inside the template check (trial 6, E07)
        (
            "chat_template_kwargs",
            {"tools": 5},
            r"row 0, `chat_template_kwargs`\[`tools`\]: a int where a list of tool",
        ),
    ],
)
def test_rl_prompts_per_row_template_cells_are_checked_by_row(tmp_path, column, cell, message):
    """A per-row `tools` cell of RL prompts that is not JSON or not a list of schemas was json's or transformers'
    error without a dataset or row; a `chat_template_kwargs` cell that is not a dict was dropped (trial 5: W09, W10,
    c09b, W11b, W42). Evaluation sets are checked the same way (W46)."""
    from trl_trapo.data import check_datasets, check_eval_dataset
    from trl_trapo.objectives import WITH_DATA

    config = TRAPOConfig(output_dir=str(tmp_path), report_to="none")
    dataset = Dataset.from_dict({"prompt": [[user("a")], [user("b")]], column: [cell, cell]})
    with pytest.raises(ValueError, match=message):
        check_datasets(config, {"rl": dataset}, None, WITH_DATA)
    with pytest.raises(ValueError, match=message.replace("train_dataset", "eval_dataset")):
        check_eval_dataset(dataset)


def test_a_template_that_writes_nothing_or_does_not_compile_is_blamed_not_the_rows():
    """A template rendering conversations with content as "" was reported as empty prompts to remove (W14); one with
    an unknown filter (Jinja's TemplateAssertionError, raised when it compiles) as a row the template refused (W16)."""
    from trl_trapo.data import check_templates_render

    prompts = Dataset.from_dict({"prompt": [[user("ab=")], [user("cd=")]]})
    silent = build_char_tokenizer()
    silent.chat_template = "{% for m in messages %}{% endfor %}"
    with pytest.raises(
        ValueError, match=r"The chat template renders 2 prompts of `train_dataset` as no tokens .*row 0"
    ):
        tokenize_prompt_dataset(prompts, silent, 64)
    broken = build_char_tokenizer()
    broken.chat_template = "{% for m in messages %}{{ m['content'] | nofilter }}{% endfor %}"
    with pytest.raises(ValueError, match=r"chat template does not compile \(line 1: No filter named 'nofilter'"):
        check_templates_render([("train_dataset", prompts)], broken)
    empty = Dataset.from_dict({"prompt": [[user("")]]})  # a prompt that is empty is still one to remove
    with pytest.raises(ValueError, match=r"1 prompts of `train_dataset` are empty \(first at row 0\); remove them"):
        tokenize_prompt_dataset(empty, silent, 64)


def test_an_unknown_role_in_sft_messages_is_warned_about(tmp_path, caplog):
    """An SFT `messages` row with a role typo ('wizard') trained without a word, rendered as given by the template
    (trial 5, c05); TRL accepts it too, so it is a warning, and known roles give none."""
    from trl_trapo.data import check_datasets
    from trl_trapo.objectives import WITH_DATA

    config = TRAPOConfig(output_dir=str(tmp_path), sft_weight=1.0, report_to="none")
    answer = {"role": "assistant", "content": "yo"}
    rows = Dataset.from_dict({"messages": [[{"role": "wizard", "content": "hi"}, answer]] * 3 + [[user("a"), answer]]})
    with caplog.at_level("WARNING", logger="trl_trapo.data"):
        check_datasets(config, {"sft": rows}, None, WITH_DATA)
    assert "3 rows of `sft_dataset` have role 'wizard' (first at row 0)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="trl_trapo.data"):
        check_datasets(config, {"sft": rows.select([3])}, None, WITH_DATA)
    assert "have role" not in caplog.text


def test_prepare_datasets_takes_the_objectives_data_by_name_and_each_objective_prepares_its_own(tmp_path):
    """`prepare_datasets` takes one mapping objective name -> dataset and the objective classes: each class's
    `prepare_data` makes its field of `PreparedData` (the SFT rows tokenized, the others None without data); a
    weight of 0 leaves a given dataset unprepared; a name no objective has is refused by name."""
    from trl_trapo.data import DataSetup, prepare_datasets
    from trl_trapo.objectives import WITH_DATA, SFTObjective

    tokenizer = build_char_tokenizer()
    rows = Dataset.from_dict({"prompt": ["ab=", "cd="], "completion": ["ba", "dc"]})
    args = TRAPOConfig(output_dir=str(tmp_path), report_to="none")
    setup = DataSetup(args, tokenizer, max_positions=256, has_rewards=False, has_critic=False)
    data = prepare_datasets(setup, {SFTObjective.NAME: rows}, None, WITH_DATA)
    assert data.sft["input_ids"] == SFTObjective.prepare_data(rows, setup)["input_ids"]
    assert len(data.sft) == 2 and (data.rl, data.pretrain, data.distill) == (None, None, None)
    off = DataSetup(
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", sft_weight=0.0), tokenizer, 256, False, False
    )
    with pytest.raises(ValueError, match="No objective has data: pass at least one of `pretrain_dataset`"):
        prepare_datasets(off, {SFTObjective.NAME: rows}, None, WITH_DATA)
    with pytest.raises(ValueError, match=r"no objective is named \['demos'\]; the objectives are \['pretrain', 'sft'"):
        prepare_datasets(setup, {"demos": rows}, None, WITH_DATA)


# ---------------------------------------------------------------------------------------------------------------------
# Datasets with a transform or a format (trial 15's N23)
# ---------------------------------------------------------------------------------------------------------------------
def questions() -> Dataset:
    return Dataset.from_dict({"question": ["ab", "cd", "ef", "gh"] * 4, "answer": ["ba", "dc", "fe", "hg"] * 4})


def as_prompts(batch: dict) -> dict:
    """A `with_transform` function: the `prompt` column built from `question` as rows are read."""
    return {"prompt": [f"rev {q}=" for q in batch["question"]], "answer": batch["answer"]}


def test_a_transform_that_builds_the_prompt_column_is_honoured(tmp_path, tokenizer, tiny_config):
    """The column check read `column_names`, which a transform leaves as stored: the rows had a `prompt`, and the
    trainer refused them for lacking one (its fix, a rename, would break the transform). The transform is applied
    as a read row goes through it, for the training prompts and the evaluation prompts alike."""
    seen = []

    def reversed_text(completions, prompts, answer, **kwargs):
        seen.extend(prompts)
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer),
        reward_funcs=reversed_text,
        args=tiny_config(tmp_path, max_steps=1, per_device_eval_batch_size=4),
        train_dataset=questions().with_transform(as_prompts),
        eval_dataset={"held_out": questions().select(range(4)).with_transform(as_prompts)},
        processing_class=tokenizer,
    )
    trainer.train()
    assert seen and all(re.fullmatch(r"rev [a-h]{2}=", p) for p in seen), seen[:4]
    seen.clear()
    metrics = trainer.evaluate(questions().select(range(4)).with_transform(as_prompts))
    assert "eval_reward" in metrics and sorted(set(seen)) == ["rev ab=", "rev cd=", "rev ef=", "rev gh="]


def test_a_transform_is_applied_as_datasets_formats_a_row_read():
    """`columns=` restricts what the transform gets; `output_all_columns=True` adds the other columns as they are;
    rows that a transform cannot read are refused naming the argument and the transform's error."""
    from trl_trapo.data import apply_transform, apply_transforms

    stored = questions().add_column("level", list(range(16)))
    for transformed in [
        stored.with_transform(as_prompts),
        stored.with_transform(as_prompts, columns=["question", "answer"]),
        stored.with_transform(lambda b: {"prompt": b["question"]}, columns=["question"], output_all_columns=True),
        stored.select([3, 1]).with_transform(as_prompts),
    ]:
        applied = apply_transform(transformed, "train_dataset")
        assert applied.format["type"] is None and applied.to_list() == [
            transformed[i] for i in range(len(transformed))
        ]
    assert apply_transform(stored, "train_dataset") is stored
    several = apply_transforms({"eval_dataset": {"a": stored.with_transform(as_prompts)}, "sft_dataset": None})
    assert sorted(several["eval_dataset"]["a"].column_names) == ["answer", "prompt"] and several["sft_dataset"] is None
    with pytest.raises(ValueError) as raised:
        apply_transform(stored.with_transform(lambda b: {"prompt": b["questoin"]}), "train_dataset")
    message = str(raised.value)
    for needle in ["`train_dataset` has a transform (", "KeyError: 'questoin'", "dataset.map(fn, batched=True)"]:
        assert needle in message, (needle, message)


def test_torch_formatted_datasets_train_and_evaluate_without_a_torch_warning(tmp_path, tokenizer, suite, tiny_config):
    """Rows of a `with_format("torch")` dataset hold tensors: `torch.tensor(tensor)` warned "To copy construct from
    a tensor, it is recommended to use sourceTensor.detach().clone()" for every RL round, SFT row and evaluation."""
    import warnings

    trainer = TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=tiny_config(tmp_path, max_steps=1, per_device_eval_batch_size=4),
        train_dataset=suite.rl_train.with_format("torch"),
        sft_dataset=suite.sft.with_format("torch"),
        processing_class=tokenizer,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
        metrics = trainer.evaluate(suite.eval.select(range(4)).with_format("torch"))
    assert "eval_reward" in metrics
    copied = [f"{w.filename}:{w.lineno}" for w in caught if "To copy construct from a tensor" in str(w.message)]
    assert not copied, copied
