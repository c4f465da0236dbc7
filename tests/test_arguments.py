# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`TRAPOTrainer`'s constructor arguments (`trl_trapo/arguments.py`): one of the wrong type is one `TypeError` naming
the argument, the value and the fix, raised before anything loads — never an `AttributeError` from TRL, PEFT or
transformers about an attribute the user never named — and a reward or value model must have a one-output score head
(a `num_labels=2` critic used to train silently on its first label)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForSequenceClassification, TrainerCallback

from trl_trapo import PPOConfig, PPOTrainer, TRAPOTrainer
from trl_trapo.arguments import check_trainer_arguments
from trl_trapo.tasks import build_tiny_model, exact_match_reward


# Each case's `model` is a path that does not exist: the old code got past the bad argument to that path's check (or
# further), so each case also shows that the argument is checked before any model is looked for or loaded.
MISSING_MODEL = "/nonexistent/trapo-model"


def prompts() -> Dataset:
    return Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(8)], "answer": [str(2 * i) for i in range(8)]})


def build(tmp_path, tokenizer, tiny_config, **arguments) -> TRAPOTrainer:
    values = dict(
        model=MISSING_MODEL,
        reward_funcs=exact_match_reward,
        args=tiny_config(tmp_path, max_steps=1),
        train_dataset=prompts(),
        processing_class=tokenizer,
    )
    return TRAPOTrainer(**{**values, **arguments})


def sequence_classifier(tokenizer, num_labels: int):
    config = build_tiny_model(tokenizer).config
    config.num_labels = num_labels
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(config)


class Recorder(TrainerCallback):
    pass


class LengthReward:
    def __call__(self, completions, **kwargs):
        return [float(len(c)) for c in completions]


BAD_TYPES = [
    # (arguments, needles: the argument, the value given, what to pass)
    (
        dict(model=12345),
        ["`model`", "int (12345)", "AutoModelForCausalLM.from_pretrained", "id / local path (str or pathlib.Path)"],
    ),
    (  # a path where a loaded model is needed: load it (was "Pass it as a string", which is refused too)
        dict(value_model=Path("/tmp/my-critic")),
        [
            "`value_model`",
            "PosixPath",
            "Load it first: `AutoModelForSequenceClassification.from_pretrained('/tmp/my-critic', num_labels=1)`",
        ],
    ),
    (dict(reward_funcs=42), ["`reward_funcs`", "int (42)", "reward function", "num_labels=1"]),
    (dict(reward_funcs=[exact_match_reward, 42]), ["`reward_funcs[1]`", "int (42)"]),
    (  # trial 14's C13: a class is callable; its constructor failed on `prompts=` in the construction-time check
        dict(reward_funcs=[exact_match_reward, LengthReward]),
        [
            "`reward_funcs[1]` is the class",
            "LengthReward, not a reward function",
            "Pass an instance",
            "LengthReward(...)",
        ],
    ),
    (dict(reward_model=42), ["`reward_model`", "int (42)"]),
    (dict(peft_config={"r": 8}), ["`peft_config`", "dict ({'r': 8})", "peft.LoraConfig(**{'r': 8})"]),
    (dict(peft_config="lora"), ["`peft_config`", "str ('lora')", "peft.LoraConfig(r=16"]),
    (dict(ref_model=42), ["`ref_model`", "int (42)"]),
    (dict(value_model=42), ["`value_model`", "int (42)", "num_labels=1"]),
    (dict(teacher_model=42), ["`teacher_model`", "int (42)"]),
    (dict(processing_class="gpt2"), ["`processing_class`", "str ('gpt2')", "AutoTokenizer.from_pretrained"]),
    (dict(reward_processing_classes=[None, 3]), ["`reward_processing_classes[1]`", "int (3)"]),
    (dict(callbacks=Recorder()), ["`callbacks`", "Recorder", "Wrap it in a list"]),
    (dict(callbacks=[Recorder, 42]), ["`callbacks[1]`", "int (42)", "TrainerCallback"]),
    (dict(optimizers=42), ["`optimizers`", "int (42)", "(optimizer, lr_scheduler)"]),
    (dict(optimizers=("adamw", None)), ["`optimizers[0]`", "str ('adamw')", "torch.optim.Optimizer"]),
    (dict(tools=exact_match_reward), ["`tools`", "function", "Wrap it in a list: `tools=[...]`"]),
]


@pytest.mark.parametrize(
    ("arguments", "needles"), BAD_TYPES, ids=[f"{next(iter(a))}-{i}" for i, (a, _) in enumerate(BAD_TYPES)]
)
def test_an_argument_of_the_wrong_type_is_one_message_before_anything_loads(
    tmp_path, tokenizer, tiny_config, arguments, needles
):
    with pytest.raises(TypeError) as raised:
        build(tmp_path, tokenizer, tiny_config, **arguments)
    message = str(raised.value)
    for needle in needles:
        assert needle in message, (needle, message)
    assert raised.value.__cause__ is None  # raised by the check, not re-raised from a library's error


