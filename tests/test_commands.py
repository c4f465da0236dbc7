"""The `trapo` command (trl_trapo/jobs/commands.py): its sub-commands, that `trapo train` is `examples/trapo.py`'s job, and
the `accelerate launch` command it builds for launcher options."""

from __future__ import annotations

import importlib
import json
import logging
import re
import runpy
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from conftest import run_script

from trl_trapo.jobs import commands


ROOT = Path(__file__).resolve().parent.parent
RECIPE = str(ROOT / "examples" / "recipes" / "gsm8k_smollm2_135m_cpu.yaml")  # a training recipe
TIMING = (
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "eps",
    "eval_runtime",
    "eval_samples_per_second",
    "eval_steps_per_second",
    "step_time",
)


def test_the_entry_point_is_the_command():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # no tomllib on Python 3.10
    target = re.search(r'^\[project\.scripts\]\n(?:#.*\n)*trapo = "([^"]+)"$', pyproject, re.M).group(1)
    assert EntryPoint("trapo", target, "console_scripts").load() is commands.main


def test_trapo_help_lists_the_sub_commands(capsys):
    with pytest.raises(SystemExit) as exit_:
        commands.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for job in ("train", "vlm", "tools"):
        assert f"    {job} " in out, out
    assert commands.main([]) == 0  # `trapo` alone: the same help, as `trl` alone
    assert "{train,vlm,tools}" in capsys.readouterr().out


