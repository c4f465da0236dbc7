# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The VLM and agent jobs parse their command line with the main job's checks (`cli.parse_job_args`).

They called `TrlParser.parse_args_and_config` directly, so a typo got argparse's "Some specified arguments are not
used by the HfArgumentParser" with no hint, `--config=recipe.yaml` was an unknown argument, a YAML key or value the
parser cannot use went through unchecked, and `--learning_rate -1e-3` was "expected one argument": the main job had
fixed each of these (tests/test_user_errors.py), its siblings had not.
"""

from __future__ import annotations

import json

import pytest
import yaml


JOBS = {
    "vision": ("trl_trapo.jobs.vision", "examples/trapo_vlm.py", "num_sft_per_task"),
    "agent": ("trl_trapo.jobs.agent", "examples/trapo_tools.py", "num_traces"),
}


def job(name):
    import importlib

    module, program, job_field = JOBS[name]
    return importlib.import_module(module), program, job_field


@pytest.mark.parametrize("name", sorted(JOBS))
def test_a_misspelt_argument_gets_the_closest_name_and_the_script(name):
    module, program, job_field = job(name)
    with pytest.raises(
        ValueError, match=r"--num_generation: unknown argument\. Did you mean --num_generations\?"
    ) as e:
        module.parse_args(["--num_generation", "4"])
    assert f"python {program} --help" in str(e.value)
    with pytest.raises(ValueError, match=f"Did you mean --{job_field}\\?"):  # the job's own fields are known too
        module.parse_args([f"--{job_field[:-1]}", "4"])


@pytest.mark.parametrize("name", sorted(JOBS))
def test_config_equals_form_and_yaml_keys_are_checked(tmp_path, name):
    module, program, job_field = job(name)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"{job_field}: 7\nmax_steps: 3\n")
    job_args, config = module.parse_args([f"--config={recipe}", "--learning_rate", "2e-3"])
    assert getattr(job_args, job_field) == 7 and config.max_steps == 3 and config.learning_rate == 2e-3

    recipe.write_text("learning_rat: 0.001\n")
    with pytest.raises(ValueError, match=r"unknown key 'learning_rat'.*Did you mean --learning_rate\?") as e:
        module.parse_args(["--config", str(recipe)])
    assert f"python {program} --help" in str(e.value)

    recipe.write_text("max_steps: [3]\n")  # the parser would have handed the list on to the trainer
    with pytest.raises(ValueError, match=r"max_steps: \[3\] is list; a whole number is needed"):
        module.parse_args(["--config", str(recipe)])


@pytest.mark.parametrize("name", sorted(JOBS))
def test_a_negative_number_reaches_the_config_check(name):
    """argparse took `-1e-3` for an option ("expected one argument"); the config's own check names the field."""
    module, _, _ = job(name)
    with pytest.raises(ValueError, match=r"^--learning_rate -0\.001 is invalid"):  # the config's refusal, in flags
        module.parse_args(["--learning_rate", "-1e-3"])


def test_lora_flags_without_use_peft_are_warned_and_ignored_as_trl_does(caplog):
    """`--lora_r 8` without `--use_peft` trained the full model without a word (trial 4's N83). TRL's scripts ignore
    it too (`get_peft_config` reads the flags only with `--use_peft`): kept, with a warning naming the flags."""
    import logging

    from trl_trapo.jobs.main import parse_args

    with caplog.at_level(logging.WARNING, logger="trl_trapo.jobs.main"):
        _, _, model_args = parse_args(["--lora_r", "8", "--lora_dropout", "0.1", "--output_dir", "unused"])
    assert model_args.use_peft is False
    assert "--lora_r, --lora_dropout are set but --use_peft is not" in caplog.text and "Add --use_peft" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo.jobs.main"):
        parse_args(["--use_peft", "--lora_r", "8", "--output_dir", "unused"])
        parse_args(["--output_dir", "unused"])
    assert "--use_peft is not" not in caplog.text