def test_every_bad_entry_of_a_list_argument_is_named_in_one_message(tmp_path, tokenizer, tiny_config):
    """Trial 12's N49 sibling: `reward_funcs=[42, f, "exact_match", 3.5]` was refused at `reward_funcs[0]`, then at
    `[2]` once that was fixed, then at `[3]`. Now one message names each bad entry with its own fix (a good one is
    not named); the same for `callbacks` and `reward_processing_classes`."""
    with pytest.raises(TypeError) as raised:
        build(tmp_path, tokenizer, tiny_config, reward_funcs=[42, exact_match_reward, "exact_match", 3.5])
    head, *items = str(raised.value).split("\n- ")
    assert head == "`reward_funcs` has 3 entries that cannot be used, each with its fix:", head
    assert [item.split(" ")[0] for item in items] == [
        "`reward_funcs[0]`",
        "reward_funcs[2]='exact_match'",
        "`reward_funcs[3]`",
    ]
    assert "int (42)" in items[0] and "`from trl_trapo.rewards import exact_match_reward`" in items[1]
    assert "float (3.5)" in items[2]
    with pytest.raises(TypeError) as raised:
        build(tmp_path, tokenizer, tiny_config, callbacks=[42, Recorder, "x"])
    head, *items = str(raised.value).split("\n- ")
    assert head.startswith("`callbacks` has 2 entries") and [i.split(" ")[0] for i in items] == [
        "`callbacks[0]`",
        "`callbacks[2]`",
    ], str(raised.value)
    with pytest.raises(TypeError) as raised:
        build(
            tmp_path,
            tokenizer,
            tiny_config,
            reward_funcs=[exact_match_reward] * 3,
            reward_processing_classes=[1, None, 2],
        )
    assert "`reward_processing_classes[0]`" in str(raised.value) and "`reward_processing_classes[2]`" in str(
        raised.value
    )


def test_a_dotted_import_path_in_python_says_to_pass_the_object(tmp_path, tokenizer, tiny_config):
    """Trial 14's N23: `reward_funcs="trl.rewards.accuracy_reward"` (the command line's form) was read as a Hub id and
    told to download that model. TRL's GRPOTrainer reads every string as a reward model too, so it stays refused,
    saying to import the function (a class: an instance of it); a string that imports as nothing is left to the Hub
    id / local path checks."""
    message = api_value_error(
        lambda: build(tmp_path, tokenizer, tiny_config, reward_funcs="trl.rewards.accuracy_reward")
    )
    assert message.startswith("reward_funcs='trl.rewards.accuracy_reward' is the dotted import path of a function")
    assert "`from trl.rewards import accuracy_reward`, then `reward_funcs=[accuracy_reward]`" in message
    assert "HF_HUB_OFFLINE" not in message and "Hub id or local path, as in TRL's GRPOTrainer" in message
    message = api_value_error(
        lambda: build(tmp_path, tokenizer, tiny_config, reward_funcs=[exact_match_reward, f"{__name__}.LengthReward"])
    )
    assert f"reward_funcs[1]='{__name__}.LengthReward' is the dotted import path of a class" in message
    assert f"`from {__name__} import LengthReward`, then `reward_funcs=[LengthReward(...)]`" in message
    message = api_value_error(lambda: build(tmp_path, tokenizer, tiny_config, reward_funcs="no_such_module_x.f"))
    assert "dotted import path" not in message


def api_value_error(call) -> str:
    with pytest.raises(ValueError) as raised:
        call()
    return str(raised.value)


@pytest.mark.parametrize(
    ("argument", "kind"),
    [
        ("model", "torch-module"),
        ("model", "headless-transformers-model"),
        ("ref_model", "torch-module"),  # torch's TypeError about `input_ids` at the first step
        ("teacher_model", "torch-module"),  # torch's AttributeError about `get_output_embeddings`
    ],
)
def test_a_module_without_a_language_model_head_is_refused_naming_what_it_must_be(
    tmp_path, tokenizer, tiny_config, argument, kind
):
    """A plain `nn.Module` (or a transformers body without its language-model head) as `model` used to reach
    `prepare_run_data` and fail with torch's "'Sequential' object has no attribute 'get_input_embeddings'" (trial 8's
    MD01); as `ref_model` or `teacher_model`, torch's errors too."""
    from transformers import AutoModel

    if kind == "torch-module":
        module = torch.nn.Sequential(torch.nn.Embedding(101, 16), torch.nn.Linear(16, 101))
    else:
        module = AutoModel.from_config(build_tiny_model(tokenizer).config)  # LlamaModel: no lm_head
    with pytest.raises(TypeError) as raised:
        build(tmp_path, tokenizer, tiny_config, **{argument: module}, train_dataset=prompts())
    message = str(raised.value)
    for needle in [
        f"`{argument}` must be a transformers language model",
        type(module).__name__,
        "AutoModelForCausalLM",
    ]:
        assert needle in message, (needle, message)
    assert raised.value.__cause__ is None


