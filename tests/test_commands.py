"""The `trapo` command (trl_trapo/jobs/commands.py): its sub-commands, that `trapo train` is `examples/trapo.py`'s job, and
the `accelerate launch` command it builds for launcher options."""

from __future__ import annotations

import importlib
import json
import re
import runpy
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from conftest import run_script

from trl_trapo.jobs import commands


ROOT = Path(__file__).resolve().parent.parent
TIMING = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "eps", "eval_runtime")


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


def test_a_job_error_names_the_sub_command(capsys):
    assert commands.main(["tools", "--learning_rat", "1e-3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trapo tools: error: --learning_rat: unknown argument. Did you mean --learning_rate?"), err


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


def test_num_processes_launches_the_job_module_through_accelerate():
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
        (["--main_process_port", "99999"], "--main_process_port=99999: use an integer in 1-65535"),
        (["--main_process_port", "0"], "--main_process_port=0: use an integer >= 1"),
    ],
)
def test_launcher_options_accelerate_would_fail_on_late_are_one_error(argv, message, capsys):
    # `--config_file nope.yaml` was a traceback from inside `accelerate launch`; `--num_processes 0` ran one process
    assert commands.main(["tools", "--max_steps", "2", *argv], launch=pytest.fail) == 2
    assert f"trapo tools: error: {message}" in capsys.readouterr().err


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
    assert commands.main(["train", "--num_processes", "2", *job]) == 2  # one process started: the job refuses it