def test_dataset_flags_without_their_dataset_are_warned_and_ignored(caplog):
    """Trial 11's C04: in built-in mode `--dataset_train_split nosuch`, `--dataset_test_split nosuch` and
    `--dataset_config main` were dropped without a word (with `--dataset_name` a missing split is an error). Every
    flag that qualifies a dataset (its config, split(s), streaming) given without that dataset's `--..._name` is now
    warned about, as `--lora_*` without `--use_peft` is; with the name, nothing is said."""
    import logging

    from trl_trapo.jobs.main import parse_args

    argv = [
        *("--dataset_train_split", "nosuch", "--dataset_test_split", "nosuch", "--dataset_config", "main"),
        *("--sft_dataset_split", "other", "--pretrain_streaming", "--output_dir", "unused"),
    ]
    with caplog.at_level(logging.WARNING, logger="trl_trapo.jobs.main"):
        script_args, _, _ = parse_args(argv)
    assert script_args.dataset_train_split == "nosuch"  # kept as given: ignored, not rewritten
    for needle in [
        "--dataset_config, --dataset_train_split, --dataset_test_split are set but --dataset_name is not: they are "
        "ignored",
        "Add --dataset_name to load a dataset with them",
        "--sft_dataset_split is set but --sft_dataset_name is not: it is ignored",
        "--pretrain_streaming is set but --pretrain_dataset_name is not",
    ]:
        assert needle in caplog.text, (needle, caplog.text)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo.jobs.main"):
        parse_args(["--sft_dataset_name", "rows.jsonl", "--sft_dataset_split", "other", "--output_dir", "unused"])
        parse_args(["--dataset_train_split", "train", "--output_dir", "unused"])  # the default: nothing given
    assert "is not: " not in caplog.text, caplog.text


@pytest.mark.parametrize(
    "flag, replacement",
    [("--logging_dir", "TensorBoard logs go under --output_dir"), ("--no_cuda", "use --use_cpu")],
)
def test_an_argument_transformers_5_removed_gets_its_replacement(tmp_path, flag, replacement):
    """`--logging_dir` (transformers 4 recipes and TRL scripts) was answered "Did you mean --logging_first_step?", an
    unrelated flag (trial 4's N103): a removed `TrainingArguments` field is named as removed, with what replaces it,
    on the command line and as a `--config` key."""
    from trl_trapo.jobs.main import parse_args

    expected = rf"{flag}: unknown argument\. {flag} was removed in transformers 5: drop it; {replacement}"
    with pytest.raises(ValueError, match=expected):
        parse_args([flag, "x", "--output_dir", "unused"])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"{flag[2:]}: x\n")
    with pytest.raises(ValueError, match=rf"{flag[2:]}.*was removed in transformers 5: drop it; {replacement}"):
        parse_args(["--config", str(recipe), "--output_dir", "unused"])


def test_trl_model_configs_old_torch_dtype_names_dtype(tmp_path):
    """`--torch_dtype bfloat16` (TRL ModelConfig's name before 1.0) was "Did you mean --torch_threads?", an unrelated
    flag (trial 8's JC03); on the command line and as a recipe key it names --dtype."""
    from trl_trapo.jobs.main import parse_args

    expected = r"--torch_dtype: unknown argument\. --torch_dtype is TRL ModelConfig's old name of --dtype.*use --dtype"
    with pytest.raises(ValueError, match=expected) as e:
        parse_args(["--torch_dtype", "bfloat16", "--output_dir", "unused"])
    assert "torch_threads" not in str(e.value)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("torch_dtype: bfloat16\n")
    with pytest.raises(ValueError, match=r"torch_dtype.*TRL ModelConfig's old name of --dtype"):
        parse_args(["--config", str(recipe), "--output_dir", "unused"])
    _, _, model_args = parse_args(["--dtype", "bfloat16", "--model_name_or_path", "m", "--output_dir", str(tmp_path)])
    assert model_args.dtype == "bfloat16"


