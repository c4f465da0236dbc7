"""Conversational rows are tokenized as TRL 1.16's trainers tokenize them, token for token (issue 37).

TRL's contract is its behaviour: each row set goes through TRL's own code, as it runs inside its trainers (a real
`GRPOTrainer`'s prompt tokenization, a real `SFTTrainer`'s prepared dataset, both built on a tiny model in about a
second), and through TRAPO's (`tokenize_prompt_dataset`, `tokenize_sft_dataset`), and the ids and masks are compared.
Rows TRL's trainers fail on fail here too, with one message naming the dataset and the row.
"""

import json
import logging

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.utils import get_json_schema
from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

from trl_trapo.agents import use_chatml_tool_template
from trl_trapo.data import tokenize_prompt, tokenize_prompt_dataset, tokenize_sft_dataset
from trl_trapo.tasks import build_char_tokenizer


SMOLLM2 = "tests/fixtures/smollm2_tokenizer"


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def system(text):
    return {"role": "system", "content": text}


CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
PROMPTS = {
    "user-last": [user("2+3?")],
    "assistant-last": [user("2+3?"), assistant("It is")],
    "system-last": [user("2+3?"), system("be brief")],
    "tool-last": [
        user("2+3?"),
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "name": "add", "content": "5"},
    ],
    "system-assistant": [system("sys"), assistant("hello")],
}

# `enable_thinking` read by the template; the generation prompt differs from the assistant header of a rendered turn
# (an empty thought block, as Gemma's and Qwen3's templates write it), so the prompt is not a prefix of the row
THINKING_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% if enable_thinking %}<t>{% else %}<>{% endif %}{% endif %}"
)


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first number.
        b: the second number.
    """
    return a + b


@pytest.fixture(scope="module")
def chatml():
    """SmolLM2's real BPE tokenizer with a tool-calling ChatML template (with `{% generation %}` markers)."""
    return use_chatml_tool_template(AutoTokenizer.from_pretrained(SMOLLM2))


@pytest.fixture(scope="module")
def thinking():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = THINKING_TEMPLATE
    return tokenizer


def tiny_model(tokenizer) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=1024, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def no_reward(completions, **kwargs):
    return [0.0] * len(completions)


def grpo_prompt_ids(tmp_path, tokenizer, prompts, tools=None, chat_template_kwargs=None) -> list[list[int]]:
    """The prompt ids a real `GRPOTrainer` generates from (its `_tokenize_prompts`, which `_generate` calls)."""
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"), report_to="none", use_cpu=True, bf16=False, per_device_train_batch_size=2,
        num_generations=2, max_completion_length=4, chat_template_kwargs=chat_template_kwargs,
    )  # fmt: skip
    dataset = Dataset.from_dict({"prompt": prompts})
    trainer = GRPOTrainer(
        model=tiny_model(tokenizer), reward_funcs=no_reward, args=args, train_dataset=dataset,
        processing_class=tokenizer, tools=tools,
    )  # fmt: skip
    ids, _, _ = trainer._tokenize_prompts(list(dataset["prompt"]))
    return [list(i) for i in ids]


def sft_rows(tmp_path, tokenizer, dataset, **config) -> list[tuple[list[int], list[int]]]:
    """`(input_ids, mask)` of each row of a real `SFTTrainer`'s prepared dataset (mask: 1 where the label counts)."""
    args = SFTConfig(output_dir=str(tmp_path / "sft"), report_to="none", use_cpu=True, bf16=False, **config)
    trainer = SFTTrainer(model=tiny_model(tokenizer), args=args, train_dataset=dataset, processing_class=tokenizer)
    return [(row["input_ids"], [int(label != -100) for label in row["labels"]]) for row in trainer.train_dataset]


def trapo_rows(tokenizer, dataset, **kwargs) -> list[tuple[list[int], list[int]]]:
    return [(r["input_ids"], r["completion_mask"]) for r in tokenize_sft_dataset(dataset, tokenizer, 1024, **kwargs)]


# ---------------------------------------------------------------------------------------------------------------------
# RL (and distillation) prompts: as GRPOTrainer renders them
# ---------------------------------------------------------------------------------------------------------------------
def test_rl_prompts_of_every_last_role_are_grpotrainers_ids(tmp_path, chatml):
    """Any last role is rendered with a new generation prompt, a final assistant message included (TRAPO used to
    continue it, and to refuse a final `system` message, which GRPOTrainer renders)."""
    prompts = list(PROMPTS.values())
    expected = grpo_prompt_ids(tmp_path, chatml, prompts)
    ours = tokenize_prompt_dataset(Dataset.from_dict({"prompt": prompts}), chatml, 512)["prompt_ids"]
    for name, mine, theirs in zip(PROMPTS, ours, expected, strict=True):
        assert mine == theirs, name
    opened = chatml.decode(ours[1])
    assert opened.endswith("It is<|im_end|>\n<|im_start|>assistant\n"), opened  # a new turn, not a continuation


