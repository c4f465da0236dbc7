"""Tests of the built-in verifiable task suite, its character tokenizer and its tiny model (CPU, offline, fast)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_trapo.tasks import (
    EOS_TOKEN,
    SPLIT_RL_ONLY,
    SPLIT_SFT_TASKS,
    TASK_FAMILIES,
    build_tiny_model,
    exact_match_reward,
    greedy_accuracy,
    make_task_suite,
)


SMALL = {"num_pretrain_docs": 300, "num_sft_per_task": 200, "num_rl_per_task": 100, "num_eval_per_task": 30}
FAMILIES = {family.name: family for family in TASK_FAMILIES}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models, one thread


@pytest.fixture(scope="module")
def suite():
    return make_task_suite(seed=0, **SMALL)


def _family(prompt: str):
    return FAMILIES[prompt.split(" ", 1)[0]]


def _input(prompt: str) -> str:
    return prompt.split(" ", 1)[1].removesuffix("=")


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------


def test_tokenizer_special_tokens_are_distinct(tokenizer):
    ids = [tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id]
    assert None not in ids
    assert len(set(ids)) == 4
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert (tokenizer.pad_token, tokenizer.eos_token, tokenizer.bos_token) == ("<pad>", EOS_TOKEN, "<s>")
    assert tokenizer.padding_side == "right"
    # No special token is added implicitly: the trainers append eos themselves.
    assert tokenizer("ab")["input_ids"] == tokenizer.convert_tokens_to_ids(["a", "b"])


def test_tokenizer_round_trips_every_suite_string(tokenizer, suite):
    strings = (
        list(suite.pretrain["text"])
        + [p + c for p, c in zip(list(suite.sft["prompt"]), list(suite.sft["completion"]))]
        + list(suite.rl_train["prompt"])
        + list(suite.rl_train["answer"])
        + list(suite.eval["prompt"])
        + ["  two  spaces \n\tand whitespace  "]
    )
    encoded = tokenizer(strings, add_special_tokens=False)["input_ids"]
    for text, ids in zip(strings, encoded):
        assert len(ids) == len(text)  # one token per character
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids) == text


def test_tokenizer_decode_skips_special_tokens(tokenizer):
    ids = tokenizer("a b", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id, tokenizer.pad_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a b"
    assert tokenizer.decode(ids) == "a b</s><pad>"


def test_chat_template_renders_plain_prompt(tokenizer):
    messages = [{"role": "user", "content": "x"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == "user: x\nassistant: "
    assert tokenizer.apply_chat_template(messages, tokenize=False) == "user: x\n"


def test_tokenizer_save_and_reload_offline(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "rev abcd= dcba\n the largest digit of 4719 is 9."
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert reloaded.decode(reloaded(text)["input_ids"]) == text
    assert (reloaded.pad_token_id, reloaded.eos_token_id, reloaded.bos_token_id) == (
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        tokenizer.bos_token_id,
    )
    assert reloaded.chat_template == tokenizer.chat_template
    assert len(reloaded) == len(tokenizer)


# ---------------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------------


def test_model_uses_tokenizer_ids_and_fp32(tokenizer):
    model = build_tiny_model(tokenizer)
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.bos_token_id == tokenizer.bos_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    assert model.config.model_type in ("llama", "qwen2")
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_model_seed_is_deterministic_and_leaves_global_rng_alone(tokenizer):
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    first = build_tiny_model(tokenizer, seed=0)
    assert torch.equal(torch.rand(1), expected_next)  # the caller's RNG stream is untouched
    second = build_tiny_model(tokenizer, seed=0)
    other = build_tiny_model(tokenizer, seed=1)
    for (name, a), b in zip(first.named_parameters(), second.parameters()):
        assert torch.equal(a, b), name
    assert any(not torch.equal(a, c) for a, c in zip(first.parameters(), other.parameters()))


def test_model_save_and_reload(tokenizer, tmp_path):
    model = build_tiny_model(tokenizer).eval()
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    input_ids = tokenizer(["rev abcd="], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids).logits, model(input_ids).logits)
    assert reloaded.config.vocab_size == len(tokenizer)


def test_model_config_path_is_used_and_validated(tokenizer, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
            }
        )
    )
    model = build_tiny_model(tokenizer, config_path=path)
    assert model.config.model_type == "qwen2"
    assert model.config.hidden_size == 32
    path.write_text(json.dumps({"hidden_size": 32}))
    with pytest.raises(ValueError, match="model_type"):
        build_tiny_model(tokenizer, config_path=path)


# ---------------------------------------------------------------------------------------------------------------
# Suite
# ---------------------------------------------------------------------------------------------------------------


def test_suite_columns_and_reward_funcs(suite):
    assert suite.pretrain.column_names == ["text"]
    assert suite.sft.column_names == ["prompt", "completion"]
    assert suite.rl_train.column_names == ["prompt", "answer", "task", "demonstration"]
    # guidance's demonstrations: the answer where the family has SFT data, none for the RL-only family
    for row in suite.rl_train:
        assert row["demonstration"] == ("" if row["task"] == "lst" else row["answer"]), row
    assert suite.eval.column_names == ["prompt", "answer", "task", "split"]
    assert exact_match_reward in suite.reward_funcs
    assert not any(c.endswith(EOS_TOKEN) for c in list(suite.sft["completion"]))


def test_eval_is_disjoint_from_all_training_data(suite):
    eval_prompts = set(list(suite.eval["prompt"]))
    assert eval_prompts.isdisjoint(list(suite.sft["prompt"]))
    assert eval_prompts.isdisjoint(list(suite.rl_train["prompt"]))
    corpus = "\n".join(list(suite.pretrain["text"]))
    assert not any(prompt in corpus for prompt in eval_prompts)
    # Nor does any pretraining text use the prompt format at all.
    assert not any(f"{name} " in corpus for name in FAMILIES)


def test_eval_has_both_splits_and_rl_only_family_has_no_sft(suite):
    splits = set(list(suite.eval["split"]))
    assert splits == {SPLIT_SFT_TASKS, SPLIT_RL_ONLY}
    rl_only_tasks = {t for t, s in zip(list(suite.eval["task"]), list(suite.eval["split"])) if s == SPLIT_RL_ONLY}
    sft_tasks = {t for t, s in zip(list(suite.eval["task"]), list(suite.eval["split"])) if s == SPLIT_SFT_TASKS}
    assert rl_only_tasks and sft_tasks and rl_only_tasks.isdisjoint(sft_tasks)
    sft_families = {_family(p).name for p in list(suite.sft["prompt"])}
    assert sft_families == sft_tasks
    assert rl_only_tasks <= set(list(suite.rl_train["task"]))  # RL is the only signal for these


def test_answers_are_correct_and_short(suite):
    rows = list(zip(list(suite.sft["prompt"]), list(suite.sft["completion"]))) + list(
        zip(
            list(suite.rl_train["prompt"]) + list(suite.eval["prompt"]),
            list(suite.rl_train["answer"]) + list(suite.eval["answer"]),
        )
    )
    for prompt, answer in rows:
        assert _family(prompt).solve(_input(prompt)) == answer
        assert len(prompt) <= 24 and 1 <= len(answer) <= 6
    assert list(suite.rl_train["task"]) == [_family(p).name for p in list(suite.rl_train["prompt"])]
    # spot checks by hand
    assert FAMILIES["rev"].solve("cfab") == "bafc"
    assert FAMILIES["nxt"].solve("bdh") == "cei"
    assert FAMILIES["min"].solve("4719") == "1"
    assert FAMILIES["lst"].solve("cfab") == "b"


def test_rl_only_fraction_of_rl_train():
    for fraction in (0.0, 0.5, 0.75):
        suite = make_task_suite(seed=0, **{**SMALL, "num_pretrain_docs": 0}, rl_only_fraction=fraction)
        rl_only = {t for t, s in zip(list(suite.eval["task"]), list(suite.eval["split"])) if s == SPLIT_RL_ONLY}
        share = sum(t in rl_only for t in list(suite.rl_train["task"])) / len(suite.rl_train)
        assert share == pytest.approx(fraction, abs=0.01)


def test_suite_is_deterministic_in_the_seed():
    a, b, c = (make_task_suite(seed=s, **SMALL) for s in (0, 0, 1))
    for name in ("pretrain", "sft", "rl_train", "eval"):
        assert getattr(a, name).to_dict() == getattr(b, name).to_dict(), name
        assert getattr(a, name).to_dict() != getattr(c, name).to_dict(), name


def test_pretraining_documents_vary_in_length(suite):
    lengths = sorted(len(text) for text in list(suite.pretrain["text"]))
    assert lengths[0] < 40 and lengths[-1] > 200


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_sft_per_task": -1}, "num_sft_per_task"),
        ({"rl_only_fraction": 1.0}, "rl_only_fraction"),
        ({"max_doc_sentences": 0}, "max_doc_sentences"),
        ({"num_eval_per_task": 10**6}, "num_eval_per_task"),
    ],
)
def test_make_task_suite_rejects_bad_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_task_suite(seed=0, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Reward
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("dcba", "dcba", 1.0),
        ("  dcba \n", "dcba", 1.0),  # surrounding whitespace is ignored
        ("dcba</s>junk", "dcba", 1.0),  # anything after the eos text is ignored
        ("b.", "b", 1.0),  # trailing sentence punctuation is ignored (the corpus states facts as sentences)
        ("7 !", "7", 1.0),
        (".b", "b", 0.0),  # ... but not leading punctuation
        ("b.c", "b", 0.0),
        ("dcb", "dcba", 0.0),
        ("dcbaa", "dcba", 0.0),
        ("d cba", "dcba", 0.0),
        ("", "7", 0.0),
        ("</s>7", "7", 0.0),
        ([{"role": "assistant", "content": "7"}], "7", 1.0),  # conversational
        ([{"role": "assistant", "content": " 8 "}], "7", 0.0),
        ([{"role": "assistant", "content": "7</s>"}], "7", 1.0),
    ],
)
def test_exact_match_reward(completion, answer, expected):
    assert exact_match_reward(["p"], [completion], answer=[answer]) == [expected]


def test_exact_match_reward_accepts_trainer_kwargs_and_checks_lengths():
    rewards = exact_match_reward(
        prompts=["a", "b"], completions=["1", "2"], answer=["1", "3"], task=["min", "min"], completion_ids=[[1], [2]]
    )
    assert rewards == [1.0, 0.0]
    with pytest.raises(ValueError, match="completions"):
        exact_match_reward(["a"], ["1", "2"], answer=["1"])


# ---------------------------------------------------------------------------------------------------------------
# Greedy accuracy
# ---------------------------------------------------------------------------------------------------------------


def test_greedy_accuracy_of_random_model_has_all_keys_and_restores_state(tokenizer, suite):
    model = build_tiny_model(tokenizer)
    for training in (True, False):
        model.train(training)
        metrics = greedy_accuracy(model, tokenizer, suite.eval.select(range(0, len(suite.eval), 3)), batch_size=16)
        assert set(metrics) == {"accuracy", f"accuracy_{SPLIT_SFT_TASKS}", f"accuracy_{SPLIT_RL_ONLY}"}
        assert all(0.0 <= value <= 1.0 for value in metrics.values())
        assert metrics["accuracy"] <= 0.1  # an untrained model cannot solve the suite
        assert model.training is training
        assert tokenizer.padding_side == "right"
    assert all(p.grad is None for p in model.parameters())


class _OracleModel(torch.nn.Module):
    """Stub `generate`: the right answer for prompts of even length, a wrong one otherwise; then eos, junk, pads."""

    def __init__(self, tokenizer, answers):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.tokenizer = tokenizer
        self.answers = answers
        self.seen_grad_enabled = []

    def generate(self, input_ids, attention_mask, max_new_tokens, **kwargs):
        self.seen_grad_enabled.append(torch.is_grad_enabled())
        assert not kwargs["do_sample"]
        assert attention_mask[:, -1].all(), "prompts must be left-padded for generation"
        tok = self.tokenizer
        rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            prompt = tok.decode([i for i, m in zip(ids, mask) if m])
            answer = self.answers[prompt]
            text = answer if len(prompt) % 2 == 0 else answer + "x"
            new = tok(text + EOS_TOKEN + "zz", add_special_tokens=False)["input_ids"]  # text after eos must not count
            new = (new + [tok.pad_token_id] * max_new_tokens)[:max_new_tokens]
            rows.append(ids + new)
        return torch.tensor(rows)


def test_greedy_accuracy_exact_values_with_stub_model(tokenizer, suite):
    answers = dict(zip(list(suite.eval["prompt"]), list(suite.eval["answer"])))
    model = _OracleModel(tokenizer, answers)
    metrics = greedy_accuracy(model, tokenizer, suite.eval, batch_size=7)
    correct = [len(p) % 2 == 0 for p in list(suite.eval["prompt"])]
    assert 0 < sum(correct) < len(correct)  # both outcomes occur, so the check is not vacuous
    assert metrics["accuracy"] == pytest.approx(sum(correct) / len(correct))
    for split in (SPLIT_SFT_TASKS, SPLIT_RL_ONLY):
        in_split = [c for c, s in zip(correct, list(suite.eval["split"])) if s == split]
        assert metrics[f"accuracy_{split}"] == pytest.approx(sum(in_split) / len(in_split))
    assert model.seen_grad_enabled and not any(model.seen_grad_enabled)
    assert tokenizer.padding_side == "right"


def test_greedy_accuracy_without_split_column_and_bad_input(tokenizer, suite):
    answers = dict(zip(list(suite.eval["prompt"]), list(suite.eval["answer"])))
    model = _OracleModel(tokenizer, answers)
    data = suite.eval.remove_columns(["split", "task"]).filter(lambda row: len(row["prompt"]) % 2 == 0)
    assert greedy_accuracy(model, tokenizer, data) == {"accuracy": 1.0}
    with pytest.raises(ValueError, match="answer"):
        greedy_accuracy(model, tokenizer, data.remove_columns(["answer"]))