def test_model_loading_flags_without_a_model_are_refused_by_flag(tmp_path):
    """Trial 11's C12: `--model_init_kwargs '{"dtype": "bfloat16"}'` in built-in mode was refused in the trainer's
    words ("only used when `model` is a string"), naming no flag; `--dtype`, `--attn_implementation` and
    `--model_revision` were ignored without a word (nothing loads: the tiny model is built in-process)."""
    from trl_trapo.jobs.main import parse_args

    for argv, named in [
        (["--model_init_kwargs", '{"dtype": "bfloat16"}'], '--model_init_kwargs \'{"dtype": "bfloat16"}\''),
        (["--dtype", "bfloat16"], "--dtype bfloat16"),
        (["--attn_implementation", "sdpa", "--model_revision", "v2"], "--model_revision v2, --attn_implementation"),
    ]:
        with pytest.raises(ValueError) as raised:
            parse_args([*argv, "--output_dir", str(tmp_path)])
        message = str(raised.value)
        for needle in [named, "no model is given", "built-in mode", "Fix: pass --model_name_or_path"]:
            assert needle in message, (needle, message)
        assert "`model`" not in message


def test_an_empty_reward_funcs_list_in_a_recipe_is_refused(tmp_path):
    """`reward_funcs: []` in a recipe trained with the built-in reward, the log saying "from you: nothing"; the
    command line's `--reward_funcs ''` is refused (trial 5, c19)."""
    from trl_trapo.jobs.main import read_config_file

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("max_steps: 2\nreward_funcs: []\n")
    with pytest.raises(
        ValueError, match=r"reward_funcs: \[\] names nothing, so the run would use the built-in reward"
    ):
        read_config_file(str(recipe))
    recipe.write_text("max_steps: 2\nreward_funcs: [exact_match]\n")
    assert read_config_file(str(recipe))["reward_funcs"] == ["exact_match"]


def test_an_empty_output_dir_in_a_recipe_is_refused(tmp_path):
    """Trial 11's C20: `output_dir:` left empty (YAML null) in a recipe was taken as given, and the run wrote to
    transformers' fallback ./trainer_output, not the job's trapo-output, without a word (every other empty key is
    refused). Refused now, naming the key and the fixes."""
    from trl_trapo.jobs.main import read_config_file

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("max_steps: 2\noutput_dir:\n")
    with pytest.raises(ValueError, match=r"output_dir: is empty \(YAML null\), so the run would use transformers' "
                       r"fallback folder, \./trainer_output.*Fix: give a value"):  # fmt: skip
        read_config_file(str(recipe))
    recipe.write_text(f"max_steps: 2\noutput_dir: {tmp_path / 'run'}\n")
    assert read_config_file(str(recipe))["output_dir"] == str(tmp_path / "run")