def test_a_peft_wrapped_policy_passes_the_policy_check(tokenizer):
    from peft import LoraConfig, get_peft_model

    check_trainer_arguments(
        model=get_peft_model(build_tiny_model(tokenizer), LoraConfig(r=2, target_modules=["q_proj"]))
    )


def test_the_ppo_trainer_checks_its_arguments_as_well(tmp_path, tokenizer):
    dataset = Dataset.from_dict({"input_ids": [[5, 6, 7]] * 4})
    args = PPOConfig(output_dir=str(tmp_path), report_to="none", total_episodes=4, per_device_train_batch_size=4)
    with pytest.raises(TypeError, match=re.escape("`peft_config` must be a `peft.PeftConfig`")):
        PPOTrainer(args, tokenizer, MISSING_MODEL, None, exact_match_reward, dataset, peft_config={"r": 8})


def test_what_trl_accepts_passes_the_check(tokenizer):
    """The types TRL and transformers take, and tuples where a list is taken, are all accepted."""
    from peft import LoraConfig

    model = build_tiny_model(tokenizer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    check_trainer_arguments(
        model=model,
        reward_funcs=("some/reward-model", exact_match_reward, sequence_classifier(tokenizer, 1)),
        processing_class=tokenizer,
        reward_processing_classes=[None, None, tokenizer],
        ref_model=None,
        reward_model="a/reward-model",
        value_model=sequence_classifier(tokenizer, 1),
        teacher_model="a/teacher",
        peft_config=LoraConfig(r=4),
        callbacks=(Recorder, Recorder()),
        optimizers=(optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)),
        tools=[exact_match_reward],
    )
    check_trainer_arguments(model="a/model", optimizers=(None, None), callbacks=[])


def test_a_tuple_of_reward_functions_trains_like_a_list(tmp_path, tokenizer, tiny_config):
    def length_reward(completions, **kwargs):
        return [float(len(c)) for c in completions]

    trainer = build(
        tmp_path,
        tokenizer,
        tiny_config,
        model=build_tiny_model(tokenizer),
        reward_funcs=(exact_match_reward, length_reward),
    )
    assert trainer.reward_funcs == [exact_match_reward, length_reward]


# ---- reward and value models: one score per position ----
@pytest.mark.parametrize("role", ["value_model", "reward_model", "reward_funcs"])
def test_a_model_with_two_labels_is_refused_not_read_at_its_first_label(tmp_path, tokenizer, tiny_config, role):
    two_labels = sequence_classifier(tokenizer, 2)
    arguments = {role: [exact_match_reward, two_labels] if role == "reward_funcs" else two_labels}
    name = "reward_funcs[1]" if role == "reward_funcs" else role
    with pytest.raises(ValueError) as raised:  # the old code built the trainer and trained on label 0
        build(tmp_path, tokenizer, tiny_config, model=build_tiny_model(tokenizer), **arguments)
    message = str(raised.value)
    assert f"The {name} (LlamaForSequenceClassification) has a head of 2 outputs (num_labels=2)" in message
    assert "from_pretrained(..., num_labels=1)" in message


def test_a_causal_lm_as_reward_model_is_refused_at_construction(tmp_path, tokenizer, tiny_config):
    """It used to pass construction and fail in the first step's scoring."""
    with pytest.raises(ValueError, match=r"LlamaForCausalLM has no `score`/`classifier` head.* as reward_model\."):
        build(
            tmp_path,
            tokenizer,
            tiny_config,
            model=build_tiny_model(tokenizer),
            reward_model=build_tiny_model(tokenizer),
        )


def test_one_label_models_are_accepted(tmp_path, tokenizer, tiny_config):
    trainer = build(
        tmp_path,
        tokenizer,
        tiny_config,
        model=build_tiny_model(tokenizer),
        reward_funcs=[exact_match_reward, sequence_classifier(tokenizer, 1)],
        value_model=sequence_classifier(tokenizer, 1),
    )
    assert len(trainer.reward_funcs) == 2 and trainer.model.value_model is not None


@pytest.mark.parametrize("kind", ["PromptTuningConfig", "PrefixTuningConfig"])
def test_a_prompt_learning_peft_config_is_refused_at_construction(tmp_path, tokenizer, tiny_config, kind):
    """Its virtual tokens lengthen the logits: the old code built the trainer, then raised IndexError at step one."""
    import peft

    config = getattr(peft, kind)(task_type="CAUSAL_LM", num_virtual_tokens=4)
    with pytest.raises(ValueError) as raised:
        build(tmp_path, tokenizer, tiny_config, model=build_tiny_model(tokenizer), peft_config=config)
    message = str(raised.value)
    for needle in ["`peft_config`", kind, "prompt-learning", "peft.LoraConfig"]:
        assert needle in message, (needle, message)