@pytest.mark.parametrize("job", commands.JOBS, ids=lambda j: j.name)
def test_each_sub_command_has_its_jobs_help(job, capsys):
    with pytest.raises(SystemExit) as exit_:
        commands.main([job.name, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: trapo {job.name} [--config RECIPE.yaml]"), out[:200]
    assert "--learning_rate" in out and "--output_dir" in out  # the job's own parser: every TRAPOConfig field


@pytest.mark.parametrize("command", ["grpo", "sft"])
def test_trls_sub_commands_point_at_trapo_train(command, capsys):
    assert commands.main([command, "--dataset_name", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: trapo "), err
    assert f"invalid choice: '{command}'" in err and "are both `trapo train` here" in err, err
    assert "RL prompts: --dataset_name; SFT rows: --sft_dataset_name" in err, err
    with pytest.raises(SystemExit) as exit_:  # any other unknown command: argparse's refusal as it was
        commands.main(["dpo"])
    assert exit_.value.code == 2 and "trapo train" not in capsys.readouterr().err


def test_a_job_error_names_the_sub_command(capsys):
    assert commands.main(["tools", "--learning_rat", "1e-3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trapo tools: error: --learning_rat: unknown argument. Did you mean --learning_rate?"), err


GRPO_ONLY = {  # a TRL GRPO recipe's keys this job lacks -> a word of each one's own fix
    "epsilon_high": "drop epsilon_high, or set epsilon",
    "log_completions": "TRAPO logs no per-step completion table",
    "steps_per_generation": "set num_mini_batches",
}


@pytest.mark.parametrize("job", commands.JOBS, ids=lambda j: j.name)
def test_every_unknown_key_of_a_recipe_is_named_in_one_run(job, capsys, tmp_path):
    """Trial 12's C08: a TRL GRPO recipe reused with `trapo train` has three keys the job lacks; only the first was
    refused, so the user needed three runs to learn them. Now one message names each, with its own fix (and a bad
    value of a known key beside them)."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "max_steps: 2\nbeta: 0.0\nepsilon_high: 0.28\nlog_completions: true\nsteps_per_generation: 4\n"
        "learning_rate: [0.001]\n"
    )
    assert commands.main([job.name, "--config", str(recipe), "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trapo {job.name}: error: --config='{recipe}': 4 keys are refused, each with its fix:\n")
    lines = err.splitlines()
    for key, fix in GRPO_ONLY.items():
        line = next((x for x in lines if x.startswith(f"- unknown key '{key}': ")), None)
        assert line is not None and fix in line, (key, err)
    assert any(x.startswith("- learning_rate: [0.001] is list") for x in lines), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("job", commands.JOBS, ids=lambda j: j.name)
def test_every_unknown_flag_is_named_in_one_run(job, capsys, tmp_path):
    """C08's sibling on the command line: `--epsilon_high 0.28 --log_completions true --max_step 3` was refused at
    its first flag only. Now each is named with its own fix; a flag's value is not taken for another argument."""
    argv = ["--epsilon_high", "0.28", "--log_completions", "true", "--max_step", "3", "--output_dir", "unused"]
    assert commands.main([job.name, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trapo {job.name}: error: 3 arguments are refused, each with its fix:\n"), err
    lines = [x for x in err.splitlines() if x.startswith("- ")]
    assert [x.split(":")[0] for x in lines] == ["- --epsilon_high", "- --log_completions", "- --max_step"], err
    assert GRPO_ONLY["epsilon_high"] in lines[0] and GRPO_ONLY["log_completions"] in lines[1], err
    assert "Did you mean --max_steps?" in lines[2] and f"`trapo {job.name} --help` lists" in lines[2], err


@pytest.mark.parametrize("job", commands.JOBS, ids=lambda j: j.name)
def test_argparse_errors_and_fixes_name_the_command_typed(job, capsys, tmp_path):
    """Trial 11's C03: under `trapo train` argparse's usage line said `usage: examples/trapo.py`, its error prefix was
    the file name of whatever started Python (`trapo:`, `commands.py:`), and the unknown-argument fix said `python
    examples/trapo.py --help`: each now names the command the user typed, for every sub-command."""
    command = f"trapo {job.name}"
    with pytest.raises(SystemExit) as exit_:
        commands.main([job.name, "--max_steps="])  # argparse's own error: an int option with an empty value
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: {command} [--config RECIPE.yaml]" in err and f"\n{command}: error: argument --max_steps" in err, (
        err
    )
    assert commands.main([job.name, "--max_stepz", "2"]) == 2
    err = capsys.readouterr().err
    assert f"{command}: error: --max_stepz: unknown argument." in err and f"(`{command} --help` lists" in err, err
    assert "python " not in err, err
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("max_stepz: 2\n")
    assert commands.main([job.name, "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'max_stepz'" in err and f"(`{command} --help` lists" in err, err


def test_trapo_train_runs_the_same_job_as_the_example(tmp_path, monkeypatch):
    """Two steps of the built-in job, once as `python examples/trapo.py` and once as `trapo train`, in this process:
    the same `trainer_state.json` log, key for key and value for value (wall-clock keys aside)."""
    args = ["--max_steps", "2", "--logging_steps", "1", "--max_eval_samples", "8", "--torch_threads", "1"]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert (
        run_script(ROOT / "examples" / "trapo.py", [*args, "--output_dir", str(tmp_path / "example")], monkeypatch)
        == 0
    )
    assert commands.main(["train", *args, "--output_dir", str(tmp_path / "command")]) == 0

    def history(folder: str) -> list[dict]:
        log = json.loads((tmp_path / folder / "trainer_state.json").read_text())["log_history"]
        return [{k: v for k, v in entry.items() if k not in TIMING} for entry in log]

    example, command = history("example"), history("command")
    assert sum("loss" in entry for entry in example) == 2
    assert command == example
    assert (
        json.loads((tmp_path / "command" / "eval_results.json").read_text()).keys()
        == json.loads((tmp_path / "example" / "eval_results.json").read_text()).keys()
    )


def launched(argv: list[str]):
    """The `accelerate launch` namespace `trapo <argv>` hands the launcher (nothing is started)."""
    calls = []
    assert commands.main(argv, launch=calls.append) == 0
    (namespace,) = calls
    return namespace


@pytest.fixture
def two_gpus(monkeypatch):
    """A machine with 2 GPUs visible, where accelerate starts `--num_processes 2` without `--multi_gpu` (it turns it on
    itself); on a machine without one `trapo` refuses that launch (`test_several_processes_without_a_gpu_...`)."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_num_processes_launches_the_job_module_through_accelerate(two_gpus):
    namespace = launched(["train", "--num_processes", "2", "--max_steps", "2", "--learning_rate=1e-3", "--seed", "3"])
    assert namespace.num_processes == 2
    assert namespace.module is True and namespace.training_script == "trl_trapo.jobs.commands"
    # every process runs `python -m trl_trapo.jobs.commands train <the job's arguments>`, in their order
    assert namespace.training_script_args == ["train", "--max_steps", "2", "--learning_rate=1e-3", "--seed", "3"]
    assert namespace.config_file is None and namespace.multi_gpu is False
    flag = launched(["train", "--multi_gpu", "--num_processes=2", "--seed", "3"])
    assert flag.multi_gpu is True and flag.num_processes == 2 and flag.training_script_args == ["train", "--seed", "3"]


def test_python_m_launches_the_module_by_its_import_name(monkeypatch):
    """`python -m trl_trapo.jobs.commands train --num_processes 1` (the module run as `__main__`) launched
    `--module __main__`, which the launched process cannot find (trial 5, c27)."""
    import accelerate.commands.launch

    calls = []
    monkeypatch.setattr(accelerate.commands.launch, "launch_command", calls.append)
    monkeypatch.setattr(sys, "argv", ["commands.py", "train", "--max_steps", "2", "--num_processes", "1"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("trl_trapo.jobs.commands", run_name="__main__")
    assert exited.value.code == 0
    (namespace,) = calls
    assert namespace.module is True and namespace.training_script == "trl_trapo.jobs.commands"


def test_accelerate_config_is_resolved_as_trl_does():
    by_name = launched(["vlm", "--accelerate_config", "multi_gpu", "--max_steps", "1"])
    assert Path(by_name.config_file).parts[-2:] == ("accelerate_configs", "multi_gpu.yaml")
    assert "trl" in Path(by_name.config_file).parts  # one TRL ships
    path = ROOT / "examples" / "accelerate_configs" / "multi_gpu.yaml"
    by_path = launched(
        ["tools", f"--accelerate_config={path}", "--num_processes", "2", "--main_process_port", "29600"]
    )
    assert by_path.config_file == str(path) and by_path.num_processes == 2 and by_path.main_process_port == 29600
    assert by_path.training_script_args == ["tools"]


def test_bad_launcher_options_are_one_error(capsys):
    assert commands.main(["train", "--accelerate_config", "no_such_config"], launch=pytest.fail) == 2
    assert "trapo train: error: Accelerate config no_such_config is neither a file" in capsys.readouterr().err
    assert commands.main(["train", "--max_steps", "2", "--num_processes"], launch=pytest.fail) == 2
    assert "--num_processes needs a value" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--config_file", "nope.yaml"], "--config_file='nope.yaml': no such file. Fix: give an accelerate config"),
        (["--config_file", "."], "--config_file='.': a directory. Fix:"),
        (["--num_processes", "0"], "--num_processes=0: use an integer >= 1"),
        (["--num_machines", "0"], "--num_machines=0: use an integer >= 1"),
        (["--machine_rank", "-1"], "--machine_rank=-1: use an integer >= 0"),
        (["--main_process_port", "99999"], "--main_process_port=99999: use an integer in 0-65535"),
        (["--main_process_port", "-1"], "--main_process_port=-1: use an integer >= 0"),
        (
            ["--num_machines", "2", "--main_process_ip", "10.0.0.1", "--main_process_port", "0"],
            "--main_process_port=0: 0 asks accelerate for a free port, which each of the 2 machines would pick",
        ),
        # trial 6: accelerate's AssertionError / ValueError tracebacks (T03, T05), or accepted unread (T02, T09, T10)
        (["--num_machines", "2"], "--num_machines=2 needs --main_process_ip (the address of machine 0)"),
        (
            ["--config_file", RECIPE],
            f"--config_file={RECIPE!r} is not an accelerate config accelerate can read (ValueError: A "
            "`distributed_type` must be specified in the config file.). It has no `distributed_type`: it looks like a "
            "training recipe",
        ),
        (["--gpu_ids", "abc"], "--gpu_ids='abc': give GPU indices separated by commas (e.g. 0,1), or all."),
        (["--gpu_ids", "0,x"], "--gpu_ids='0,x': give GPU indices"),
        (["--machine_rank", "1"], "--machine_rank=1: must be < --num_machines (1)"),
        (
            ["--num_machines", "2", "--main_process_ip", "10.0.0.1", "--machine_rank", "2"],
            "--machine_rank=2: must be < --num_machines (2)",
        ),
        (["--main_process_ip", "999.1.1.1"], "--main_process_ip='999.1.1.1' is neither an IP address nor a host name"),
        (["--main_process_ip", "http://10.0.0.1"], "--main_process_ip='http://10.0.0.1' is neither"),
    ],
)
def test_launcher_options_accelerate_would_fail_on_late_are_one_error(argv, message, capsys):
    # `--config_file nope.yaml` was a traceback from inside `accelerate launch`; `--num_processes 0` ran one process
    assert commands.main(["tools", "--max_steps", "2", *argv], launch=pytest.fail) == 2
    assert f"trapo tools: error: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--main_process_port", "0"],  # accelerate picks a free port (`get_free_port`); was refused (trial 7, P08)
        [
            "--num_machines",
            "2",
            "--main_process_ip",
            "10.0.0.1",
            "--main_process_port",
            "29500",
            "--machine_rank",
            "1",
        ],
        ["--main_process_ip", "node0.cluster"],
        ["--main_process_ip", "::1"],
        ["--gpu_ids", "0,1"],
        ["--gpu_ids", "all"],
        ["--accelerate_config", "multi_gpu", "--machine_rank", "0"],
    ],
)
def test_launcher_options_accelerate_takes_still_launch(argv):
    assert launched(["train", *argv]).training_script_args == ["train"]


def test_launcher_options_take_accelerates_hyphenated_spelling(two_gpus):
    """accelerate's parser takes `--num-processes` for `--num_processes`; `trapo` handed it to the job, which refused
    it."""
    namespace = launched(["train", "--num-processes", "2", "--main-process-port=29601", "--seed", "3"])
    assert namespace.num_processes == 2 and namespace.main_process_port == 29601
    assert namespace.training_script_args == ["train", "--seed", "3"]


def write_config(tmp_path, text: str) -> str:
    path = tmp_path / "accelerate.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nuse_cpu: true\n" + text)
    return str(path)


@pytest.mark.parametrize(
    "text, message",
    [
        # trial 7, P06: "`accelerate launch` refused the launch: '>=' not supported between instances of 'str' and
        # 'int'" -- no key, value or fix
        (
            "num_processes: two\n",
            "num_processes: 'two' is not a whole number, and `accelerate launch` reads it as its --num_processes. "
            "Fix: write a whole number in digits, without quotes (e.g. `num_processes: 2`)",
        ),
        ("main_process_port: '29500'\n", "main_process_port: '29500' is not a whole number, and `accelerate launch`"),
        ("deepspeed_config:\n  zero_stage: three\n", "deepspeed_config.zero_stage: 'three' is not a whole number"),
        # checked as the command line's value is: a config's 0 ran one process, a port above 65535 failed late
        ("num_processes: 0\n", "num_processes: 0: use an integer >= 1, or leave it out."),
        ("main_process_port: 99999\n", "main_process_port: 99999: use an integer in 0-65535"),
    ],
)
def test_an_accelerate_configs_values_are_checked_as_the_options_are(tmp_path, text, message, capsys):
    path = write_config(tmp_path, text)
    assert commands.main(["train", "--config_file", path], launch=pytest.fail) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trapo train: error: --config_file={path!r}: {message}"), err


def test_a_tpu_config_without_torch_xla_is_refused_before_the_launch(tmp_path, monkeypatch, capsys):
    """Trial 10's CX02: an accelerate config with `distributed_type: XLA` (copied from a TPU setup) reached
    accelerate's `tpu_launcher`, whose `import torch_xla` failed as a traceback."""
    monkeypatch.setattr("accelerate.utils.is_torch_xla_available", lambda *a, **k: False)
    path = tmp_path / "xla.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: XLA\nmixed_precision: 'no'\nnum_processes: 1\n"
    )
    assert commands.main(["train", "--config_file", str(path)], launch=pytest.fail) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"trapo train: error: --config_file={str(path)!r}: distributed_type: XLA launches through torch_xla, which is "
        "not installed here. Fix:"
    ), err


DEEPSPEED = "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nuse_cpu: true\nnum_processes: 1\n"


@pytest.mark.parametrize(
    "text, key",
    [
        # trial 9's CL08: accelerate's "Expected a string path to an existing deepspeed config" after a 20 s launch
        (
            DEEPSPEED + "deepspeed_config:\n  deepspeed_config_file: {missing}\n",
            "deepspeed_config.deepspeed_config_file",
        ),
        (
            DEEPSPEED + "deepspeed_config:\n  deepspeed_config_file: nope_ds.json\n",
            "deepspeed_config.deepspeed_config_file",
        ),
        (
            "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n"
            "mpirun_config:\n  mpirun_hostfile: {missing}\n",
            "mpirun_config.mpirun_hostfile",
        ),
    ],
    ids=["deepspeed_config_file", "relative", "mpirun_hostfile"],
)
def test_a_file_an_accelerate_config_names_is_checked_before_the_launch(tmp_path, monkeypatch, text, key, capsys):
    monkeypatch.chdir(tmp_path)  # a relative path is read from the current directory, as the processes read it
    missing = str(tmp_path / "nope.json")
    path = tmp_path / "accelerate.yaml"
    path.write_text(text.format(missing=missing))
    assert commands.main(["train", "--config_file", str(path)], launch=pytest.fail) == 2
    err = capsys.readouterr().err
    assert f"error: --config_file={str(path)!r}: {key}: " in err and ": no such file" in err, err
    assert "Fix: give the path of an existing file" in err
    assert ("relative path is read from the current directory" in err) == ("nope_ds" in text), err


def test_an_existing_or_inline_deepspeed_config_file_launches(tmp_path):
    (tmp_path / "ds.json").write_text('{"train_micro_batch_size_per_gpu": "auto"}')
    for value in [str(tmp_path / "ds.json"), "'{\"train_micro_batch_size_per_gpu\": 1}'"]:
        path = tmp_path / "accelerate.yaml"
        path.write_text(DEEPSPEED + f"deepspeed_config:\n  deepspeed_config_file: {value}\n")
        assert launched(["train", "--config_file", str(path)]).config_file == str(path)


@pytest.mark.parametrize(
    "argv, gpus, said",
    [
        # trial 9's CM16: launched and trained on the CPU without a word
        (["--gpu_ids", "0"], 0, "--gpu_ids=0 is set, but no GPU is visible here (torch.cuda.device_count() is 0), so"),
        (["--gpu_ids", "0"], 1, None),
        # trial 9's CD07: TRL's multi_gpu config (num_processes: 8) started 8 gloo processes on 2 cores
        (
            ["--accelerate_config", "multi_gpu"],
            0,
            "num_processes: 8 starts 8 processes, and this machine has no GPU visible and 2 CPU core(s): the 8 "
            "processes share the cores, each far slower than one (a config written for 8 GPUs?). Fix: --num_processes "
            "2 (or fewer).",
        ),
        (["--accelerate_config", "multi_gpu"], 4, "has 4 GPU(s) visible: processes would share a GPU or find none. "),
        (["--accelerate_config", "multi_gpu", "--num_processes", "2"], 0, None),
        (["--num_processes", "2"], 2, None),
    ],
)
def test_a_launch_asking_for_hardware_this_machine_lacks_is_warned_about(argv, gpus, said, monkeypatch, caplog):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(commands.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    with caplog.at_level(logging.WARNING, logger=commands.__name__):
        launched(["train", *argv])  # it runs: a warning, not a refusal
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if said is None:
        assert warnings == [], warnings
    else:
        assert len(warnings) == 1 and said in warnings[0], warnings


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["--num_processes", "2"],
            "Fix: `trapo train --multi_gpu --num_processes 2 ...`, or leave --num_processes out",
        ),
        # the >cores warning used to suggest `--num_processes 2`, which then failed the same way (trial 11's C17)
        (["--num-processes", "3"], "`trapo train --multi_gpu --num_processes 2 ...` (this machine has 2 CPU core(s)"),
    ],
)
def test_several_processes_without_a_gpu_or_multi_gpu_are_refused_before_the_launch(
    argv, said, monkeypatch, capsys, caplog
):
    """Without a GPU and without `--multi_gpu` (or an accelerate config), accelerate starts one process for
    `--num_processes 2`, and the job refused to run alone ~21 s later, naming `accelerate launch ... examples/trapo.py`
    rather than the command typed (trial 11's C17): `trapo` refuses it before the launch, in the command typed."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(commands.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(commands, "config_file_of", lambda namespace: namespace.config_file)  # no default config
    with caplog.at_level(logging.WARNING, logger=commands.__name__):
        assert commands.main(["train", *argv, "--max_steps", "2"], launch=pytest.fail) == 2
    err = capsys.readouterr().err
    assert err.startswith("trapo train: error: --num_processes=") and "this machine has no GPU visible" in err, err
    assert said in err, err
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # one message, not the warning as well
    # with --multi_gpu it launches (DDP over gloo on the CPU), and so it does with a config that decides
    assert launched(["train", "--multi_gpu", "--num_processes", "2"]).multi_gpu is True
    assert launched(["train", "--accelerate_config", "multi_gpu", "--num_processes", "2"]).num_processes == 2


def test_an_accelerate_configs_value_gives_way_to_the_option(tmp_path):
    """accelerate reads the command line's option first, so a config value it overrides is not checked."""
    path = write_config(tmp_path, "num_processes: 0\nmain_process_port: 29500\n")
    namespace = launched(["train", "--config_file", path, "--num_processes", "2"])
    assert namespace.num_processes == 2 and namespace.config_file == path


def test_an_empty_accelerate_config_is_named_as_empty(tmp_path, capsys):
    """An empty file got accelerate's "AttributeError: 'NoneType' object has no attribute 'get'" (trial 7, P02)."""
    path = tmp_path / "accelerate.yaml"
    path.write_text("# written later\n")
    assert commands.main(["train", "--config_file", str(path)], launch=pytest.fail) == 2
    err = capsys.readouterr().err
    assert f"--config_file={str(path)!r} is empty (or holds only comments)" in err
    assert f"`accelerate config --config_file {path}`" in err and "NoneType" not in err


@pytest.mark.parametrize("launch", [True, False], ids=["launched", "here"])
def test_an_accelerate_launch_option_trapo_does_not_pass_is_named(launch, capsys):
    """`--dynamo_backend` was "unknown argument. Did you mean --ddp_backend?", another thing (trial 7, P08). Before a
    launch the command refuses it; run here, the job's parser does."""
    argv = ["train", "--max_steps", "2", "--dynamo_backend", "inductor"] + (["--num_processes", "2"] if launch else [])
    assert commands.main(argv, launch=pytest.fail) == 2
    err = capsys.readouterr().err
    assert (
        "trapo train: error: --dynamo_backend: unknown argument. --dynamo_backend is an option of `accelerate " in err
    )
    assert "and `trapo` does not pass it on. Fix: set it in an accelerate config" in err
    assert "`accelerate launch --dynamo_backend inductor examples/trapo.py ...`" in err
    assert "Did you mean" not in err


def test_an_accelerate_launch_option_that_is_also_the_jobs_stays_the_jobs(two_gpus):
    # accelerate's DeepSpeed `--gradient_accumulation_steps` and `--debug` are TrainingArguments fields too
    argv = ["train", "--num_processes", "2", "--gradient_accumulation_steps", "2", "--debug", "underflow_overflow"]
    assert launched(argv).training_script_args == ["train", *argv[3:]]


def test_the_options_said_to_be_accelerates_are_read_from_its_parser():
    from trl_trapo.jobs.launcher import accelerate_launch_options, launcher_option_hint

    options = accelerate_launch_options()
    assert {"num_processes", "dynamo_backend", "zero_stage", "fsdp_version"} <= set(options)
    assert options["num_processes"].type is int and options["multi_gpu"].nargs == 0
    assert launcher_option_hint("--num-processes", 2).startswith(" --num_processes is an option of the launcher")
    assert "`trapo` (--multi_gpu)" in launcher_option_hint("multi_gpu")  # takes no value
    assert launcher_option_hint("learning_rate") == ""


def test_fp8_without_its_libraries_is_one_error(capsys):
    from accelerate.utils import is_fp8_available

    if is_fp8_available():
        pytest.skip("Transformer Engine or torchao is installed: accelerate can run fp8 here")
    assert commands.main(["train", "--mixed_precision", "fp8"], launch=pytest.fail) == 2  # T04: RuntimeError
    assert "trapo train: error: --mixed_precision=fp8 needs Transformer Engine or torchao" in capsys.readouterr().err


@pytest.mark.parametrize(
    "error",
    [AssertionError("When using multiple machines, ..."), RuntimeError("FP8 is not available"), ValueError("x")],
)
def test_what_accelerate_launch_refuses_is_one_error(error, capsys):
    """A check of `accelerate launch` that `check_launch_namespace` does not repeat was a traceback through
    `commands.main` (trial 6, T03-T05): it is the command's error, exit status 2."""

    def launch(namespace):
        raise error

    assert commands.main(["train", "--num_processes", "1"], launch=launch) == 2
    assert capsys.readouterr().err == f"trapo train: error: `accelerate launch` refused the launch: {error}\n"


def test_a_failed_process_of_a_multi_process_launch_is_its_exit_status(capsys):
    """torch's `ChildFailedError` (traceback and failure table under the job's own message, trial 6 T13) becomes the
    failed process's exit status, as `CalledProcessError` does for one process."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    def launch(namespace):
        failure = ProcessFailure(local_rank=1, pid=123, exitcode=2, error_file="")
        raise ChildFailedError("trl_trapo.jobs.commands", {1: failure})

    assert commands.main(["train", "--multi_gpu", "--num_processes", "2"], launch=launch) == 2
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "argv, fix",
    [
        (["--max_steps", "2", "train"], "Fix: write `trapo train --max_steps 2`."),
        (["--num_processes", "2", "tools", "--seed", "1"], "Fix: write `trapo tools --num_processes 2 --seed 1`."),
        (["--max_steps", "2"], "Fix: write the command first: `trapo {train,vlm,tools} --max_steps 2`."),
    ],
)
def test_an_argument_before_the_command_is_an_error(argv, fix, capsys):
    """`trapo --max_steps 2 train` printed the help and exited 0: nothing trained, and a script saw success (T07)."""
    assert commands.main(argv, launch=pytest.fail) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trapo: error: {argv[0]} comes before the command;") and fix in err, err


def test_trapo_version_prints_the_version(capsys):
    """CL10: `trapo --version` was "an argument before the command" whose fix (`trapo train --version`) was refused."""
    import trl_trapo

    with pytest.raises(SystemExit) as exited:
        commands.main(["--version"], launch=pytest.fail)
    assert exited.value.code == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == f"trapo {trl_trapo.__version__}" and captured.err == "", captured


@pytest.mark.parametrize("job", commands.JOBS, ids=lambda j: j.name)
def test_launcher_options_are_accelerates_and_no_jobs(job):
    from accelerate.commands.launch import launch_command_parser

    from trl_trapo.jobs.main import known_fields

    fields = known_fields(importlib.import_module(job.module).make_parser().dataclass_types)
    actions = {o: a for a in launch_command_parser()._actions for o in a.option_strings}
    for option, takes_value in commands.LAUNCH_OPTIONS.items():
        assert option == commands.ACCELERATE_CONFIG or (actions[option].nargs != 0) == takes_value, option
        assert option[2:] not in fields, option  # it would take the job's argument away from it


@pytest.mark.slow
@pytest.mark.distributed
def test_trapo_train_on_two_processes(tmp_path, monkeypatch):
    """A real launch: `trapo train --multi_gpu --num_processes 2` (on CPU: DDP over gloo) trains and writes the job's
    outputs once; a user error in the processes is the command's exit status."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(sys, "argv", ["trapo"])
    launch = ["--multi_gpu", "--num_processes", "2", "--mixed_precision", "no"]
    job = ["--max_steps", "2", "--max_eval_samples", "8", "--torch_threads", "1", "--output_dir", str(tmp_path)]
    assert commands.main(["train", *launch, *job]) == 0
    assert (tmp_path / "trainer_state.json").exists() and (tmp_path / "eval_results.json").exists()
    # without --multi_gpu accelerate would start one process: refused before the launch
    assert commands.main(["train", "--num_processes", "2", *job]) == 2


# ---- the jobs' `--log_level` sets TRAPO's own logger from the start (trial 15's C11) ---------------------------------
def test_log_level_sets_the_jobs_own_lines_from_the_first_one(tmp_path):
    """`trapo train --log_level warning` still printed the job's INFO lines (`INFO trl_trapo.jobs.main: Built-in mode
    ...`, logged before the trainer applied the level), and `--log_level debug` missed the job's debug lines from
    before the trainer (the built-in suite's `DEBUG trl_trapo.tasks: Task suite ...`): the jobs' scripts set up
    logging at INFO, and `--log_level` reached TRAPO's logger only once the trainer was built."""
    import os
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    job = ["--max_steps", "1", "--max_eval_samples", "8", "--torch_threads", "1", "--report_to", "none"]

    def output(level: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "trl_trapo.jobs.commands", "train", *job, "--output_dir", str(tmp_path / level)]
            + ["--log_level", level],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout + done.stderr

    quiet = output("warning")
    assert "Done in" in quiet, quiet[-2000:]  # the job ran to its summary
    assert not re.findall(r".*INFO trl_trapo.*", quiet), re.findall(r".*INFO trl_trapo.*", quiet)
    verbose = output("debug")
    assert re.search(r"DEBUG trl_trapo\.tasks: Task suite \(seed 0\)", verbose), verbose[-3000:]
    assert "INFO trl_trapo.jobs.main: Built-in mode" in verbose and "DEBUG trl_trapo.rollout: Step 0" in verbose


@pytest.mark.parametrize(
    ("job", "argv", "expected"),
    [
        ("train", ["--log_level", "warning"], logging.WARNING),
        ("vlm", ["--log_level", "debug"], logging.DEBUG),
        ("tools", ["--log_level", "error"], logging.ERROR),
        ("tools", ["--log_level", "info", "--log_level_replica", "error"], logging.INFO),  # this process logs
        ("vlm", [], logging.NOTSET),  # "passive": the level the job's script set (INFO) stays in effect
    ],
)
def test_each_jobs_parse_sets_trapos_log_level_as_given(job, argv, expected, tmp_path):
    """The same for `trapo vlm` / `trapo tools` (and their example scripts), whose parser is shared
    (`parse_job_args`): the parsed level is applied before the job's first line; "passive" keeps the INFO default."""
    library = logging.getLogger("trl_trapo")
    level, handlers = library.level, list(library.handlers)
    library.setLevel(logging.NOTSET)
    try:
        module = importlib.import_module(next(j.module for j in commands.JOBS if j.name == job))
        module.parse_args([*argv, "--output_dir", str(tmp_path)], prog=f"trapo {job}")
        assert library.level == expected, (job, argv, logging.getLevelName(library.level))
    finally:
        library.setLevel(level)
        library.handlers[:] = handlers