def test_the_dataset_flags_are_generated_from_the_objectives(monkeypatch):
    """The main job's `--<objective>_dataset_name / _config / _split` flags (and `--pretrain_streaming`) are
    generated from `objectives.WITH_DATA`, with each objective's help, after TRL's RL flags and in the objectives'
    order; `TrlParser` reads them; an objective class added to `WITH_DATA` gets its three flags with nothing else to
    write in the job."""
    import dataclasses

    from trl import TrlParser

    from trl_trapo.jobs import main as job
    from trl_trapo.objectives import WITH_DATA

    fields = [f.name for f in dataclasses.fields(job.TRAPOScriptArguments)]
    generated = [name for name, _, _ in job.objective_data_fields(job.RLDataArguments)]
    expected = [
        "pretrain_dataset_name",
        "pretrain_dataset_config",
        "pretrain_dataset_split",
        "pretrain_streaming",
        "sft_dataset_name",
        "sft_dataset_config",
        "sft_dataset_split",
        "distillation_dataset_name",
        "distillation_dataset_config",
        "distillation_dataset_split",
    ]
    assert generated == expected
    start = fields.index("ignore_bias_buffers") + 1  # right after TRL's RL prompts' flags, as they were written
    assert fields[start : start + len(expected)] == expected
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(job.TRAPOScriptArguments)}
    for cls in job.flagged_objectives(job.RLDataArguments):
        assert helps[f"{cls.DATA_FLAGS}_name"] == cls.DATA_HELP and helps[f"{cls.DATA_FLAGS}_split"] == cls.SPLIT_HELP
    (script_args,) = TrlParser((job.TRAPOScriptArguments,)).parse_args_and_config(
        ["--sft_dataset_name", "demos.jsonl", "--pretrain_streaming", "--distillation_dataset_split", "dev"]
    )
    assert (script_args.sft_dataset_name, script_args.pretrain_streaming) == ("demos.jsonl", True)
    assert (script_args.distillation_dataset_split, script_args.pretrain_dataset_split) == ("dev", "train")

    class CodeObjective:  # what a new objective with data declares for the job
        NAME, ARGUMENT, DATA_FLAGS, STREAMING_FLAG = "code", "code_dataset", "code_dataset", None
        DATA_HELP, SPLIT_HELP = "Code (`text` column): Hub id, local file or directory.", "Split of the code."

    monkeypatch.setattr(job, "WITH_DATA", (*WITH_DATA, CodeObjective))
    added = job.objective_data_fields(job.RLDataArguments)[len(expected) :]
    assert [(name, f.default, f.metadata["help"]) for name, _, f in added] == [
        ("code_dataset_name", None, CodeObjective.DATA_HELP),
        ("code_dataset_config", None, "Configuration name."),
        ("code_dataset_split", "train", "Split of the code."),
    ]


@pytest.mark.parametrize(
    "name, flag, guide",
    [
        ("agent", "--dataset_name", "`TRAPOTrainer(tools=...)` in Python for tool calls (docs/agents.md)"),
        (
            "vision",
            "--model_name_or_path",
            "`TRAPOTrainer` with a processor in Python for image rows (docs/vision.md)",
        ),
        ("vision", "--use_peft", "`trapo train` (it takes --model_name_or_path, --dataset_name, --use_peft"),
    ],
)
def test_a_main_job_argument_given_to_a_built_in_job_names_the_job_that_has_it(tmp_path, name, flag, guide):
    """`trapo tools --dataset_name` was "Did you mean --data_seed?", `trapo vlm --model_name_or_path` "Did you mean
    --teacher_model_name_or_path?", `--use_peft` "--use_cpu?" (trial 6, T11, T12, E04, E09): each does something
    else. The argument is named as the main job's, with where the user's own model and data go; on the command line
    and as a `--config` key."""
    module, _, _ = job(name)
    said = rf"{flag} is an argument of the main job \(`trapo train`, examples/trapo.py\), not of this one"
    with pytest.raises(ValueError, match=rf"^{flag}: unknown argument\. {said}") as e:
        module.parse_args([flag, "x"] if flag != "--use_peft" else [flag])
    assert guide in str(e.value) and "Did you mean" not in str(e.value) and "spell the argument" not in str(e.value)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"{flag[2:]}: x\n")
    with pytest.raises(ValueError, match=said) as e:
        module.parse_args(["--config", str(recipe)])
    assert guide in str(e.value) and "correct or remove it" not in str(e.value)


@pytest.mark.parametrize(
    "flag, fix",
    [
        (
            "--chat_template_path",
            "TRL SFTConfig's argument, which this job does not have. Fix: the chat template is "
            "the tokenizer's here: save the template with the tokenizer",
        ),
        (
            "--max_length",
            "TRL SFTConfig's argument, which this job does not have. Fix: the SFT row length is --sft_max_length",
        ),
        ("--epsilon_high", "TRL GRPOConfig's argument, which this job does not have. Fix: TRAPO clips the ratio"),
        # trial 9's CM04: "drop it", though a remote-code model loads with model_init_kwargs
        (
            "--trust_remote_code",
            "which this job does not have. Fix: the model loads with the keywords of --model_init_kwargs: "
            "`--model_init_kwargs '{\"trust_remote_code\": true}'`",
        ),
        (
            "--packing_strategy",
            "TRL SFTConfig's argument, which this job does not have. Fix: drop it; TRAPO has no field of that name",
        ),
    ],
)
def test_a_trl_argument_this_project_lacks_is_named_as_trls_with_what_to_use(tmp_path, flag, fix):
    """TRL's `--chat_template_path` was "Did you mean --chat_template_kwargs?", a different thing (trial 6, M01, M02);
    a TRL `SFTConfig` / `GRPOConfig` field the job lacks is named as TRL's, with the fix where there is one."""
    from trl_trapo.jobs.main import parse_args

    with pytest.raises(ValueError, match=rf"^{flag}: unknown argument\. {flag} is ") as e:
        parse_args([flag, "x", "--output_dir", "unused"])
    assert fix in str(e.value) and "Did you mean" not in str(e.value)