def test_rl_prompts_with_chat_template_kwargs_and_tools_are_grpotrainers_ids(tmp_path, chatml, thinking):
    prompts = [PROMPTS["user-last"], PROMPTS["assistant-last"]]
    kwargs = {"enable_thinking": True}
    expected = grpo_prompt_ids(tmp_path, thinking, prompts, chat_template_kwargs=kwargs)
    ours = list(tokenize_prompt_dataset(Dataset.from_dict({"prompt": prompts}), thinking, 512, kwargs)["prompt_ids"])
    assert ours == expected
    assert thinking.decode(ours[0]).endswith("assistant: <t>")
    # tools: GRPOTrainer renders its tools' schemas into every prompt; TRAPO's tool loop renders them the same way
    expected = grpo_prompt_ids(tmp_path, chatml, prompts, tools=[add])
    ours = [tokenize_prompt(p, chatml, {"tools": [get_json_schema(add)]}) for p in prompts]
    assert ours == expected
    assert '"name": "add"' in chatml.decode(ours[0])


def test_a_template_that_refuses_a_prompt_fails_in_both_and_here_names_the_row(tmp_path):
    """Roles are the template's to judge: a template that raises (as Llama's and Mistral's do for roles out of
    order) fails GRPOTrainer with the template's message alone; TRAPO names the dataset and the row."""
    from jinja2 import TemplateError

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = (
        "{% if messages[-1]['role'] == 'system' %}{{ raise_exception('no system message last') }}{% endif %}"
        + tokenizer.chat_template
    )
    prompts = [PROMPTS["user-last"], PROMPTS["system-last"]]
    with pytest.raises(TemplateError, match="no system message last"):
        grpo_prompt_ids(tmp_path, tokenizer, prompts)
    with pytest.raises(ValueError, match=r"`train_dataset` row 1: the chat template refused .*no system message last"):
        tokenize_prompt_dataset(Dataset.from_dict({"prompt": prompts}), tokenizer, 512)


# ---------------------------------------------------------------------------------------------------------------------
# SFT rows: as SFTTrainer tokenizes them
# ---------------------------------------------------------------------------------------------------------------------
def test_sft_prompt_completion_rows_of_every_last_role_are_sfttrainers(tmp_path, chatml):
    prompts = list(PROMPTS.values())
    dataset = Dataset.from_dict({"prompt": prompts, "completion": [[assistant("5")]] * len(prompts)})
    expected = sft_rows(tmp_path, chatml, dataset)
    ours = trapo_rows(chatml, dataset)
    for name, mine, theirs in zip(PROMPTS, ours, expected, strict=True):
        assert mine == theirs, name
    learned = [t for t, m in zip(*ours[1]) if m]
    assert chatml.decode(learned) == "5<|im_end|>\n"  # a new assistant turn after "It is", ending as ChatML ends it


@pytest.mark.parametrize("form", ["json", "list"])
def test_sft_rows_with_their_own_tools_are_sfttrainers(tmp_path, chatml, form):
    schemas = [get_json_schema(add)]
    tools = json.dumps(schemas) if form == "json" else schemas
    dataset = Dataset.from_dict(
        {
            "prompt": [PROMPTS["user-last"], PROMPTS["tool-last"]],
            "completion": [[{"role": "assistant", "content": "", "tool_calls": [CALL]}], [assistant("5")]],
            "tools": [tools, tools],
        }
    )
    ours = trapo_rows(chatml, dataset)
    assert ours == sft_rows(tmp_path, chatml, dataset)
    assert '"name": "add"' in chatml.decode(ours[0][0])


def test_sft_rows_with_their_own_chat_template_kwargs_and_a_prefix_mismatch_are_sfttrainers(
    tmp_path, thinking, caplog
):
    """The prompt rendered alone ends with a thought block the whole row does not have: the completion starts where
    the two diverge (TRL's `common_prefix_length`), with one warning; per-row `chat_template_kwargs` are read."""
    dataset = Dataset.from_dict(
        {
            "prompt": [PROMPTS["user-last"], PROMPTS["assistant-last"]],
            "completion": [[assistant("5")], [assistant("5")]],
            "chat_template_kwargs": [{"enable_thinking": True}, {"enable_thinking": False}],
        }
    )
    expected = sft_rows(tmp_path, thinking, dataset)
    with caplog.at_level(logging.WARNING, logger="trl_trapo.data"):
        ours = trapo_rows(thinking, dataset)
    assert ours == expected
    prompt_ids = tokenize_prompt(PROMPTS["user-last"], thinking, {"enable_thinking": True})
    assert thinking.decode(prompt_ids).endswith("assistant: <t>")  # the kwargs reached the template
    assert "2 of 2 `sft_dataset` rows: the tokenized prompt is not a prefix" in caplog.text
    assert "train no EOS token" in caplog.text  # this template ends no turn with EOS: nothing is appended (as TRL)