def test_lora_target_modules_that_match_nothing_name_the_field_and_the_choices(tmp_path, tokenizer, tiny_config):
    """The old code let PEFT's `NoMatchingPeftModuleError` through, naming neither the field nor the module names."""
    from peft import LoraConfig

    model = build_tiny_model(tokenizer)
    config = LoraConfig(r=4, target_modules=["nonexistent_proj"])
    with pytest.raises(ValueError) as raised:
        build(tmp_path, tokenizer, tiny_config, model=model, peft_config=config)
    message = str(raised.value)
    linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    for needle in ["peft_config.target_modules=", "nonexistent_proj", linear[0], "'all-linear'"]:
        assert needle in message, (needle, message)


def test_trls_grpo_config_as_args_points_to_trapos_class_of_the_same_name(tmp_path, tokenizer, tiny_config):
    """The old message said only "`args` must be a TRAPOConfig, got GRPOConfig."; a TRL script needs the import."""
    import trl

    trl_args = trl.GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False)
    with pytest.raises(TypeError) as raised:
        build(tmp_path, tokenizer, tiny_config, args=trl_args)
    message = str(raised.value)
    for needle in ["`args` must be a TRAPOConfig, got GRPOConfig", "from trl_trapo import GRPOConfig"]:
        assert needle in message, (needle, message)
    dataset = Dataset.from_dict({"input_ids": [[5, 6, 7]] * 4})
    with pytest.raises(
        TypeError, match="`args` must be a PPOConfig, got GRPOConfig.*from trl_trapo import GRPOConfig"
    ):
        PPOTrainer(trl_args, tokenizer, MISSING_MODEL, None, exact_match_reward, dataset)


def test_trls_ppo_config_as_args_points_to_trapos_ppo_config():
    """TRL 1.16 has no PPOConfig left; a class of that name from a `trl` module stands in for an older TRL's."""
    from trl_trapo.arguments import check_config_type
    from trl_trapo.config import TRAPOConfig

    legacy = type("PPOConfig", (), {"__module__": "trl.trainer.ppo_config"})()
    with pytest.raises(TypeError, match=re.escape("from trl_trapo import PPOConfig")):
        check_config_type(legacy, TRAPOConfig, "PPOConfig")
    with pytest.raises(TypeError, match=re.escape("Build one: `TRAPOConfig(output_dir=..., ...)`")):
        check_config_type({"output_dir": "x"}, TRAPOConfig)


# ---- models that cannot train: no weights, encoder-decoder, all frozen (trial 9's MO02, MO04, MO01) ----
@pytest.mark.parametrize(
    "role", ["model", "ref_model", "teacher_model", "value_model", "reward_model", "reward_funcs"]
)
def test_a_model_on_the_meta_device_is_refused_naming_it(tmp_path, tokenizer, tiny_config, role):
    # MO02: torch's "Cannot copy out of meta tensor; no data!" when the Trainer moved `model` to its device
    with torch.device("meta"):
        empty = sequence_classifier(tokenizer, 1) if role in ("value_model", "reward_model", "reward_funcs") else None
        empty = empty if empty is not None else build_tiny_model(tokenizer)
    arguments = {role: [exact_match_reward, empty] if role == "reward_funcs" else empty}
    if role != "model":
        arguments["model"] = build_tiny_model(tokenizer)
    name = "reward_funcs[1]" if role == "reward_funcs" else role
    with pytest.raises(ValueError) as raised:
        build(tmp_path, tokenizer, tiny_config, **arguments)
    message = str(raised.value)
    assert message.startswith(f"`{name}` (") and "has tensors on the meta device, e.g. 'model." in message, message
    assert "to_empty(device='cpu')" in message and "from_pretrained" in message


def tiny_t5(tokenizer):
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=len(tokenizer), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
    return T5ForConditionalGeneration(config)


@pytest.mark.parametrize("role", ["model", "ref_model", "teacher_model"])
def test_an_encoder_decoder_model_is_refused_at_construction(tmp_path, tokenizer, tiny_config, role):
    # MO04: accepted, then T5's "You must specify exactly one of input_ids or inputs_embeds" at train()
    arguments = {role: tiny_t5(tokenizer)}
    if role != "model":
        arguments["model"] = build_tiny_model(tokenizer)
    with pytest.raises(ValueError) as raised:
        build(tmp_path, tokenizer, tiny_config, **arguments)
    message = str(raised.value)
    assert message.startswith(f"`{role}` is an encoder-decoder model (T5ForConditionalGeneration, "), message
    assert "decoder-only" in message and "AutoModelForCausalLM" in message