@pytest.mark.parametrize("name", sorted(JOBS))
def test_an_accelerate_config_given_as_the_recipe_says_where_it_goes(tmp_path, name):
    """`--config multi_gpu.yaml` (an accelerate config) was "unknown key 'compute_environment' ... correct or remove
    it", which would have the user strip it key by key (trial 6, T06)."""
    from pathlib import Path

    module, program, _ = job(name)
    path = Path(__file__).resolve().parent.parent / "examples" / "accelerate_configs" / "multi_gpu.yaml"
    with pytest.raises(ValueError, match="It is an accelerate config") as e:
        module.parse_args(["--config", str(path)])
    assert f"Fix: pass it as --config_file {path} (or --accelerate_config {path})" in str(e.value)
    assert f"accelerate launch --config_file {path} {program}" in str(e.value)
    assert "correct or remove it" not in str(e.value)


@pytest.mark.parametrize("name", sorted(JOBS))
def test_a_deepspeed_config_given_as_the_recipe_says_it_is_one_for_deepspeed(tmp_path, name):
    """`--config ds_stage2.json` (a DeepSpeed JSON) was "unknown key 'zero_optimization' ... Did you mean
    --self_imitation?" (trial 8, JC30)."""
    module, program, _ = job(name)
    path = tmp_path / "ds_stage2.json"
    path.write_text('{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}')
    with pytest.raises(ValueError, match="It is a DeepSpeed config") as e:
        module.parse_args(["--config", str(path)])
    assert f"Fix: pass it as --deepspeed {path}, under a launcher" in str(e.value)
    assert f"--deepspeed_config_file {path} {program}" in str(e.value)
    assert "Did you mean" not in str(e.value)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_recipe_file_given_without_config_asks_did_you_mean_config(tmp_path, suffix):
    """Trial 13's C06: `trapo train recipe.json` (transformers' example scripts read a lone `.json` of arguments) was
    "a value without an argument name. Fix: put `--<name>` before it.", naming no name although the value is an
    existing recipe. It is "did you mean `--config recipe.json`?" (not read as one: TRL's scripts take a recipe only
    with --config); a DeepSpeed JSON says where it goes instead; any other bare value keeps the general fix, in the
    main job and in the jobs that share its parsing."""
    from trl_trapo import cli

    recipe = tmp_path / f"recipe{suffix}"
    recipe.write_text('{"max_steps": 2, "learning_rate": 0.001}')
    for parse in (cli.parse_args, job("vision")[0].parse_args, job("agent")[0].parse_args):
        with pytest.raises(ValueError) as e:
            parse([str(recipe)])
        message = str(e.value)
        assert message.startswith(f"{str(recipe)!r}: a value without an argument name. Did you mean `--config "), (
            message
        )
        assert f"--config {recipe}`?" in message and "Fix: put --config before it." in message, message
    deepspeed = tmp_path / "ds.json"
    deepspeed.write_text('{"zero_optimization": {"stage": 2}}')
    with pytest.raises(ValueError, match=f"It is a DeepSpeed config .* Fix: pass it as --deepspeed {deepspeed}"):
        cli.parse_args([str(deepspeed)])
    for value in ("stray", str(tmp_path / "missing.json")):  # not an existing recipe file: the general fix
        with pytest.raises(ValueError, match=r"a value without an argument name\. Fix: put `--<name>` before it\.$"):
            cli.parse_args([value])