def test_sft_text_rows_are_sfttrainers_when_tokens_merge_across_the_boundary(tmp_path, chatml):
    """Text rows are tokenized whole (`prompt + completion + eos`), so BPE merges across the boundary: the prompt's
    last token is not the row's, and the completion starts where they diverge."""
    dataset = Dataset.from_dict({"prompt": ["The cat sat on the mat wit", "2 + 3 ="], "completion": ["h a hat", " 5"]})
    from trl_trapo.data import tokenize_sft_row

    ours = trapo_rows(chatml, dataset)
    assert ours == sft_rows(tmp_path, chatml, dataset)
    _, _, left_out = tokenize_sft_row(dataset[0], chatml)
    assert left_out  # the case where the prompt is not a prefix
    assert all(ids[-1] == chatml.eos_token_id and mask[-1] == 1 for ids, mask in ours)


TOOL_CALL_TURN = {"role": "assistant", "content": "", "tool_calls": [CALL]}
TOOL_RESULT = {"role": "tool", "name": "add", "content": "5"}
CONVERSATIONS = {  # `messages` rows: TRL's SFTTrainer trains each whatever its last role
    "assistant-last": [system("sys"), user("2+3?"), assistant("4"), user("again?"), assistant("5")],
    "user-last": [user("2+3?"), assistant("5"), user("thanks")],
    "tool-last": [user("2+3?"), TOOL_CALL_TURN, TOOL_RESULT],
    "trace": [user("2+3?"), TOOL_CALL_TURN, TOOL_RESULT, assistant("5")],
    "assistant-only": [assistant("5")],
    "no-assistant": [system("sys"), user("2+3?")],
}


def test_sft_messages_rows_of_every_last_role_are_sfttrainers_every_token_trained(tmp_path, chatml):
    """A `messages` row is TRL's language-modeling form: SFTTrainer trains every token of the rendered conversation
    (labels = input_ids; `completion_only_loss` applies to prompt-completion rows only). TRAPO used to train the last
    assistant turn only and to refuse a row not ending with one."""
    schemas = [get_json_schema(add)]
    dataset = Dataset.from_dict(
        {"messages": list(CONVERSATIONS.values()), "tools": [json.dumps(schemas)] * len(CONVERSATIONS)}
    )
    expected = sft_rows(tmp_path, chatml, dataset)
    ours = trapo_rows(chatml, dataset)
    for name, mine, theirs in zip(CONVERSATIONS, ours, expected, strict=True):
        assert mine == theirs, name
        assert all(mine[1]), name
    assert chatml.decode(ours[0][0]).startswith("<|im_start|>system\nsys")  # the system turn is trained too
    assert '"name": "add"' in chatml.decode(ours[2][0])  # the row's tools


def test_sft_messages_rows_are_sfttrainers_when_truncated(tmp_path, chatml):
    """Truncated to `max_length` from the right (TRL's `truncation_mode="keep_start"`), still every token trained."""
    dataset = Dataset.from_dict({"messages": [CONVERSATIONS["assistant-last"], CONVERSATIONS["user-last"]]})
    expected = sft_rows(tmp_path, chatml, dataset, max_length=12)
    ours = [(r["input_ids"], r["completion_mask"]) for r in tokenize_sft_dataset(dataset, chatml, 12)]
    assert ours == expected and all(len(ids) == 12 for ids, _ in ours)


@pytest.mark.parametrize("column", ["messages", "prompt"])
def test_sft_rows_with_assistant_only_loss_are_sfttrainers(tmp_path, chatml, column):
    """With assistant_only_loss, TRL trains the template's assistant mask (every assistant turn of a `messages` row,
    whatever its last role), limited to the completion for a prompt-completion row (an assistant turn inside the
    prompt is context)."""
    messages = [user("2+3?"), assistant("4"), user("again?"), assistant("5")]
    if column == "messages":
        rows = [messages, messages + [user("thanks")], CONVERSATIONS["trace"], CONVERSATIONS["tool-last"]]
        dataset = Dataset.from_dict({"messages": rows})
    else:
        dataset = Dataset.from_dict({"prompt": [messages[:-1]], "completion": [messages[-1:]]})
    ours = trapo_rows(chatml, dataset, assistant_only_loss=True)
    assert ours == sft_rows(tmp_path, chatml, dataset, assistant_only_loss=True)
    trained = [chatml.decode([t for t, m in zip(*row) if m]) for row in ours]
    if column == "messages":
        assert trained[0] == trained[1] == "4<|im_end|>5<|im_end|>"  # the user turn after them is not trained
        assert (
            "<tool_call>" in trained[2] and trained[2].endswith("5<|im_end|>") and "<tool_response>" not in trained[2]
        )
    else:
        assert trained == ["5<|im_end|>"]