@pytest.mark.parametrize("role", ["model", "ref_model", "teacher_model"])
def test_a_compiled_model_is_named_as_a_torch_compile_wrapper(tmp_path, tokenizer, tiny_config, role):
    """Trial 15's N28: `torch.compile(model)` was "not a transformers model", with a fix (load it with its LM head,
    or write a `PreTrainedModel` subclass) that did not apply: it is one, wrapped."""
    arguments = {role: torch.compile(build_tiny_model(tokenizer))}
    if role != "model":
        arguments["model"] = build_tiny_model(tokenizer)
    with pytest.raises(TypeError) as raised:
        build(tmp_path, tokenizer, tiny_config, **arguments)
    message = str(raised.value)
    assert message.startswith(f"`{role}` is a `torch.compile` wrapper (OptimizedModule) of a LlamaForCausalLM"), (
        message
    )
    assert f"pass the model itself (`{role}._orig_mod`" in message and "not a transformers model" not in message
    assert ("set `torch_compile=True`" in message) == (role == "model"), message


def test_a_vision_language_model_passes_the_model_checks():
    from trl_trapo.tasks.vision import build_tiny_vlm, build_vlm_processor

    check_trainer_arguments(model=build_tiny_vlm(build_vlm_processor()))


def test_a_policy_without_a_trainable_parameter_is_refused_unless_an_adapter_is_added(
    tmp_path, tokenizer, tiny_config
):
    # MO01: trained "2 steps", the losses logged, grad_norm 0 and the policy never moved
    from peft import LoraConfig, PeftModel, get_peft_model

    frozen = build_tiny_model(tokenizer).requires_grad_(False)
    with pytest.raises(ValueError) as raised:
        build(tmp_path, tokenizer, tiny_config, model=frozen)
    message = str(raised.value)
    assert message.startswith("`model` (LlamaForCausalLM) has no trainable parameters"), message
    assert "requires_grad_(True)" in message and "peft_config" in message
    check_trainer_arguments(model=frozen, peft_config=LoraConfig(r=2, target_modules=["q_proj"]))  # trains LoRA
    partly = build_tiny_model(tokenizer)
    partly.get_input_embeddings().requires_grad_(False)
    check_trainer_arguments(model=partly)
    # a saved adapter loaded for inference (`is_trainable=False`, PEFT's default) is frozen too
    adapter = get_peft_model(build_tiny_model(tokenizer), LoraConfig(r=2, target_modules=["q_proj"]))
    adapter.save_pretrained(tmp_path / "adapter")
    loaded = PeftModel.from_pretrained(build_tiny_model(tokenizer), tmp_path / "adapter")
    with pytest.raises(ValueError, match=r"`model` \(PeftModel\) has no trainable .*is_trainable=True"):
        check_trainer_arguments(model=loaded)
    # the critic: `peft_config` wraps the policy only, so a frozen value model never learns whatever is passed
    critic = sequence_classifier(tokenizer, 1).requires_grad_(False)
    with pytest.raises(ValueError, match=r"`value_model` \(LlamaForSequenceClassification\) has no trainable"):
        check_trainer_arguments(model=partly, value_model=critic, peft_config=LoraConfig(r=2))


def test_a_peft_config_in_inference_mode_is_refused_before_the_model_loads(tmp_path, tokenizer, tiny_config):
    # trial 15's N27: `LoraConfig(inference_mode=True)` (copied from an inference snippet) was accepted and trained two
    # steps with 0 trainable parameters, the losses logged as usual; the model here is a path that does not exist
    from peft import LoraConfig

    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], inference_mode=True)
    with pytest.raises(ValueError) as raised:
        build(tmp_path, tokenizer, tiny_config, peft_config=config)
    message = str(raised.value)
    for needle in ["peft_config.inference_mode=True", "frozen", "inference_mode=False (the default"]:
        assert needle in message, (needle, message)
    check_trainer_arguments(model=build_tiny_model(tokenizer), peft_config=LoraConfig(r=4, target_modules=["q_proj"]))


def test_the_policy_is_checked_for_a_trainable_parameter_once_its_adapter_is_added(tmp_path, tokenizer, tiny_config):
    """The trainable-parameter check ran on the arguments only, where an adapter still to be added counts as
    trainable: the policy as it will train (after `peft_config`'s adapter wraps it) is checked too, so any route to a
    frozen adapter is refused, not only the `inference_mode=True` the argument check names."""
    from peft import LoraConfig

    from trl_trapo.assembly import policy_and_reference

    frozen = LoraConfig(r=4, target_modules=["q_proj"], inference_mode=True)  # past the argument check
    with pytest.raises(ValueError) as raised:
        policy_and_reference(build_tiny_model(tokenizer), None, None, tiny_config(tmp_path), frozen)
    message = str(raised.value)
    assert message.startswith("`model` (PeftModel, the policy with the LoraConfig adapter of `peft_config` added"), (
        message
    )
    for needle in ["has no trainable parameters", "inference_mode=False", "print_trainable_parameters()"]:
        assert needle in message, (needle, message)
    trainable = LoraConfig(r=4, target_modules=["q_proj"])
    policy, _, _ = policy_and_reference(build_tiny_model(tokenizer), None, None, tiny_config(tmp_path), trainable)
    assert any(p.requires_grad for p in policy.parameters())