# ---- trial 7: launcher keys and nesting in a recipe, the mapping form of --curriculum_mixtures (Y01, Y02, Y05) ----


@pytest.mark.parametrize(
    "text, said",
    [
        # "unknown key 'num_processes': no argument has this name. Fix: correct or remove it" (Y01)
        (
            "num_processes: 2\n",
            "--num_processes is an option of the launcher (`accelerate launch`), not of the job. Fix: give it to "
            "`trapo` (--num_processes 2) or `accelerate launch --num_processes 2 examples/trapo.py ...`, or an "
            "accelerate config",
        ),
        ("mixed_precision: 'no'\n", "--mixed_precision is an option of the launcher (`accelerate launch`)"),
        (
            "dynamo_backend: inductor\n",
            "--dynamo_backend is an option of `accelerate launch` (the launcher), not of the job, and `trapo` does not "
            "pass it on. Fix: set it in an accelerate config",
        ),
        # "unknown key 'config' ... Did you mean --fsdp_config?" (Y02)
        ("config: other.yaml\n", "config: 'other.yaml': recipes do not include other recipes. Fix: copy the other"),
    ],
)
def test_a_recipe_key_of_the_launcher_or_another_recipe_says_where_it_goes(tmp_path, text, said):
    from trl_trapo.jobs.main import parse_args

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("max_steps: 2\n" + text)
    with pytest.raises(ValueError) as e:
        parse_args(["--config", str(recipe), "--output_dir", "unused"])
    assert said in str(e.value), str(e.value)
    assert "Did you mean" not in str(e.value) and "correct or remove it" not in str(e.value)


PHASES = [{"pretrain": 0.7, "sft": 0.2, "rl": 0.1}, {"pretrain": 0.3, "sft": 0.5, "rl": 0.2}, {"rl": 1.0}]


@pytest.mark.parametrize(
    "argv",
    [
        ["--curriculum_mixtures", json.dumps(PHASES)],  # docs/seams.md's form, as JSON: argparse's "invalid float"
        [f"--curriculum_mixtures={json.dumps(PHASES)}"],
        ["--curriculum-mixtures", *map(json.dumps, PHASES)],  # one object per phase
    ],
    ids=["json-list", "equals", "objects"],
)
def test_the_mapping_form_of_curriculum_mixtures_is_taken_on_the_command_line(argv):
    from trl_trapo.jobs.main import parse_args

    _, config, _ = parse_args([*argv, "--output_dir", "unused"])
    assert config.curriculum_mixtures == PHASES


def test_the_mapping_form_of_curriculum_mixtures_is_taken_in_a_recipe(tmp_path):
    """The recipe check refused a mapping ("has the item {...}, which is dict; a number is needed"), though the
    config takes it."""
    from trl_trapo.jobs.main import parse_args

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"curriculum_mixtures": PHASES}))
    _, config, _ = parse_args(["--config", str(recipe), "--output_dir", "unused"])
    assert config.curriculum_mixtures == PHASES


def test_curriculum_mixtures_as_one_triple_per_phase_is_taken(tmp_path):
    """Trial 12's N13: `[(0.7, 0.2, 0.1), (0.3, 0.5, 0.2), (0.1, 0.3, 0.6)]` — "one (pretrain, sft, rl) triple per
    phase", as the docs word it — was refused as "3 phases need 9 numbers"; it is taken as the flat form (a new list:
    the user's is not altered). A recipe's and the command line's JSON list of lists too."""
    from trl_trapo import TRAPOConfig
    from trl_trapo.jobs.main import parse_args

    triples = [(0.7, 0.2, 0.1), (0.3, 0.5, 0.2), (0.1, 0.3, 0.6)]
    flat = [0.7, 0.2, 0.1, 0.3, 0.5, 0.2, 0.1, 0.3, 0.6]
    assert TRAPOConfig(output_dir=str(tmp_path), curriculum_mixtures=triples).curriculum_mixtures == flat
    assert triples == [(0.7, 0.2, 0.1), (0.3, 0.5, 0.2), (0.1, 0.3, 0.6)]
    nested = json.dumps([list(t) for t in triples])
    assert parse_args(["--curriculum_mixtures", nested, "--output_dir", "u"])[1].curriculum_mixtures == flat
    with pytest.raises(ValueError, match=r"phase 1 \[0\.3, 0\.5, 0\.5\] must be finite, >= 0 and sum to 1"):
        TRAPOConfig(output_dir=str(tmp_path), curriculum_mixtures=[(0.7, 0.2, 0.1), (0.3, 0.5, 0.5), (0, 0, 1)])


