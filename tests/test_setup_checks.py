# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""`TRAPOTrainer(...)` refuses, before any model loads, what `train()` (or a library deep inside construction) would
otherwise fail on with a traceback naming no argument: the optimizer, the scheduler and the trackers `train()` builds
(`trl_trapo.setup_checks`), a missing `model`, a classification model or adapter as the policy, the command line's
name of a built-in reward, an `async def rollout_func`, early stopping without a metric, a chat template that does
not compile, and `from_pretrained` arguments that cannot work (an unknown keyword, model type, attention kernel or
quantization package). Each message names the argument, the value and the fix (the trial-3 cases X03, X06b-X08, T04,
T15-T17, T26, RF02, M04-M07, P02, P07)."""

from __future__ import annotations

import importlib.util
import json
import logging

import pytest
import torch
from peft import LoraConfig
from transformers import EarlyStoppingCallback, LlamaConfig, LlamaForSequenceClassification
from transformers.integrations import integration_utils

import trl_trapo.assembly
from trl_trapo import TRAPOConfig, TRAPOTrainer
from trl_trapo.tasks import build_tiny_model, exact_match_reward


def build(tmp_path, tokenizer, suite, tiny_config, model=None, out="out", **overrides):
    """A trainer on the tiny suite's RL prompts writing to `tmp_path / out`; `overrides` split into constructor
    arguments and config fields."""
    arguments = {k: overrides.pop(k) for k in list(overrides) if k in ("callbacks", "optimizers", "peft_config")}
    arguments.update(
        {
            k: overrides.pop(k)
            for k in list(overrides)
            if k in ("reward_funcs", "reward_model", "rollout_func", "eval_dataset", "processing_class")
        }
    )
    arguments.setdefault("reward_funcs", exact_match_reward)
    arguments.setdefault("processing_class", tokenizer)
    return TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0) if model is None else model,
        args=tiny_config(tmp_path / out, **overrides),
        train_dataset=suite.rl_train,
        **arguments,
    )


@pytest.fixture
def no_model_loading(monkeypatch):
    """Fail the test if the trainer gets as far as loading the policy (the checks must come first)."""

    def loaded(*args, **kwargs):
        raise AssertionError("the policy was loaded before the setting was checked")

    monkeypatch.setattr(trl_trapo.assembly, "load_policy", loaded)  # where `build_policy` looks it up


@pytest.fixture
def saved_model(tmp_path, tokenizer):
    """The tiny model saved with `save_pretrained` (a local model id)."""
    folder = tmp_path / "tiny"
    build_tiny_model(tokenizer, seed=0).save_pretrained(folder)
    return folder


# ---- the optimizer, the scheduler and the trackers `train()` builds ------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (  # X06b: transformers' ValueError after the initial evaluation
            {"lr_scheduler_type": "cosine_with_min_lr"},
            r"lr_scheduler_type='cosine_with_min_lr' with lr_scheduler_kwargs=None cannot be built: .*"
            r"it needs a floor: lr_scheduler_kwargs=\{\"min_lr_rate\": 0.1\}",  # field language (CLI: flags)
        ),
        (  # X08: "could not convert string to float" after the initial evaluation
            {"lr_scheduler_type": "cosine", "lr_scheduler_kwargs": {"num_cycles": "x"}},
            r"lr_scheduler_type='cosine' with lr_scheduler_kwargs=\{'num_cycles': 'x'\} cannot be built: "
            r"ValueError: could not convert string to float",
        ),
        (  # refused by the config since trial 15's N17 (a scheduler that takes no lr_scheduler_kwargs)
            {"lr_scheduler_type": "linear", "lr_scheduler_kwargs": {"num_cycles": 2}},
            r"lr_scheduler_type='linear' .* is invalid: 'linear' .* takes no lr_scheduler_kwargs \(transformers would "
            r"refuse them when training starts\)",
        ),
        (  # CM27: the fix was cosine_with_min_lr's floor, which linear does not take
            {"lr_scheduler_type": "linear", "lr_scheduler_kwargs": {"min_lr": 1e-6}},
            r"'linear' \(transformers' get_linear_schedule_with_warmup\) takes no lr_scheduler_kwargs .* Fix: drop "
            r"lr_scheduler_kwargs, or choose a scheduler that reads them \(for a floor, "
            r"lr_scheduler_type='cosine_with_min_lr'\)\.$",
        ),
        (  # a key the scheduler does not take: the trainer builds it once; the floor in field language (N17)
            {"lr_scheduler_type": "cosine", "lr_scheduler_kwargs": {"min_lr": 1e-6}},
            r"cannot be built: TypeError: .*'min_lr'\. Fix: 'cosine' .* takes only num_cycles in lr_scheduler_kwargs, "
            r"with numbers as numbers \(for a floor, lr_scheduler_type='cosine_with_min_lr'\)\.$",
        ),
        (
            {"lr_scheduler_type": "polynomial", "lr_scheduler_kwargs": {"min_lr": 1e-6}},
            r"Fix: 'polynomial' .* takes only lr_end, power in lr_scheduler_kwargs",
        ),
        (  # a scheduler stepped on a metric: built (not stepped); torch's TypeError came in train() (N17's sibling)
            {
                "lr_scheduler_type": "reduce_lr_on_plateau",
                "lr_scheduler_kwargs": {"mode": "max", "patiense": 2},
                "eval_strategy": "steps",
                "eval_steps": 1,
                "metric_for_best_model": "eval_reward",
            },
            r"cannot be built: TypeError: .*'patiense'\. Fix: 'reduce_lr_on_plateau' \(transformers' "
            r"get_reduce_on_plateau_schedule: torch\.optim\.lr_scheduler\.ReduceLROnPlateau\) takes only mode, factor, "
            r"patience,",
        ),
        ({"adam_beta1": 1.5}, r"The optimizer cannot be built from optim='adamw_torch_fused'.*adam_beta1=1.5"),
    ],
)
def test_optimizer_and_scheduler_settings_are_built_once_at_construction(
    tmp_path, saved_model, tokenizer, suite, tiny_config, no_model_loading, overrides, message
):
    with pytest.raises(ValueError, match=message):
        build(tmp_path, tokenizer, suite, tiny_config, model=str(saved_model), **overrides)


@pytest.mark.skipif(torch.accelerator.is_available(), reason="the GPU that device_map names may be there")
@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"device_map": "cuda"}, "'cuda'"),
        ({"device_map": {"": 0}}, "GPU 0"),
        ({"device_map": "auto", "max_memory": {0: "20GiB"}}, "GPU 0"),
    ],
    ids=["cuda", "index-map", "auto-max-memory"],
)
def test_a_gpu_device_map_without_a_gpu_is_named_before_loading(
    kwargs, named, tmp_path, saved_model, tokenizer, suite, tiny_config, monkeypatch
):
    # trial 15's N36: torch's "Torch not compiled with CUDA enabled" / transformers' "Cannot access accelerator
    # device when none is available", naming neither the argument nor the key
    from transformers import AutoModelForCausalLM

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the check")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", load)
    with pytest.raises(ValueError) as refused:
        build(tmp_path, tokenizer, suite, tiny_config, model=str(saved_model), model_init_kwargs=kwargs)
    message = str(refused.value)
    assert message.startswith(f"model_init_kwargs['device_map']={kwargs['device_map']!r}"), message
    assert f"places the model on {named}, but no GPU is visible" in message, message
    assert "Fix: drop device_map" in message and "the trainer places the model" in message, message


@pytest.mark.parametrize("device_map", ["cpu", "auto", {"": "cpu"}])
def test_a_device_map_on_the_cpu_loads(device_map, tmp_path, saved_model, tokenizer, suite, tiny_config):
    trainer = build(
        tmp_path, tokenizer, suite, tiny_config, model=str(saved_model), model_init_kwargs={"device_map": device_map}
    )
    assert next(trainer.model.parameters()).device.type == trainer.accelerator.device.type


@pytest.mark.parametrize(
    ("scheduler", "kwargs", "needles"),
    [
        (  # trial 15's N17: trained with the rate rising to 0.0025, 0.0035 above learning_rate=0.002
            "cosine_with_min_lr",
            {"min_lr_rate": 2.0},
            ["min_lr_rate must be in [0, 1], got 2.0", "the rate would rise above learning_rate", "min_lr_rate=0.1"],
        ),
        ("cosine_with_min_lr", {"min_lr": 0.01}, ["min_lr must be in [0, learning_rate=0.002], got 0.01"]),
        ("cosine_with_min_lr", {"min_lr": -1e-4}, ["min_lr must be in [0, learning_rate=0.002]", "turn negative"]),
        (
            "cosine_warmup_with_min_lr",
            {"min_lr_rate": 0.1, "warmup_lr_rate": 1.5},
            ["warmup_lr_rate must be in [0, 1]"],
        ),
        ("warmup_stable_decay", {"num_decay_steps": 1, "min_lr_ratio": -0.5}, ["min_lr_ratio must be in [0, 1]"]),
        ("polynomial", {"lr_end": -1e-7}, ["lr_end must be in [0, learning_rate=0.002]", "turn negative"]),
        (  # N17: transformers' get_scheduler drops the kwargs of these two, where linear refuses the same key
            "constant",
            {"foo": 1},
            [
                "'constant' (transformers' get_constant_schedule) takes no lr_scheduler_kwargs (transformers would "
                "ignore them without a word). Fix: drop lr_scheduler_kwargs"
            ],
        ),  # fmt: skip
        ("constant_with_warmup", {"num_cycles": 2}, ["'constant_with_warmup'", "takes no lr_scheduler_kwargs"]),
    ],
)
def test_scheduler_kwargs_transformers_would_train_wrongly_with_are_refused_by_the_config(
    tmp_path, scheduler, kwargs, needles
):
    """transformers takes a floor above the peak (the rate rises) and drops the kwargs of `constant` without a word;
    the config refuses both when it is built, naming the scheduler, the kwargs and the fix."""
    with pytest.raises(ValueError) as raised:
        TRAPOConfig(
            output_dir=str(tmp_path), learning_rate=2e-3, lr_scheduler_type=scheduler, lr_scheduler_kwargs=kwargs,
            report_to="none",
        )  # fmt: skip
    message = str(raised.value)
    assert message.startswith(f"TRAPOConfig.lr_scheduler_type={scheduler!r} with lr_scheduler_kwargs={kwargs!r}")
    for needle in needles:
        assert needle in message, (needle, message)


def test_scheduler_kwargs_in_range_pass_and_the_floor_fix_is_in_each_language(tmp_path):
    """The limits themselves are accepted; the fixes name fields in Python and flags on the command line (trial 15's
    N17: the Python message named `--lr_scheduler_type cosine_with_min_lr`)."""
    from trl_trapo.jobs.main import config_flag_names

    for scheduler, kwargs in [
        ("cosine_with_min_lr", {"min_lr_rate": 1.0}),
        ("cosine_with_min_lr", {"min_lr": 2e-3}),
        ("cosine_with_min_lr", {"min_lr": 0}),
        ("warmup_stable_decay", {"num_decay_steps": 1, "min_lr_ratio": 0.0}),
        ("constant", None),
        ("constant", {}),
    ]:
        TRAPOConfig(
            output_dir=str(tmp_path), learning_rate=2e-3, lr_scheduler_type=scheduler, lr_scheduler_kwargs=kwargs,
            report_to="none",
        )  # fmt: skip
    with pytest.raises(ValueError) as raised:
        TRAPOConfig(
            output_dir=str(tmp_path),
            lr_scheduler_type="linear",
            lr_scheduler_kwargs={"min_lr": 1e-6},
            report_to="none",
        )
    python = str(raised.value)
    assert "(for a floor, lr_scheduler_type='cosine_with_min_lr')" in python and "--" not in python, python
    assert "(for a floor, --lr_scheduler_type cosine_with_min_lr)" in config_flag_names(python)


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None, reason="bitsandbytes is installed")
@pytest.mark.parametrize(
    "optim, optim_args, unread",
    [
        ("adamw_torch", "foo=bar", "'foo'"),  # trial 9's CM28: ignored without a word, as transformers does
        ("adamw_torch", "eps=1e-6", "'eps'"),  # adamw_torch's epsilon is adam_epsilon
        ("sgd", "momentum=0.9,foo=bar", "'foo'"),  # sgd reads momentum, not foo
        ("sgd", "momentum=0.9", None),
        ("adamw_torch", None, None),
    ],
)
def test_optim_args_the_optimizer_does_not_read_are_warned_about(tmp_path, caplog, optim, optim_args, unread):
    from trl_trapo.setup_checks import check_optimizer

    args = TRAPOConfig(output_dir=str(tmp_path), optim=optim, optim_args=optim_args, report_to="none")
    with caplog.at_level(logging.WARNING, logger="trl_trapo.setup_checks"):
        check_optimizer(args)
    said = [r.getMessage() for r in caplog.records if "optim_args" in r.getMessage()]
    if unread is None:
        assert said == [], said
    else:
        assert len(said) == 1 and f"optim={optim!r} does not read {unread} (transformers ignores it)" in said[0], said
    assert args.optim_args == optim_args  # the config is not changed by the check


def test_an_optimizer_whose_package_is_missing_names_it_and_the_fix(
    tmp_path, saved_model, tokenizer, suite, tiny_config, no_model_loading
):
    # X07: an ImportError traceback after the initial evaluation
    with pytest.raises(
        ValueError, match=r"optim='adamw_bnb_8bit' cannot be used: .*bitsandbytes.*--optim adamw_torch"
    ):
        build(tmp_path, tokenizer, suite, tiny_config, model=str(saved_model), optim="adamw_bnb_8bit")


def test_an_optimizer_or_scheduler_given_by_the_user_is_not_rebuilt(tmp_path, tokenizer, suite, tiny_config):
    model = build_tiny_model(tokenizer, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    trainer = build(
        tmp_path,
        tokenizer,
        suite,
        tiny_config,
        model=model,
        optimizers=(optimizer, None),
        optim="adamw_bnb_8bit",  # never built: the user's optimizer is used
    )
    assert trainer.optimizer is optimizer


def test_a_tracker_whose_package_is_missing_names_it_and_report_to_none(
    tmp_path, saved_model, tokenizer, suite, tiny_config, no_model_loading, monkeypatch
):
    # X03: transformers' "RuntimeError: WandbCallback requires wandb" traceback
    monkeypatch.setattr(integration_utils, "is_wandb_available", lambda: False)
    with pytest.raises(ValueError, match=r"report_to=\['wandb'\] is invalid: .*`pip install wandb`.*--report_to none"):
        build(tmp_path, tokenizer, suite, tiny_config, model=str(saved_model), report_to="wandb")
    with pytest.raises(ValueError, match=r"'nope' is not a tracker transformers knows; use some of .*wandb"):
        build(tmp_path, tokenizer, suite, tiny_config, model=str(saved_model), report_to=["nope"])


# ---- construction arguments ---------------------------------------------------------------------------------------
def test_model_none_is_refused_by_name(tmp_path, tokenizer, suite, tiny_config):
    # T16: "'NoneType' object has no attribute 'modules'" from TRL's utils
    with pytest.raises(TypeError, match=r"`model` is required: a model id .*got None"):
        TRAPOTrainer(None, reward_funcs=exact_match_reward, args=tiny_config(tmp_path), train_dataset=suite.rl_train)


def test_a_classification_model_or_adapter_is_refused_as_the_policy(tmp_path, tokenizer, suite, tiny_config):
    # M05 / P02: trained silently (a new LM head; a SEQ_CLS adapter saved as such)
    config = LlamaConfig(**build_tiny_model(tokenizer).config.to_dict(), num_labels=1)
    classifier = LlamaForSequenceClassification(config)
    with pytest.raises(ValueError, match=r"`model` is a LlamaForSequenceClassification: .*swap"):
        build(tmp_path, tokenizer, suite, tiny_config, model=classifier)
    folder = tmp_path / "seqcls"
    classifier.save_pretrained(folder)
    with pytest.raises(ValueError, match=r"is a LlamaForSequenceClassification checkpoint .*`architectures`"):
        build(tmp_path, tokenizer, suite, tiny_config, model=str(folder))
    peft_config = LoraConfig(r=4, task_type="SEQ_CLS", target_modules=["q_proj"])
    with pytest.raises(ValueError, match=r"`peft_config` has task_type='SEQ_CLS'.*task_type='CAUSAL_LM'"):
        build(tmp_path, tokenizer, suite, tiny_config, peft_config=peft_config)


def test_a_causal_lm_given_as_a_reward_model_is_refused(tmp_path, tokenizer, suite, tiny_config):
    # N82: loaded as a sequence-classification model it got a random score head, and trained on random rewards
    causal = tmp_path / "causal"
    build_tiny_model(tokenizer).save_pretrained(causal)
    for argument in ("reward_funcs", "reward_model"):
        with pytest.raises(
            ValueError, match=rf"{argument}='.*causal' is a LlamaForCausalLM checkpoint .*not a reward"
        ):
            build(tmp_path, tokenizer, suite, tiny_config, model="no/such/model-folder", **{argument: str(causal)})
    config = LlamaConfig(**build_tiny_model(tokenizer).config.to_dict(), num_labels=1)
    scorer = tmp_path / "scorer"
    LlamaForSequenceClassification(config).save_pretrained(scorer)
    tokenizer.save_pretrained(scorer)
    trainer = build(tmp_path, tokenizer, suite, tiny_config, reward_funcs=[exact_match_reward, str(scorer)])
    assert isinstance(trainer.rewards.funcs[1], LlamaForSequenceClassification)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(r=0), r"peft_config\.r=0 is invalid: the LoRA rank must be a whole number >= 1"),
        (dict(lora_dropout=1.5), r"peft_config\.lora_dropout=1\.5 is invalid: it must be a probability in \[0, 1\)"),
        (dict(lora_alpha=0), r"peft_config\.lora_alpha=0 is invalid: it must be > 0"),
        (dict(rank_pattern={"q_proj": 0}), r"peft_config\.rank_pattern\['q_proj'\]=0 is invalid"),
        (dict(alpha_pattern={"q_proj": -2}), r"peft_config\.alpha_pattern\['q_proj'\]=-2 is invalid"),
    ],
)
def test_lora_numbers_peft_or_torch_refuse_late_are_refused_by_field(
    tmp_path, tokenizer, suite, tiny_config, fields, message
):
    # N33 / N130: a peft (`r` should be a positive integer) or torch (dropout probability) traceback naming no field;
    # lora_alpha=0 trained an adapter scaled to nothing
    peft_config = LoraConfig(**{"target_modules": ["q_proj"], "task_type": "CAUSAL_LM", **fields})
    with pytest.raises(ValueError, match=message):
        build(tmp_path, tokenizer, suite, tiny_config, model="no/such/model-folder", peft_config=peft_config)


def test_the_command_line_name_of_a_builtin_reward_points_to_the_function(tmp_path, tokenizer, suite, tiny_config):
    # T26: taken as a Hub id ("connect to the network")
    with pytest.raises(
        ValueError, match=r"reward_funcs='exact_match' .*from trl_trapo.rewards import exact_match_reward"
    ):
        build(tmp_path, tokenizer, suite, tiny_config, reward_funcs="exact_match")


def test_an_async_rollout_func_is_refused_at_construction(tmp_path, tokenizer, suite, tiny_config):
    # RF02: "returned coroutine" after the first rollout; TRL 1.16 calls rollout_func synchronously too
    async def rollout(prompts, trainer):
        return {}

    with pytest.raises(TypeError, match=r"rollout_func=rollout is an async function.*`def`.*asyncio.run"):
        build(tmp_path, tokenizer, suite, tiny_config, rollout_func=rollout)


def test_early_stopping_needs_a_metric_trapo_logs_and_evaluations(tmp_path, tokenizer, suite, tiny_config):
    # T17: transformers' AssertionError at train()
    stop = [EarlyStoppingCallback(early_stopping_patience=1)]
    with pytest.raises(ValueError, match=r"metric_for_best_model=None: the EarlyStoppingCallback .*eval_reward"):
        build(tmp_path, tokenizer, suite, tiny_config, callbacks=stop)
    with pytest.raises(ValueError, match=r"eval_strategy='no': the EarlyStoppingCallback"):
        build(tmp_path, tokenizer, suite, tiny_config, callbacks=stop, metric_for_best_model="eval_reward")
    with pytest.raises(ValueError, match=r"metric_for_best_model='loss' is not a metric evaluate\(\) returns"):
        build(
            tmp_path,
            tokenizer,
            suite,
            tiny_config,
            callbacks=[EarlyStoppingCallback],
            metric_for_best_model="loss",
            eval_strategy="steps",
            eval_steps=2,
        )


def test_a_chat_template_that_does_not_compile_is_refused_with_its_line(tmp_path, tokenizer, suite, tiny_config):
    # T15: jinja2's TemplateSyntaxError from deep inside dataset preparation
    folder = tmp_path / "tok"  # a copy: the module-scoped tokenizer is shared
    tokenizer.save_pretrained(folder)
    copy = type(tokenizer).from_pretrained(folder)
    copy.chat_template = "{% for m in messages %}{{ m['content'] }}}}{% endfor %}\n{{ }"
    with pytest.raises(ValueError, match=r"chat template of `processing_class` does not compile \(line \d+: "):
        build(tmp_path, tokenizer, suite, tiny_config, processing_class=copy)


# ---- from_pretrained arguments of a policy loaded by id -----------------------------------------------------------
def test_an_unknown_model_init_kwarg_is_named_with_the_close_one(tmp_path, saved_model, tokenizer, suite, tiny_config):
    # P07: "LlamaForCausalLM.__init__() got an unexpected keyword argument 'torch_dtipe'"
    with pytest.raises(
        ValueError, match=r"model_init_kwargs\['torch_dtipe'\] is not an argument .*Did you mean 'dtype'"
    ):
        build(tmp_path, tokenizer, suite, tiny_config, model=str(saved_model), model_init_kwargs={"torch_dtipe": "x"})


def test_an_unknown_model_type_names_the_model(tmp_path, saved_model, tokenizer, suite, tiny_config):
    # M04: transformers' text alone
    config = json.loads((saved_model / "config.json").read_text())
    (saved_model / "config.json").write_text(json.dumps({**config, "model_type": "llamaa"}))
    with pytest.raises(ValueError, match=r"model='.*tiny' \(`--model_name_or_path`\): transformers cannot read its"):
        build(tmp_path, tokenizer, suite, tiny_config, model=str(saved_model))


@pytest.mark.skipif(torch.cuda.is_available(), reason="flash attention may work on a GPU")
def test_flash_attention_without_a_gpu_names_the_flag_and_sdpa(tmp_path, saved_model, tokenizer, suite, tiny_config):
    # M06: transformers' text without the flag
    kwargs = {"attn_implementation": "flash_attention_2"}
    with pytest.raises(
        ValueError, match=r"\['attn_implementation'\]='flash_attention_2' \(`--attn_implementation`\).*'sdpa'"
    ):
        build(tmp_path, tokenizer, suite, tiny_config, model=str(saved_model), model_init_kwargs=kwargs)


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None, reason="bitsandbytes is installed")
def test_4bit_loading_without_bitsandbytes_names_the_flag(tmp_path, saved_model, tokenizer, suite, tiny_config):
    # M07: transformers' text without the flag
    from transformers import BitsAndBytesConfig

    kwargs = {"quantization_config": BitsAndBytesConfig(load_in_4bit=True)}
    with pytest.raises(
        ValueError, match=r"loads the model in 4-bit \(`--load_in_4bit`\), which needs the bitsandbytes"
    ):
        build(tmp_path, tokenizer, suite, tiny_config, model=str(saved_model), model_init_kwargs=kwargs)


def test_a_manual_push_checks_the_repo_id_before_saving(tmp_path, tokenizer, suite, tiny_config):
    # T04: huggingface_hub's raw HFValidationError from trainer.push_to_hub()
    trainer = build(tmp_path, tokenizer, suite, tiny_config, out="my run")
    with pytest.raises(ValueError, match=r"the Hub repo id 'my run' .* is not a valid repo id.*--hub_model_id"):
        trainer.push_to_hub()
    assert not (tmp_path / "my run" / "model.safetensors").exists()


def test_init_hf_repo_by_hand_gives_the_config_checks_message(tmp_path, tokenizer, suite, tiny_config):
    # one message for a bad repo id wherever it is met: `init_hf_repo` (here called by hand, push_to_hub=False, so
    # the config did not check) says what `check_hub_repo_id` says, not a second wording
    trainer = build(tmp_path, tokenizer, suite, tiny_config, out="my run")
    with pytest.raises(ValueError, match=r"TRAPOConfig.output_dir: the Hub repo id 'my run' .*`--hub_model_id`"):
        trainer.init_hf_repo()


@pytest.mark.parametrize("kind", ["reduce_lr_on_plateau", "greedy"])
def test_a_metric_scheduler_needs_a_metric_trapo_logs_and_its_direction(tmp_path, tokenizer, suite, tiny_config, kind):
    # trial 8's JC28: transformers' KeyError "metric_for_best_model ... 'eval_loss', which is not found" at the first
    # evaluation after training began (transformers sets metric_for_best_model='loss' for these schedulers)
    def build_with(**fields):
        settings = dict(lr_scheduler_type=kind, eval_strategy="steps", eval_steps=1, eval_dataset=suite.eval)
        return build(tmp_path, tokenizer, suite, tiny_config, **settings, **fields)

    with pytest.raises(
        ValueError,
        match=rf"metric_for_best_model='loss' \(transformers' default\) is not a metric "
        rf"evaluate\(\) returns for this run's eval_dataset \(lr_scheduler_type='{kind}' .*metric_for_best_model='eval_reward'.*'mode': 'max'",
    ):
        build_with()
    with pytest.raises(
        ValueError, match=r"which is higher when better, but the scheduler's mode is 'min'.*'mode': 'max'"
    ):
        build_with(metric_for_best_model="eval_reward")


@pytest.mark.parametrize("kind", ["reduce_lr_on_plateau", "greedy"])
def test_a_metric_scheduler_without_evaluations_is_refused_by_the_config_naming_the_fix(tmp_path, kind):
    # trial 9's PX55 / CM30: transformers' "lr_scheduler_type greedy requires an eval strategy" named no fix (and the
    # command line's tools job printed the same text)
    with pytest.raises(ValueError) as caught:
        TRAPOConfig(output_dir=str(tmp_path), report_to="none", lr_scheduler_type=kind)
    message = str(caught.value)
    assert message.startswith(f"TRAPOConfig.lr_scheduler_type='{kind}' needs an evaluation to step on")
    for needle in ("eval_strategy='no'", "eval_strategy='steps'", "metric_for_best_model='eval_reward'", "'linear'"):
        assert needle in message, (needle, message)
    # what the message asks for builds
    TRAPOConfig(
        output_dir=str(tmp_path), report_to="none", lr_scheduler_type=kind, eval_strategy="steps", eval_steps=1
    )


def test_reduce_lr_on_plateau_steps_on_the_eval_reward(tmp_path, tokenizer, suite, tiny_config):
    """What the refusal above points to trains, and the scheduler gets the evaluation's metric (as under
    transformers' Trainer): a patience of 0 and no reward gain lowers the learning rate."""
    plateau = {"mode": "max", "patience": 0, "factor": 0.5, "threshold": 10.0}
    scheduler = dict(lr_scheduler_type="reduce_lr_on_plateau", lr_scheduler_kwargs=plateau)
    evaluated = dict(eval_dataset=suite.eval, metric_for_best_model="eval_reward", eval_strategy="steps", eval_steps=1)
    trainer = build(tmp_path, tokenizer, suite, tiny_config, max_steps=3, **scheduler, **evaluated)
    trainer.train()
    assert any("eval_reward" in entry for entry in trainer.state.log_history)
    # threshold 10 (rel): no evaluation counts as an improvement, so each one after the first halves the rate
    assert trainer.optimizer.param_groups[0]["lr"] < tiny_config(tmp_path / "x").learning_rate