def test_an_encoder_decoder_checkpoint_given_by_path_is_refused_before_it_loads(tmp_path, tokenizer, tiny_config):
    # MO04's sibling: `AutoModelForCausalLM` raised transformers' "Unrecognized configuration class", listing every
    # config it knows
    tiny_t5(tokenizer).save_pretrained(tmp_path / "t5")
    with pytest.raises(ValueError, match=r"model='.*t5' is an encoder-decoder model \(T5Config, .*decoder-only"):
        build(tmp_path / "run", tokenizer, tiny_config, model=str(tmp_path / "t5"))


# ---- trial 13's N31: a `pathlib.Path` wherever a model's path is taken ----
@pytest.mark.parametrize("role", ["model", "teacher_model", "reward_model", "reward_funcs"])
def test_a_path_object_is_read_as_its_text_where_a_model_path_is_taken(tmp_path, tokenizer, tiny_config, role):
    """`model=Path(folder)` was refused ("Pass it as a string") though `from_pretrained` takes a Path: now each
    argument that takes a model's path takes an `os.PathLike` as its `os.fspath`, so a missing folder gets the same
    message as the same path as a string."""
    missing = tmp_path / "no-such-model"
    arguments = {role: [exact_match_reward, missing] if role == "reward_funcs" else missing}
    if role != "model":
        arguments["model"] = build_tiny_model(tokenizer)
    with pytest.raises(ValueError, match=rf"='{re.escape(str(missing))}': no such directory"):
        build(tmp_path / "run", tokenizer, tiny_config, **arguments)


def test_a_policy_folder_given_as_a_path_object_loads_and_trains_to_a_clear_resume_error(
    tmp_path, tokenizer, tiny_config
):
    """Trial 13's N31: `model=Path(folder)` builds the trainer as `model=str(folder)` does, and
    `train(resume_from_checkpoint=Path(missing))` says the folder is missing, without advice about a `~` the path
    does not hold (the `~` test compared the Path with a str)."""
    from trl_trapo.checkpoint import CheckpointError

    folder = tmp_path / "policy"
    build_tiny_model(tokenizer).save_pretrained(folder)
    trainer = build(tmp_path / "run", tokenizer, tiny_config, model=folder)
    assert trainer.model.config.name_or_path == str(folder)
    missing = tmp_path / "run" / "checkpoint-7"
    with pytest.raises(CheckpointError) as raised:
        trainer.train(resume_from_checkpoint=missing)
    assert f"resume_from_checkpoint={str(missing)!r} is not a directory" in str(raised.value)
    assert "~" not in str(raised.value)


# ---- trial 13's N30: positional arguments in TRL's GRPOTrainer / SFTTrainer order ----
def test_trl_positional_orders_are_the_installed_trls():
    """`TRL_POSITIONAL_ORDERS` is written out (importing TRL's trainers takes seconds): it must match TRL's."""
    from trl import GRPOTrainer, SFTTrainer

    from trl_trapo.arguments import TRL_POSITIONAL_ORDERS

    for trainer in (GRPOTrainer, SFTTrainer):
        parameters = list(inspect.signature(trainer.__init__).parameters)[1:]
        assert TRL_POSITIONAL_ORDERS[trainer.__name__] == tuple(parameters)


def test_a_tokenizer_passed_in_trl_grpo_positional_order_names_processing_class(tmp_path, tokenizer, tiny_config):
    """`GRPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, processing_class)` with TRAPOTrainer as
    GRPOTrainer put the tokenizer in `pretrain_dataset` and was told to build a dataset from it (trial 13's N30)."""
    args = tiny_config(tmp_path, max_steps=1)
    with pytest.raises(TypeError) as raised:
        TRAPOTrainer(MISSING_MODEL, exact_match_reward, args, prompts(), None, tokenizer)
    message = str(raised.value)
    for needle in (
        "TRAPOTrainer's 6th positional argument is `pretrain_dataset`",
        "TRL's GRPOTrainer and SFTTrainer take `processing_class`",
        "a tokenizer or processor",
        "pass processing_class=... by keyword",
        "pass the arguments after eval_dataset by keyword",
    ):
        assert needle in message, (needle, message)
    assert "Dataset.from_list" not in message