def test_the_number_form_of_curriculum_mixtures_still_reads_numbers_and_says_both_forms(capsys):
    from trl_trapo.jobs.main import parse_args

    flat = [0.6, 0.2, 0.2, 0.3, 0.4, 0.3, 0.1, 0.3, 0.6]
    assert parse_args(["--curriculum_mixtures", *map(str, flat), "--output_dir", "u"])[1].curriculum_mixtures == flat
    assert parse_args(["--curriculum_mixtures", json.dumps(flat), "--output_dir", "u"])[1].curriculum_mixtures == flat
    with pytest.raises(SystemExit):
        parse_args(["--curriculum_mixtures", "[{rl: 1}]", "--output_dir", "unused"])
    err = capsys.readouterr().err
    assert "argument --curriculum_mixtures" in err and "'[{rl: 1}]' is not a number, and not JSON" in err
    assert "give 3 numbers (pretrain sft rl) per phase" in err and "one JSON object objective -> share" in err
    with pytest.raises(ValueError, match=r"curriculum_mixtures.*give one mapping per phase: 3 phases need 3"):
        parse_args(["--curriculum_mixtures", '[{"rl": 1.0}]', "--output_dir", "unused"])  # the trial's Y05 value


def test_a_phase_count_mismatch_names_the_field_set_both_counts_and_the_fix(tmp_path):
    """Trial 16's N04: `curriculum_boundaries=[]` alone (one constant phase) was refused as an invalid
    `curriculum_mixtures` — a field the user left at its default — and never named `curriculum_boundaries=[]` as what
    made it "1 phases". The message now blames the field the user set, says how many phases the boundaries make and
    how many the mixtures have (a default shown with its value), and gives both fixes."""
    from trl_trapo import TRAPOConfig

    def refusal(**fields) -> str:
        with pytest.raises(ValueError) as raised:
            TRAPOConfig(output_dir=str(tmp_path), **fields)
        return str(raised.value)

    default = "curriculum_mixtures=[0.7, 0.2, 0.1, 0.3, 0.5, 0.2, 0.1, 0.3, 0.6], left at its default, has 3 phases"
    message = refusal(curriculum_boundaries=[])  # the trial's case: the boundaries set, the mixtures default
    assert message.startswith("TRAPOConfig.curriculum_boundaries=[] is invalid: curriculum_boundaries=[] makes 1 "), (
        message
    )
    assert default in message and "1 phase needs 3, curriculum_mixtures=[p, s, r]" in message, message
    assert "one mapping objective -> share per phase" in message and "curriculum_boundaries=[0.2, 0.8]" in message
    message = refusal(curriculum_mixtures=[0.5, 0.3, 0.2])  # the mixtures set (one phase), the boundaries default
    assert message.startswith("TRAPOConfig.curriculum_mixtures=[0.5, 0.3, 0.2] is invalid: "), message
    assert "curriculum_boundaries=[0.2, 0.8], left at its default, makes 3 phases" in message, message
    assert (
        "curriculum_mixtures has 1 phase" in message and "Fix: give curriculum_boundaries=[] (no boundary" in message
    )
    assert "3 phases need 9, curriculum_mixtures=[p1, s1, r1, p2, s2, r2, p3, s3, r3]" in message, message
    message = refusal(curriculum_boundaries=[0.5], curriculum_mixtures=[0.5, 0.3, 0.2] * 3)  # both set, 2 vs 3
    assert message.startswith("TRAPOConfig.curriculum_mixtures=") and "left at its default" not in message, message
    assert "curriculum_boundaries=[0.5] makes 2 phases" in message and "curriculum_mixtures has 3 phases" in message
    assert "give curriculum_boundaries=[0.2, 0.8] (2 boundaries: 3 phases)" in message and "2 phases need 6" in message
    message = refusal(curriculum_boundaries=[0.5], curriculum_mixtures=[{"rl": 1.0}])  # the mapping form
    assert "has 1 phase (1 mapping" in message and "give one mapping per phase: 2 phases need 2" in message, message
    message = refusal(curriculum_boundaries=[], curriculum_mixtures=[0.5, 0.3, 0.2, 0.5])
    assert "has 4 numbers, not a whole number of (pretrain, sft, rl) triples" in message, message
    assert TRAPOConfig(output_dir=str(tmp_path), curriculum_boundaries=[], curriculum_mixtures=[0.3, 0.4, 0.3])