def test_an_optimizer_over_another_models_parameters_is_refused(tmp_path, tokenizer, suite, tiny_config):
    # trial 8's MD04: trained 2 steps, loss and grad_norm logged, and the policy never moved
    other = build_tiny_model(tokenizer, seed=1)
    optimizer = torch.optim.AdamW(other.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match=r"`optimizers\[0\]` \(AdamW\) holds none of the \d+ trainable parameter"):
        build(tmp_path, tokenizer, suite, tiny_config, optimizers=(optimizer, None))


def test_an_optimizer_built_before_the_adapter_is_refused_with_the_peft_fix(tmp_path, tokenizer, suite, tiny_config):
    model = build_tiny_model(tokenizer, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the base weights: frozen once the adapter is added
    with pytest.raises(ValueError, match=r"holds none of .*LoRA adapter of `peft_config` is created inside"):
        build(
            tmp_path,
            tokenizer,
            suite,
            tiny_config,
            model=model,
            optimizers=(optimizer, None),
            peft_config=LoraConfig(r=2, target_modules=["q_proj"]),
        )


def test_an_optimizer_over_some_trained_parameters_is_named_in_a_warning(
    tmp_path, tokenizer, suite, tiny_config, caplog
):
    model = build_tiny_model(tokenizer, seed=0)
    params = [p for name, p in model.named_parameters() if "embed" not in name]
    with caplog.at_level("WARNING", logger="trl_trapo.setup_checks"):
        build(tmp_path, tokenizer, suite, tiny_config, model=model, optimizers=(torch.optim.AdamW(params), None))
    messages = [r.getMessage() for r in caplog.records]
    assert any("get gradients but are never updated" in m and "embed" in m for m in messages), messages
    caplog.clear()
    with caplog.at_level("WARNING", logger="trl_trapo.setup_checks"):  # all of them: nothing to say (trial 8's MD03)
        build(
            tmp_path,
            tokenizer,
            suite,
            tiny_config,
            model=model,
            optimizers=(torch.optim.AdamW(model.parameters()), None),
        )
    assert not [r for r in caplog.records if "optimizers[0]" in r.getMessage()]


def test_neftune_is_refused_in_a_run_with_rl_and_kept_without(tmp_path, tokenizer, suite, tiny_config):
    # trial 8's CF08: NEFTune's noise on every training forward but not the sampler's: the first PPO ratio was 0.997
    with pytest.raises(ValueError, match=r"neftune_noise_alpha=5 cannot be used in a run with RL.*Fix: drop"):
        build(tmp_path, tokenizer, suite, tiny_config, neftune_noise_alpha=5)
    trainer = TRAPOTrainer(  # SFT only: NEFTune's own use, kept
        build_tiny_model(tokenizer, seed=0),
        args=tiny_config(tmp_path / "sft", neftune_noise_alpha=5, max_steps=1),
        sft_dataset=suite.sft,
        processing_class=tokenizer,
    )
    trainer.train()
    assert trainer.state.global_step == 1


# ---- a warm-up as long as the run (trial 14's C16 / N38: the one step trained at learning rate 0, no word) ---------
WARMUP_WARNING = "the whole run is warm-up"


def test_a_warmup_as_long_as_the_run_is_warned_about_with_the_rates(tmp_path, tokenizer, suite, tiny_config, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_trapo.setup_checks"):
        build(tmp_path, tokenizer, suite, tiny_config, warmup_steps=5, max_steps=2, lr_scheduler_type="linear")
    said = [r.getMessage() for r in caplog.records if WARMUP_WARNING in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("warmup_steps=5 is at least the run's 2 optimizer steps (max_steps=2)")
    lr = tiny_config(tmp_path / "x").learning_rate
    assert f"step 1 at 0, step 2 at {lr * 1 / 5:.3g}" in said[0]  # what transformers' linear warm-up gives them
    assert said[0].endswith(
        "Fix: set warmup_steps=0, or at most 1 (below 1 it is a fraction of the steps), or raise max_steps."
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {"warmup_steps": 1, "max_steps": 2, "lr_scheduler_type": "linear"},  # step 2 trains at learning_rate
        {"warmup_steps": 5, "max_steps": 2, "lr_scheduler_type": "constant"},  # no warm-up in this schedule
    ],
)
def test_a_warmup_that_ends_within_the_run_is_not_warned_about(
    tmp_path, tokenizer, suite, tiny_config, caplog, overrides
):
    with caplog.at_level(logging.WARNING, logger="trl_trapo.setup_checks"):
        build(tmp_path, tokenizer, suite, tiny_config, **overrides)
    assert not [r for r in caplog.records if WARMUP_WARNING in r.getMessage()]


# ---- an explicit `log_level` sets TRAPO's own logger too (trial 15's N20) -------------------------------------------
@pytest.fixture
def trapo_logger():
    """The `trl_trapo` logger (its level and handlers restored after the test by conftest's `logging_as_it_was`)."""
    return logging.getLogger("trl_trapo")


def test_each_test_leaves_the_loggers_as_it_found_them():
    """A test with `log_level="debug"` left TRAPO's and transformers' loggers at DEBUG for every later test of its
    worker (and a job's logging setup left a root handler): conftest's `restored_logging` undoes both."""
    from types import SimpleNamespace

    import transformers
    from conftest import restored_logging

    from trl_trapo.setup_checks import apply_log_level

    library, hf, root = logging.getLogger("trl_trapo"), logging.getLogger("transformers"), logging.getLogger()
    before = (library.level, list(library.handlers), hf.level, root.level, list(root.handlers))
    added = logging.StreamHandler()
    with restored_logging():
        apply_log_level(SimpleNamespace(log_level="debug", log_level_replica="warning", should_log=True))
        transformers.utils.logging.set_verbosity_debug()  # what the trainer does with `log_level="debug"`
        root.setLevel(logging.DEBUG)
        root.addHandler(added)  # a script's `logging.basicConfig(...)`
        assert library.level == hf.level == root.level == logging.DEBUG
    assert (library.level, list(library.handlers), hf.level, root.level, list(root.handlers)) == before
    assert added not in root.handlers


def test_an_explicit_log_level_sets_trapos_logger_as_the_trainer_sets_transformers(
    tmp_path, tokenizer, suite, tiny_config, trapo_logger
):
    """`log_level="info"` set transformers' verbosity only: TRAPO's own logger stayed at WARNING, so its info lines
    (the generation rounds' note, evaluation timings) never appeared in a Python run."""
    trapo_logger.setLevel(logging.NOTSET)
    build(tmp_path, tokenizer, suite, tiny_config, log_level="info")
    assert trapo_logger.level == logging.INFO and logging.getLogger("trl_trapo.sources").isEnabledFor(logging.INFO)
    from types import SimpleNamespace

    from trl_trapo.setup_checks import apply_log_level

    # the process that logs takes `log_level`, the others `log_level_replica`; "passive" leaves the level as it is
    for log_level, replica, should_log, expected in [
        ("debug", "error", True, logging.DEBUG),
        ("debug", "error", False, logging.ERROR),
        ("info", "passive", False, logging.CRITICAL),
        ("passive", "debug", False, logging.CRITICAL),
        ("passive", "debug", True, logging.CRITICAL),
    ]:
        trapo_logger.setLevel(logging.CRITICAL)
        apply_log_level(SimpleNamespace(log_level=log_level, log_level_replica=replica, should_log=should_log))
        assert trapo_logger.level == expected, (log_level, replica, should_log)


def test_trapos_info_lines_are_printed_in_a_plain_script_and_once_with_the_users_logging(tmp_path):
    """Python's last-resort handler prints warnings only: with no handler configured, an info level alone would still
    show nothing, so a handler is added, which stays silent once the user configures logging."""
    import subprocess
    import sys

    script = (
        "import logging, types\n"
        "from trl_trapo.setup_checks import apply_log_level\n"
        "apply_log_level(types.SimpleNamespace(log_level='info', log_level_replica='warning', should_log=True))\n"
        "logging.getLogger('trl_trapo.sources').info('first line')\n"
        "logging.basicConfig(format='user: %(message)s')\n"
        "logging.getLogger('trl_trapo.sources').info('second line')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if "line" in line]
    assert len(lines) == 2 and lines[0].endswith("INFO trl_trapo.sources: first line"), lines
    assert lines[1] == "user: second line", lines