def _trl_values(tokenizer) -> dict:
    """A value of each TRL GRPOTrainer / SFTTrainer parameter's kind, by name."""
    from peft import LoraConfig
    from transformers import BitsAndBytesConfig, TrainingArguments

    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    return dict(
        args=TrainingArguments(output_dir="unused", report_to="none"),
        data_collator=lambda rows: rows,
        processing_class=tokenizer,
        reward_processing_classes=[tokenizer],
        compute_loss_func=lambda outputs, labels, num_items_in_batch=None: 0.0,
        compute_metrics=lambda prediction: {},
        callbacks=[Recorder()],
        optimizers=(optimizer, None),
        optimizer_cls_and_kwargs=(torch.optim.SGD, {"lr": 0.1}),
        preprocess_logits_for_metrics=lambda logits, labels: logits,
        quantization_config=BitsAndBytesConfig(load_in_4bit=True),
        peft_config=LoraConfig(r=4),
        tools=[exact_match_reward],
        rollout_func=lambda prompts, trainer: {},
        environment_factory=type("Environment", (), {}),  # a class, as TRL's environments are
        formatting_func=lambda row: row["text"],
    )


def _differing_slots() -> list[tuple[str, int, str, str]]:
    """(TRL trainer, position, its parameter there, TRAPOTrainer's) wherever the two differ."""
    from trl_trapo.arguments import TRL_POSITIONAL_ORDERS

    trapo = list(inspect.signature(TRAPOTrainer.__init__).parameters)[1:]
    return [
        (trainer, index, name, trapo[index])
        for trainer, order in TRL_POSITIONAL_ORDERS.items()
        for index, name in enumerate(order)
        if name != trapo[index]
    ]


@pytest.mark.parametrize(("trainer", "index", "trl_name", "trapo_name"), _differing_slots())
def test_every_trl_positional_slot_that_differs_names_itself(tokenizer, trainer, index, trl_name, trapo_name):
    """Each position where TRL 1.16's GRPOTrainer or SFTTrainer takes another parameter than TRAPOTrainer: a value
    of TRL's kind there is refused naming the position, TRAPO's parameter, TRL's and the fix, before anything loads."""
    positional = [MISSING_MODEL] + [None] * (index - 1) + [_trl_values(tokenizer)[trl_name]]
    with pytest.raises(TypeError) as raised:
        TRAPOTrainer(*positional)
    message = str(raised.value)
    ordinal = {1: "2nd", 2: "3rd"}.get(index, f"{index + 1}th")
    takes = inspect.signature(TRAPOTrainer.__init__).parameters
    fix = f"pass {trl_name}=... by keyword" if trl_name in takes else f"TRAPOTrainer takes no `{trl_name}`: "
    for needle in (f"{ordinal} positional argument is `{trapo_name}`", trainer, f"`{trl_name}`", fix):
        assert needle in message, (needle, message)