def test_a_phase_count_mismatch_names_flags_and_one_phase_is_a_flag(tmp_path):
    """The same refusals on the command line, in flags; and `--curriculum_boundaries '[]'`, the one-phase fix they
    give, is a value the flag takes (argparse asked one value at least, so only a recipe could say no boundary)."""
    from trl_trapo.jobs.main import parse_args

    out = ["--output_dir", str(tmp_path)]
    with pytest.raises(ValueError) as raised:
        parse_args(["--curriculum_mixtures", "0.5", "0.3", "0.2", *out])
    message = str(raised.value)
    assert message.startswith("--curriculum_mixtures=[0.5, 0.3, 0.2] is invalid: --curriculum_boundaries 0.2 0.8, "), (
        message
    )
    assert "Fix: give --curriculum_boundaries '[]' (no boundary: 1 phase)" in message, message
    assert "--curriculum_mixtures p1 s1 r1 p2 s2 r2 p3 s3 r3" in message and "TRAPOConfig" not in message, message
    recipe = tmp_path / "one_phase.yaml"
    recipe.write_text("curriculum_boundaries: []\n")
    with pytest.raises(ValueError) as raised:
        parse_args(["--config", str(recipe), *out])
    message = str(raised.value)
    assert "--curriculum_boundaries '[]' makes 1 phase" in message and "--curriculum_mixtures p s r" in message, (
        message
    )
    assert "--curriculum_mixtures 0.7 0.2 0.1 0.3 0.5 0.2 0.1 0.3 0.6, left at its default, has 3 phases" in message
    for argv in (["--curriculum_boundaries", "[]"], ["--curriculum_boundaries=[]"]):
        config = parse_args([*argv, "--curriculum_mixtures", "0.3", "0.4", "0.3", *out])[1]
        assert config.curriculum_boundaries == [] and config.curriculum_mixtures == [0.3, 0.4, 0.3], argv
    two_phases = ["--curriculum_mixtures", *["0.5", "0.3", "0.2"] * 2, *out]
    assert parse_args(["--curriculum_boundaries", "[0.5]", *two_phases])[1].curriculum_boundaries == [0.5]
    assert parse_args(["--curriculum_boundaries", "0.3", "0.6", *out])[1].curriculum_boundaries == [0.3, 0.6]


def test_config_given_twice_says_one_recipe_per_run(tmp_path):
    """The second `--config` was "--config: unknown argument. Did you mean --fsdp_config?" (a sibling of Y02)."""
    from trl_trapo.jobs.main import parse_args

    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("max_steps: 2\n")
    second.write_text("seed: 3\n")
    with pytest.raises(ValueError) as e:
        parse_args(["--config", str(first), f"--config={second}", "--output_dir", "unused"])
    assert str(e.value).startswith(f"--config is given 2 times ({str(first)!r}, {str(second)!r}): a run reads one")
    assert "Did you mean" not in str(e.value)