def test_a_messages_row_without_an_assistant_turn_under_assistant_only_loss_fails_in_both(tmp_path, chatml):
    """TRL's SFTTrainer fails on it (nothing in the assistant mask); TRAPO refuses it before anything loads, naming
    the row and the fix."""
    from trl_trapo.data import check_cells

    dataset = Dataset.from_dict({"messages": [CONVERSATIONS["assistant-last"], CONVERSATIONS["no-assistant"]]})
    with pytest.raises(RuntimeError, match="at least one example has no assistant tokens"):
        sft_rows(tmp_path, chatml, dataset, assistant_only_loss=True)
    with pytest.raises(ValueError, match="'messages' has no assistant turn at row 1"):
        check_cells(dataset, "sft_dataset", "sft", assistant_only_loss=True)


@pytest.mark.parametrize("dataset", ["train_dataset", "sft_dataset"])
def test_a_template_that_refuses_a_row_is_reported_before_any_model_loads(tmp_path, dataset):
    """One row of each sequence of roles is rendered before anything loads: here the model is a path that does not
    exist, and the template's refusal, named by dataset and row, is the error reported."""
    from trl_trapo import TRAPOConfig, TRAPOTrainer
    from trl_trapo.tasks import exact_match_reward

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
        "{{ raise_exception('a system message must come first') }}{% endif %}{% endfor %}" + tokenizer.chat_template
    )
    prompts = [[user("a=")], [user("b=")], [user("c="), system("late"), user("d=")]]
    rows = {
        "train_dataset": Dataset.from_dict({"prompt": prompts, "answer": ["a", "b", "c"]}),
        "sft_dataset": Dataset.from_dict({"prompt": prompts, "completion": [[assistant("x")]] * 3}),
    }
    config = TRAPOConfig(output_dir=str(tmp_path), max_steps=1, report_to="none", save_strategy="no")
    reward = {"reward_funcs": exact_match_reward} if dataset == "train_dataset" else {}
    with pytest.raises(ValueError, match=rf"`{dataset}` row 2: the chat template refused .*must come first"):
        TRAPOTrainer(
            "no/such/model-folder", args=config, processing_class=tokenizer, **{dataset: rows[dataset]}, **reward
        )


def test_chat_template_kwargs_holding_an_argument_trapo_sets_is_refused_by_name(tmp_path, chatml):
    """GRPOTrainer passes `add_generation_prompt=True` and `**chat_template_kwargs` together: a key it sets itself
    fails every prompt with `got multiple values for keyword argument`; TRAPOConfig refuses it when it is built."""
    from trl_trapo import TRAPOConfig

    with pytest.raises(TypeError, match="multiple values for keyword argument 'add_generation_prompt'"):
        grpo_prompt_ids(
            tmp_path, chatml, [PROMPTS["user-last"]], chat_template_kwargs={"add_generation_prompt": False}
        )
    with pytest.raises(ValueError, match=r"chat_template_kwargs=\{'add_generation_prompt': False\} is invalid: drop"):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", chat_template_kwargs={"add_generation_prompt": False})
    with pytest.raises(ValueError, match="'continue_final_message'.*give text to continue"):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", chat_template_kwargs={"continue_final_message": True})
    TRAPOConfig(output_dir=str(tmp_path), report_to="none", chat_template_kwargs={"enable_thinking": False})


@pytest.mark.parametrize(
    "tools, message",
    [
        (5, r"chat_template_kwargs\['tools'\]=5 is invalid: a int where a list of tool schemas belongs"),
        ("[{x", r"chat_template_kwargs\['tools'\]='\[\{x' is invalid: the JSON string does not parse"),
        (["multiply"], r"chat_template_kwargs\['tools'\]=\['multiply'\] is invalid: the str 'multiply', not a JSON"),
    ],
)
def test_tools_in_chat_template_kwargs_are_checked_as_a_rows_tools(tmp_path, tools, message):
    """`chat_template_kwargs={"tools": 5}` (the tools job's `--chat_template_kwargs '{"tools": 5}'`) reached
    transformers' template call: `TypeError: 'int' object is not iterable` after the data was built (trial 6, E07).
    `tools` there is every row's tool schemas, checked as a row's `tools` cell is, when the config is built."""
    from trl_trapo import TRAPOConfig

    with pytest.raises(ValueError, match=message):
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", chat_template_kwargs={"tools": tools})
    schema = {"type": "function", "function": {"name": "multiply", "parameters": {"type": "object"}}}
    TRAPOConfig(output_dir=str(tmp_path), report_to="none", chat_template_kwargs={"tools": [schema]})