def test_trapos_own_positional_order_still_passes_the_order_check(tokenizer):
    """Existing positional calls keep working: a value of the kind each TRAPOTrainer parameter takes, in its own
    order, is not refused; nor is PPOTrainer's (TRL 1.12 PPOTrainer's order, which it checks itself)."""
    from peft import LoraConfig
    from transformers import TrainingArguments

    from trl_trapo.arguments import refuse_trl_positional_order

    model = build_tiny_model(tokenizer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data, config = prompts(), TrainingArguments(output_dir="unused", report_to="none")
    own_order = (
        model, [exact_match_reward, "a/reward-model"], config, data, {"held-out": data}, data, data, tokenizer,
        [None, tokenizer], model, "a/reward-model", sequence_classifier(tokenizer, 1), [Recorder], (optimizer, None),
        LoraConfig(r=4),
    )  # fmt: skip
    refuse_trl_positional_order(TRAPOTrainer, own_order)
    refuse_trl_positional_order(TRAPOTrainer, (model, exact_match_reward, None, [{"prompt": "1+1="}], None, None))
    refuse_trl_positional_order(PPOTrainer, (config, tokenizer, model, None, model, data))


def test_a_torch_scorer_module_as_a_reward_is_told_to_wrap_it_in_a_reward_function(tmp_path, tokenizer, tiny_config):
    """Trial 14's N40: a custom `nn.Module` whose forward scores completions, passed in reward_funcs, was told to pass
    an `AutoModelForSequenceClassification`, which does not fit a scorer; the first fix now is a reward function
    around it (and that fix, run, trains)."""

    class LengthScorer(torch.nn.Module):
        def forward(self, completions, **kwargs):
            return torch.tensor([len(c) / 10 for c in completions])

    scorer = LengthScorer()
    with pytest.raises(ValueError) as raised:
        build(tmp_path, tokenizer, tiny_config, model=build_tiny_model(tokenizer), reward_funcs=scorer)
    message = str(raised.value)
    assert "reward_funcs is a torch module (LengthScorer)" in message, message
    fix = message.split("Fix: ", 1)[1]
    assert fix.startswith("to score completions with your own module, wrap it in a reward function")
    assert "`def my_reward(completions, **kwargs): return scorer(completions).tolist()`" in fix

    def my_reward(completions, **kwargs):
        return scorer(completions).tolist()

    trainer = build(tmp_path, tokenizer, tiny_config, model=build_tiny_model(tokenizer), reward_funcs=my_reward)
    assert trainer.train().global_step >= 1


# ---- one model in two roles where a term would vanish (trial 15's N14) ----
def policy_and_same_reference(tokenizer, kind: str):
    """`(model, ref_model)` where the reference is (or holds) the policy's trainable weights."""
    from peft import LoraConfig, get_peft_model

    model = build_tiny_model(tokenizer, seed=0)
    if kind == "same object":
        return model, model
    if kind == "peft base model":  # the base model of a PeftModel carries the adapter's layers
        peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
        return peft_model, peft_model.get_base_model()
    reference = build_tiny_model(tokenizer, seed=1)  # "shared layers": a separate head on the policy's body
    reference.model = model.model
    return model, reference


@pytest.mark.parametrize("kind", ["same object", "peft base model", "shared layers"])
def test_a_reference_that_is_the_policy_is_refused(tmp_path, tokenizer, tiny_config, kind):
    """The old code accepted `ref_model=model`: the reference moved with the policy, so `objective/kl` stayed ~1e-13
    while the policy moved (kl_coef=0.1 did nothing). TRL's PPOTrainer and DPOTrainer refuse the same object."""
    model, reference = policy_and_same_reference(tokenizer, kind)
    with pytest.raises(ValueError) as raised:
        build(
            tmp_path, tokenizer, tiny_config, model=model, ref_model=reference, args=tiny_config(tmp_path, kl_coef=0.1)
        )
    message = str(raised.value)
    what = {
        "same object": "is the same object as `model`",
        "peft base model": "is the base model of the PeftModel `model`",
        "shared layers": f"shares {len(list(reference.model.parameters()))} trainable parameter tensor(s) with `model`",
    }[kind]
    for needle in (f"`ref_model` {what}", "the KL penalty towards it would always be 0", "Fix: ref_model=None",
                   "`ref_model=copy.deepcopy(model)`"):  # fmt: skip
        assert needle in message, (needle, message)


def test_a_separate_copy_of_the_policy_is_a_reference(tokenizer):
    import copy

    model = build_tiny_model(tokenizer, seed=0)
    check_trainer_arguments(model=model, ref_model=copy.deepcopy(model))


def test_the_ppo_trainer_refuses_the_policy_as_its_reference(tmp_path, tokenizer):
    dataset = Dataset.from_dict({"input_ids": [[5, 6, 7]] * 4})
    args = PPOConfig(output_dir=str(tmp_path), report_to="none", total_episodes=4, per_device_train_batch_size=4)
    model = build_tiny_model(tokenizer, seed=0)
    with pytest.raises(ValueError, match=re.escape("`ref_model` is the same object as `model`")):
        PPOTrainer(args, tokenizer, model, model, sequence_classifier(tokenizer, 1), dataset)


@pytest.mark.parametrize("role", ["reward_model", "reward_funcs"])
def test_a_critic_that_is_a_reward_model_is_refused(tmp_path, tokenizer, tiny_config, role):
    """Reward models are frozen: the same object as `value_model` left the critic with no trainable weight, its
    value loss logged while it never moved (the old code built the trainer without a word)."""
    critic = sequence_classifier(tokenizer, 1)
    arguments = {role: [exact_match_reward, critic] if role == "reward_funcs" else critic}
    name = "reward_funcs[1]" if role == "reward_funcs" else role
    with pytest.raises(ValueError) as raised:
        build(tmp_path, tokenizer, tiny_config, model=build_tiny_model(tokenizer), value_model=critic, **arguments)
    message = str(raised.value)
    assert f"`value_model` is the same object as `{name}`: reward models are frozen" in message, message
    assert "value_model=copy.deepcopy(reward_model)" in message


def test_a_reference_given_with_kl_coef_zero_is_said_unused_and_not_kept(tmp_path, tokenizer, tiny_config, caplog):
    """kl_coef=0 turns the KL term off: the reference the user gave is never run. The old code said nothing and
    kept it (prepared on the device); as TRL's GRPOTrainer with beta=0, the trainer keeps none."""
    import logging

    with caplog.at_level(logging.INFO, logger="trl_trapo"):
        trainer = build(
            tmp_path, tokenizer, tiny_config, model=build_tiny_model(tokenizer), ref_model=build_tiny_model(tokenizer),
            args=tiny_config(tmp_path, max_steps=1, kl_coef=0.0),
        )  # fmt: skip
    said = [r.getMessage() for r in caplog.records if "`ref_model` is given, but kl_coef=0" in r.getMessage()]
    assert len(said) == 1 and "the reference is not used" in said[0], said
    assert trainer.ref_model is None and trainer.reference is None
