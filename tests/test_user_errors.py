"""Every bad input, through the command line (`examples/trapo.py`) and through the API, gets one clean message that
names the field, the bad value and the fix; the command line exits non-zero without a Python traceback; nothing the
user had (files, folders, the config object) is changed.

Helpers shared by every section:
- `run_cli(*args, cwd=...)`: `python examples/trapo.py ARGS` in a subprocess, offline, with a short `--max_steps` and an
  `--output_dir` under `cwd` unless the arguments give them; returns `(returncode, stdout + stderr)`;
- `run_cli_here(*args, cwd=..., monkeypatch=..., capsys=...)`: the same arguments through `cli.run` in this process
  (what `examples/trapo.py` calls, its log lines on stderr too), without the interpreter start: for the many-case
  tables, whose cases also run through `run_cli` (one in the default run, every one with `-m slow`);
- `cli_error(returncode, output, *needles)`: asserts a non-zero exit, no traceback, exactly one `error:` line, and
  every needle in the message; returns the message;
- `api_error(call, *needles, error=ValueError)`: asserts `call()` raises `error` whose message holds every needle;
  returns the message;
- `snapshot(path)`: every file under `path` (or the file itself) -> its bytes' SHA-256, to compare before and after.

Sections, one per area: `# ---- <area> ----`. Command-line cases should fail before any model is loaded, so each
costs an interpreter start (a few seconds) and no training.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from trl_trapo import TRAPOConfig, TRAPOTrainer, cli
from trl_trapo.checkpoint import CheckpointError, verify_checkpoint
from trl_trapo.interrupts import Interruption, TrainingInterrupted
from trl_trapo.tasks import build_char_tokenizer, build_tiny_model, exact_match_reward


ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "trapo.py"


def cli_env(env: dict | None = None) -> dict[str, str]:
    """The environment of a command-line run: offline, quiet, one torch thread, this repository first on `PYTHONPATH`,
    `TRAPO_DEBUG` unset; then `env` (e.g. `{"TRAPO_DEBUG": "1"}`)."""
    environment = {k: v for k, v in os.environ.items() if k != "TRAPO_DEBUG"}
    environment.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        TRANSFORMERS_VERBOSITY="error",
        OMP_NUM_THREADS="1",
    )
    environment.update(env or {})
    return environment


def cli_args(args: tuple[str, ...], cwd: Path) -> list[str]:
    """`args` plus `--max_steps 2` (a run the error failed to stop stays short) and `--output_dir <cwd>/out`, unless
    they set them."""
    argv = list(args)
    names = {a.split("=", 1)[0] for a in argv}
    if "--max_steps" not in names and "--config" not in names:
        argv += ["--max_steps", "2"]
    if "--output_dir" not in names:
        argv += ["--output_dir", str(cwd / "out")]
    return argv


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> tuple[int, str]:
    """Run the main job as a user would, `python examples/trapo.py ARGS`, in a subprocess (see `cli_args`, `cli_env`).

    Args:
        *args: the command-line arguments.
        cwd: the working directory (a test's `tmp_path`).
        env: extra environment variables.
        timeout: seconds before the run is killed (the test then fails).

    Returns:
        `(returncode, output)`: the exit status and stdout followed by stderr.
    """
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), *cli_args(args, cwd)],
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return completed.returncode, completed.stdout + completed.stderr


def run_cli_here(*args: str, cwd: Path, monkeypatch, capsys) -> tuple[int, str]:
    """`run_cli` in this process: `cli.run` on the same arguments (`cli_args`), from `cwd`, with `TRAPO_DEBUG` unset
    and the log lines on stderr (as `examples/trapo.py`'s `logging.basicConfig` puts them); a few milliseconds instead
    of an interpreter start. What only a process shows (its exit status, output at import or exit) is `run_cli`'s.

    Returns:
        `(returncode, output)`: `cli.run`'s exit status (argparse's for a malformed command line) and stdout followed
        by stderr.
    """
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("TRAPO_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT)])  # the program name of the message
    monkeypatch.setattr(sys, "path", list(sys.path))  # a dotted reward path adds the launch directory
    capsys.readouterr()
    root = logging.getLogger()
    handler, level = logging.StreamHandler(sys.stderr), root.level
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        returncode = cli.run(cli_args(args, cwd))
    except SystemExit as exit_:
        returncode = exit_.code
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    captured = capsys.readouterr()
    return returncode, captured.out + captured.err


def cli_error(returncode: int, output: str, *needles: str) -> str:
    """The one error message of a command-line run that should have failed cleanly.

    Args:
        returncode: the run's exit status (must be non-zero).
        output: its stdout + stderr (must hold no traceback and exactly one line with `error:`).
        *needles: strings the message must contain (the field, the bad value, words of the fix).

    Returns:
        The message: the `error:` line and the lines after it.
    """
    assert returncode != 0, f"the run succeeded (exit 0):\n{output[-3000:]}"
    assert "Traceback" not in output, f"a traceback is shown:\n{output[-3000:]}"
    lines = output.splitlines()
    errors = [i for i, line in enumerate(lines) if "error:" in line]
    assert len(errors) == 1, f"expected one `error:` line, got {len(errors)}:\n{output[-3000:]}"
    message = "\n".join(lines[errors[0] :])
    for needle in needles:
        assert needle in message, f"{needle!r} not in the message:\n{message}"
    return message


def api_error(call: Callable[[], object], *needles: str, error: type[BaseException] = ValueError) -> str:
    """The message of the error `call()` must raise.

    Args:
        call: what to run, e.g. `lambda: TRAPOConfig(output_dir=..., max_steps=0)`.
        *needles: strings the message must contain (the field, the bad value, words of the fix).
        error: the exception type expected.

    Returns:
        The message.
    """
    with pytest.raises(error) as raised:
        call()
    message = str(raised.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in the message: {message}"
    return message


def snapshot(path: Path) -> dict[str, str]:
    """Every file under `path` (or `path` itself, if a file) -> the SHA-256 of its bytes; `{}` if nothing is there.

    Args:
        path: a file or folder the user had before the run.

    Returns:
        Relative path (`"."` for a file) -> hex digest.
    """
    path = Path(path)
    if path.is_file():
        return {".": hashlib.sha256(path.read_bytes()).hexdigest()}
    if not path.is_dir():
        return {}
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


# ---- command line ----
# The job's own command line (`trl_trapo.jobs.main.run`, behind `examples/trapo.py`): a user error is one message on stderr,
# `trapo.py: error: ...` and a line saying how to see the traceback (`TRAPO_DEBUG=1`), and exit status 2, as argparse
# reports a malformed command line; a fault of the program keeps its traceback. Every case runs with `--output_dir` on a
# folder the user already has, which must be left as it was.


@pytest.fixture
def users_folder(tmp_path) -> Path:
    """An output folder with a file of the user's in it (a previous run's notes), to check it is left alone."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "notes.txt").write_text("the user's own file\n")
    return folder


def assert_untouched(folder: Path, before: dict[str, str]) -> None:
    assert snapshot(folder) == before, f"{folder} changed: {sorted(snapshot(folder))} (before: {sorted(before)})"


def here_and_in_the_script(cases: list[tuple], ids: list[str], default_script_case: str) -> list:
    """Each case twice, as `(*case, where)`: `where="here"` (`run_cli_here`, id `<id>-here`) and `where="script"`
    (`run_cli`, id `<id>`). Every case runs in-process in the default run, and `default_script_case` through the
    script too (about 5 s of interpreter start each); the other cases' script runs are `slow`."""
    params = []
    for case, id_ in zip(cases, ids, strict=True):
        params.append(pytest.param(*case, "here", id=f"{id_}-here"))
        # default-run sibling: the same case's `<id>-here` run (and the script run of `default_script_case`)
        marks = () if id_ == default_script_case else pytest.mark.slow
        params.append(pytest.param(*case, "script", id=id_, marks=marks))
    return params


def run_case(where: str, *args: str, cwd: Path, monkeypatch, capsys) -> tuple[int, str]:
    """`run_cli_here` (`where="here"`) or `run_cli` (`where="script"`) on `args`."""
    if where == "here":
        return run_cli_here(*args, cwd=cwd, monkeypatch=monkeypatch, capsys=capsys)
    return run_cli(*args, cwd=cwd)


# slow script runs: default-run sibling: test_a_bad_value_is_one_clean_message[<id>-here]
@pytest.mark.parametrize(
    "args, needles, where",
    here_and_in_the_script(
        [
            # argparse took `-1e-3` for an option ("expected one argument"); the value must reach TRAPOConfig's check
            (["--learning_rate", "-1e-3"], ["learning_rate", "-0.001", "> 0"]),
            (["--learning_rate=-1e-3"], ["learning_rate", "-0.001", "> 0"]),
            # before: a traceback of 3-33 frames above the message
            (
                ["--reward_funcs", "not_a_reward"],
                ["--reward_funcs", "'not_a_reward'", "exact_match", "my_module.my_reward"],
            ),
            (
                ["--reward_funcs", "no_such_module.reward"],
                ["--reward_funcs", "'no_such_module.reward'", "cannot import"],
            ),
            (
                ["--reward_funcs", "json.no_such_function"],
                ["'json.no_such_function'", "no attribute", "numeric_answer"],
            ),
            (["--reward_funcs", "json.__name__"], ["'json.__name__'", "not a function", "my_module.my_reward"]),
            (["--max_eval_samples", "0"], ["--max_eval_samples", "0", ">= 1"]),
            (["--max_eval_samples", "-5"], ["--max_eval_samples", "-5", ">= 1"]),
            (["--dataset_name", "./missing.jsonl"], ["--dataset_name", "'./missing.jsonl'", "Fix: correct the path"]),
            (
                ["--resume_from_checkpoint", "missing-checkpoint"],
                ["--resume_from_checkpoint", "'missing-checkpoint'", "Fix"],
            ),
            (["--num_generations", "-2"], ["num_generations", "-2", ">= 1"]),
            # trial 4's N91: transformers reads <= 0 as "no limit", so 0 kept every checkpoint
            (["--save_total_limit", "0"], ["save_total_limit", "0", "keeps every checkpoint", "save_strategy"]),
        ],
        ids=[
            "negative-learning-rate",
            "negative-learning-rate=",
            "unknown-reward",
            "reward-module-missing",
            "reward-attribute-missing",
            "reward-not-callable",
            "max-eval-samples-0",
            "max-eval-samples-negative",
            "missing-dataset",
            "missing-checkpoint",
            "bad-config-value",
            "save-total-limit-0",
        ],
        default_script_case="unknown-reward",
    ),
)
def test_a_bad_value_is_one_clean_message(tmp_path, users_folder, monkeypatch, capsys, args, needles, where):
    before = snapshot(users_folder)
    returncode, output = run_case(
        where, *args, "--output_dir", str(users_folder), cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys
    )
    cli_error(returncode, output, *needles)
    assert returncode == cli.USER_ERROR_EXIT_CODE == 2
    assert "TRAPO_DEBUG=1" in output  # the message says how to see the traceback
    assert_untouched(users_folder, before)


# slow script runs: default-run sibling: test_a_bad_config_file_is_one_clean_message[<id>-here]
@pytest.mark.parametrize(
    "content, needles, where",
    here_and_in_the_script(
        [
            (
                "learning_rate: 1e-5\nmax_steps: [1, 2\n",
                ["--config", "not valid YAML", "line 3"],
            ),  # before: yaml's traceback
            ("learning_rat: 1e-5\n", ["--config", "unknown key 'learning_rat'", "--learning_rate"]),
            ("- learning_rate\n", ["--config", "YAML mapping"]),
            ("max_eval_samples: 0\n", ["--max_eval_samples", "0", ">= 1"]),
            # YAML values reach the config unconverted: a list for a number was a TypeError traceback, a fraction of a
            # step trained and crashed at the end, text for a number named no field
            (
                "learning_rate: [1.0e-5, 2.0e-5]\n",
                ["--config", "learning_rate", "[1e-05, 2e-05]", "a number is needed"],
            ),
            ("max_steps: 1.5\n", ["--config", "max_steps", "1.5", "a whole number"]),
            ("max_steps: abc\n", ["--config", "max_steps", "'abc'", "a whole number"]),
            ("curriculum_mixtures: 0.5\n", ["--config", "curriculum_mixtures", "0.5", "not a list"]),
            # an empty file was TRL's "must contain a YAML mapping", without a fix
            ("# nothing yet\n", ["--config", "holds no settings", "`key: value`", "drop --config"]),
            # the last value won silently
            ("max_steps: 10\nmax_steps: 2\n", ["--config", "'max_steps' is given twice (lines 1 and 2)"]),
            # text for a list of names was read one character at a time ("--reward_funcs 'm': not a built-in ...")
            (
                "reward_funcs: my_rewards.length\n",
                ["--config", "reward_funcs: 'my_rewards.length' is text", "`reward_funcs: [my_rewards.length]`"],
            ),
            ("max_steps: 2\n".encode("latin-1") + b"# caf\xe9\n", ["--config", "not UTF-8", "iconv"]),
        ],
        ids=[
            "not-yaml",
            "unknown-key",
            "not-a-mapping",
            "bad-value",
            "list-for-number",
            "fraction-for-int",
            "text-for-int",
            "number-for-list",
            "empty",
            "duplicate-key",
            "text-for-list",
            "not-utf8",
        ],
        default_script_case="not-yaml",
    ),
)
def test_a_bad_config_file_is_one_clean_message(tmp_path, users_folder, monkeypatch, capsys, content, needles, where):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = snapshot(users_folder), snapshot(recipe)
    returncode, output = run_case(
        where,
        "--config",
        str(recipe),
        "--output_dir",
        str(users_folder),
        cwd=tmp_path,
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    cli_error(returncode, output, *needles)
    assert (snapshot(users_folder), snapshot(recipe)) == before


@pytest.mark.slow
def test_trapo_debug_shows_the_traceback_the_clean_message_hides(tmp_path):
    args = ("--reward_funcs", "not_a_reward")
    returncode, output = run_cli(*args, cwd=tmp_path)
    message = cli_error(returncode, output, "'not_a_reward'")
    assert "TRAPO_DEBUG=1" in message
    returncode, output = run_cli(*args, cwd=tmp_path, env={"TRAPO_DEBUG": "1"})
    assert returncode != 0
    assert "Traceback" in output and "resolve_reward_func" in output and "'not_a_reward'" in output


def test_accelerate_launch_quiet_shows_only_the_message(tmp_path):
    """`accelerate launch` adds its launcher's own traceback after any non-zero exit; `-q` (documented) drops it."""
    accelerate = Path(sys.executable).with_name("accelerate")
    if not accelerate.exists():
        pytest.skip("accelerate's launcher is not installed next to this interpreter")
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    environment.pop("TRAPO_DEBUG", None)
    completed = subprocess.run(
        [str(accelerate), "launch", "-q", "--num_processes", "1", str(SCRIPT), "--reward_funcs", "not_a_reward"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    cli_error(completed.returncode, completed.stdout + completed.stderr, "--reward_funcs", "'not_a_reward'")


@pytest.mark.parametrize("flag", ["--bf16", "--exploration", "--self_imitation", "--activation_checkpointing"])
def test_optional_bool_flags_work_bare_like_bool_flags(tmp_path, flag):
    """`bool | None` fields (None: decided for you) took no bare form: `--bf16` alone was "expected one argument"."""
    name = flag[2:]
    for argv in ([flag], [flag, "--max_steps", "3"], [flag.replace("_", "-")]):
        _, args, _ = cli.parse_args([*argv, "--use_cpu", "--output_dir", str(tmp_path)])
        assert getattr(args, name) is True, argv
    _, args, _ = cli.parse_args([flag, "false", "--use_cpu", "--output_dir", str(tmp_path)])
    assert getattr(args, name) is False


def test_a_bare_bf16_flag_reaches_the_job_from_the_command_line(tmp_path, users_folder):
    # parsed (before: argparse's "expected one argument"), then refused on what comes next, before any model loads
    before = snapshot(users_folder)
    returncode, output = run_cli(
        "--use_cpu", "--bf16", "--reward_funcs", "oops", "--output_dir", str(users_folder), cwd=tmp_path
    )
    cli_error(returncode, output, "--reward_funcs", "'oops'")
    assert_untouched(users_folder, before)


def test_normalize_argv_keeps_every_value_the_user_meant():
    cases = [
        (["--learning_rate", "-1e-3"], ["--learning_rate=-1e-3"]),  # joined, so argparse does not see an option
        (["--learning_rate", "-.5E+2", "--bf16"], ["--learning_rate=-.5E+2", "--bf16=true"]),
        (["--max_steps", "-1"], ["--max_steps=-1"]),
        (["--bf16", "false", "--config=r.yaml"], ["--bf16", "false", "--config", "r.yaml"]),  # a value: kept
        (["--output_dir", "-x-"], ["--output_dir", "-x-"]),  # not a number: left to argparse
    ]
    for argv, expected in cases:
        assert cli.normalize_argv(argv) == expected, argv
        assert cli.normalize_argv(expected) == expected, argv  # idempotent: parse_args and given_arguments apply it


def write_reward_module(folder: Path) -> None:
    """`my_rewards.py` in `folder`: `counted` appends the number of completions it scores to `calls.txt`."""
    (folder / "my_rewards.py").write_text(
        "import os\n"
        "def counted(completions, **kwargs):\n"
        "    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'calls.txt'), 'a') as f:\n"
        "        f.write(f'{len(completions)}\\n')\n"
        "    return [float(len(str(c)) % 2) for c in completions]\n"
        "NOT_A_FUNCTION = 3\n"
        "def broken(completions, **kwargs):\n"
        "    return [1.0 / 0 for c in completions]\n"
        "class LengthReward:\n"
        "    def __call__(self, completions, **kwargs):\n"
        "        return [float(len(c)) for c in completions]\n"
    )


@pytest.mark.slow
def test_a_reward_function_that_raises_is_one_clean_message(tmp_path):
    """The user's reward raising (found by the construction-time check) was a RuntimeError with a traceback and exit
    1 (a new user's report); now one message naming the function and what it raised, exit 2."""
    write_reward_module(tmp_path)
    code, output = run_cli("--reward_funcs", "my_rewards.broken", cwd=tmp_path)
    cli_error(code, output, "Reward function 'broken' raised ZeroDivisionError", "must return one float")
    assert code == 2


def test_a_dotted_reward_path_is_imported_from_the_launch_directory(tmp_path, monkeypatch):
    write_reward_module(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the import adds the launch directory, as TRL's scripts do
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    func = cli.resolve_reward_func("my_rewards.counted")
    assert func.__module__ == "my_rewards" and func.__name__ == "counted"
    assert cli.resolve_reward_func("exact_match") is cli.REWARD_FUNCTIONS["exact_match"]
    api_error(lambda: cli.resolve_reward_func("my_rewards.NOT_A_FUNCTION"), "'my_rewards.NOT_A_FUNCTION'", "int")
    api_error(lambda: cli.resolve_reward_func("my_rewards.missing"), "no attribute 'missing'", "exact_match")
    # trial 14's C13: a class was taken, then its constructor failed on `prompts=` in the construction-time check
    # ("LengthReward.__init__() got an unexpected keyword argument") with advice about empty completions
    api_error(
        lambda: cli.resolve_reward_func("my_rewards.LengthReward"),
        "--reward_funcs 'my_rewards.LengthReward': 'LengthReward' is a class, not a function",
        "`length_reward = LengthReward()` in module my_rewards, then `--reward_funcs my_rewards.length_reward`",
    )


def test_a_reward_file_path_is_refused_with_the_dotted_form_of_its_functions(tmp_path, monkeypatch):
    """`--reward_funcs ./my_rewards.py` was "cannot import module './my_rewards' (TypeError: the 'package' argument
    is required to perform a relative import ...)" (trial 8's JC02): a file path is said not to be taken, with the
    dotted form of the functions the file defines (and, from another folder, how to make it importable)."""
    write_reward_module(tmp_path)
    monkeypatch.chdir(tmp_path)
    message = api_error(
        lambda: cli.resolve_reward_func("./my_rewards.py"),
        "--reward_funcs './my_rewards.py': a file path is not taken",
        "`--reward_funcs my_rewards.counted",
    )
    assert "relative import" not in message and "PYTHONPATH" not in message
    # trial 11's C09: the file:function form of other tools was told the placeholder `my_rewards.my_reward`
    for value in ("./my_rewards.py:broken", "my_rewards.py:broken"):
        api_error(
            lambda value=value: cli.resolve_reward_func(value),
            "a file path is not taken",
            "`--reward_funcs my_rewards.broken`",
        )
    monkeypatch.chdir(tmp_path.parent)
    api_error(
        lambda: cli.resolve_reward_func(f"{tmp_path.name}/my_rewards.py"),
        "a file path is not taken",
        f"(run from {tmp_path}, or add it to the path: `PYTHONPATH={tmp_path}`)",
    )


def test_max_eval_samples_caps_every_evaluation_dataset(tmp_path):
    from trl import ModelConfig

    args = cli.TRAPOConfig(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True)
    builtin = cli.build_inputs(cli.TRAPOScriptArguments(max_eval_samples=7), args, ModelConfig())
    assert builtin.builtin_eval and len(builtin.eval_dataset) == 7
    data = tmp_path / "rl"
    data.mkdir()
    rows = "".join(f'{{"prompt": "rev ab{c}=", "answer": "{c}ba"}}\n' for c in "cdefghij")
    (data / "train.jsonl").write_text(rows)
    (data / "test.jsonl").write_text(rows)
    script = cli.TRAPOScriptArguments(dataset_name=str(data), max_eval_samples=3)
    users = cli.build_inputs(script, args, ModelConfig())
    assert len(users.eval_dataset) == 3 and len(users.train_dataset) == 8  # the training rows are not capped
    assert list(users.eval_dataset["prompt"]) == ["rev abc=", "rev abd=", "rev abe="]  # the first rows
    more = cli.build_inputs(
        cli.TRAPOScriptArguments(dataset_name=str(data), max_eval_samples=100), args, ModelConfig()
    )
    assert len(more.eval_dataset) == 8


@pytest.mark.slow
def test_a_users_reward_function_and_the_eval_cap_run_end_to_end(tmp_path):
    """One short real job: `--reward_funcs my_rewards.counted` is called, and every evaluation sees 4 prompts."""
    write_reward_module(tmp_path)
    returncode, output = run_cli(
        "--reward_funcs", "my_rewards.counted", "--max_steps", "1", "--max_eval_samples", "4", cwd=tmp_path
    )
    assert returncode == 0, output[-3000:]
    assert (tmp_path / "calls.txt").exists(), "the user's reward function was never called"
    evaluated = re.findall(r"Evaluation eval: (\d+) prompts", output)  # before, during and after training
    assert len(evaluated) >= 2 and set(evaluated) == {"4"}, evaluated
    assert (tmp_path / "out" / "eval_results.json").exists()


# the mechanism itself, in-process: which exceptions count as the user's, in which phase of the job
class Boom(Exception):
    pass


@pytest.mark.parametrize(
    "phase, error, clean",
    [
        ("build", ValueError("--x=1: bad. Fix: y."), True),
        ("build", FileNotFoundError(2, "No such file or directory", "data.jsonl"), True),
        ("build", ImportError("needs peft: pip install peft"), True),
        ("build", KeyError("a bug"), False),
        ("build", TypeError("a bug"), False),
        ("run", CheckpointError("checkpoint-3/optimizer.pt: SHA-256 mismatch. Fix: resume from checkpoint-2."), True),
        ("run", ValueError("raised inside training: a fault of the program"), False),
        ("run", Boom("a bug"), False),
    ],
)
def test_run_turns_only_user_errors_into_a_message(monkeypatch, capsys, phase, error, clean):
    def build_trainer(*args, **kwargs):
        if phase == "build":
            raise error
        return object(), object()

    def run_job(*args, **kwargs):
        raise error

    monkeypatch.setattr(cli, "parse_args_and_builtin_defaults", lambda argv=None, prog=None: (None, None, None, {}))
    monkeypatch.setattr(cli, "build_trainer", build_trainer)
    monkeypatch.setattr(cli, "run_job", run_job)
    monkeypatch.delenv("TRAPO_DEBUG", raising=False)
    if clean:
        assert cli.run([]) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and str(error) in err and "TRAPO_DEBUG=1" in err
        monkeypatch.setenv("TRAPO_DEBUG", "1")  # debugging: the same error, raised with its traceback
    with pytest.raises(type(error)):
        cli.run([])


def test_a_model_path_with_a_tilde_loads_as_it_was_checked(tmp_path, monkeypatch):
    """`model_name_or_path: ~/models/tiny` (a recipe, or `--model_name_or_path=~/...`, which the shell leaves alone)
    passed the path check, which expands `~`, then failed to load: transformers took it for a malformed Hub id."""
    from transformers import AutoModelForCausalLM
    from trl import ModelConfig

    from trl_trapo.tasks import build_char_tokenizer, build_tiny_model

    monkeypatch.setenv("HOME", str(tmp_path))
    folder = tmp_path / "models" / "tiny"
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data = tmp_path / "rl.jsonl"
    data.write_text('{"prompt": "rev abc=", "answer": "cba"}\n')
    args = cli.TRAPOConfig(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True)
    script = cli.TRAPOScriptArguments(dataset_name=str(data), reward_funcs=["exact_match"])
    inputs = cli.build_inputs(script, args, ModelConfig(model_name_or_path="~/models/tiny"))
    assert inputs.model == str(folder)  # what the trainer passes to from_pretrained
    assert AutoModelForCausalLM.from_pretrained(inputs.model) is not None
    assert cli.local_or_hub("owner/model") == "owner/model"  # a Hub id is left alone


# ---- config field types ----
@pytest.mark.parametrize(
    "settings, needles",
    [
        ({"learning_rate": "1e-3"}, ["learning_rate='1e-3'", "a number, not str", "write learning_rate=0.001"]),
        ({"max_prompt_length": None}, ["max_prompt_length=None", "must be an int, not None", "the default is 512"]),
        ({"num_generations": 2.5}, ["num_generations=2.5", "must be an int, not float"]),
        ({"max_steps": 3.0}, ["max_steps=3.0", "write max_steps=3"]),
        ({"top_k": True}, ["top_k=True", "must be an int, not bool"]),
        ({"bf16": "true"}, ["bf16='true'", "must be True or False or None"]),
        ({"reward_weights": ["1", 2.0]}, ["reward_weights=['1', 2.0]", "numbers or None, not a list holding '1'"]),
        ({"curriculum_boundaries": 0.5}, ["curriculum_boundaries=0.5", "must be a list of numbers, not float"]),
        ({"kl_estimator": 2}, ["kl_estimator=2", "use one of 'auto', 'k1', 'k2', 'k3'"]),
    ],
    ids=["str-number", "none", "float-for-int", "integral-float", "bool-for-int", "str-bool", "list-item",
         "scalar-list", "literal-type"],
)  # fmt: skip
def test_a_value_of_the_wrong_type_is_one_message_naming_field_value_and_fix(tmp_path, settings, needles):
    """Every field is checked against its annotation before any other check uses it (a string learning rate was
    `TypeError: must be real number, not str`, naming nothing; `max_prompt_length=None`, which older GRPOConfigs took,
    was `'<' not supported between instances of 'NoneType' and 'int'`; `num_generations=2.5` was accepted)."""
    message = api_error(lambda: TRAPOConfig(output_dir=str(tmp_path), report_to="none", **settings), *needles)
    assert message.startswith("TRAPOConfig.") and "is invalid" in message


def test_the_type_check_accepts_what_the_fields_take(tmp_path):
    """Ints for numbers, tuples for lists, a mapping per curriculum phase, config objects where a dict is annotated,
    a `pathlib.Path` for a path, and every value a built config holds (its copy through `dataclasses.replace`, which
    the trainer makes)."""
    import dataclasses

    from transformers.trainer_pt_utils import AcceleratorConfig

    from trl_trapo import PPOConfig

    config = TRAPOConfig(
        output_dir=tmp_path, report_to=["none"], learning_rate=1, curriculum_boundaries=(0.5,),
        curriculum_mixtures=[{"pretrain": 0.5, "sft": 0.5, "rl": 0.0}, {"rl": 1.0}], eval_strategy="steps",
        eval_steps=5, lr_scheduler_type="cosine", accelerator_config=AcceleratorConfig(), debug="underflow_overflow",
    )  # fmt: skip
    assert dataclasses.replace(config).learning_rate == 1
    dataclasses.replace(PPOConfig(output_dir=str(tmp_path), report_to="none"), max_steps=4)


def dict_fields() -> list[str]:
    """Every field of `TRAPOConfig` (its own and transformers' / TRL's) that holds a dict."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(TRAPOConfig)
    return [
        f.name
        for f in dataclasses.fields(TRAPOConfig)
        if f.init
        and any(a is dict or typing.get_origin(a) is dict for a in (hints[f.name], *typing.get_args(hints[f.name])))
    ]


def test_every_dict_field_takes_a_json_object_on_the_command_line_and_names_itself_when_malformed(tmp_path):
    """A dict field of TRAPO's own annotated `dict | None` (TRL's: `dict | str | None`) got argparse's `type=dict`,
    so the command line refused every value, a well-formed one too (`--generation_kwargs '{"min_p": 0.1}'`: "invalid
    dict value", naming no form); transformers' `dict | str | None` fields parsed the text in `__post_init__` with a
    bare `JSONDecodeError` (as TRL does). Every dict field, whoever declares it: a JSON object is parsed into a dict,
    malformed text is one message naming the field, the value and the form."""
    names = dict_fields()
    assert {"generation_kwargs", "chat_template_kwargs", "model_init_kwargs", "lr_scheduler_kwargs"} <= set(names)
    base = ["--use_cpu", "--report_to", "none", "--output_dir", str(tmp_path)]
    for name in names:
        if name == "grpo_values_built":  # filled in at construction, with grpo_names_given: refused alone
            api_error(
                lambda: cli.parse_args(["--grpo_values_built", "{}", *base]),
                "grpo_values_built='{}' is invalid: it is filled",
            )
        elif name not in ("deepspeed", "fsdp_config"):  # these start DeepSpeed / FSDP: their text is checked below
            _, config, _ = cli.parse_args([f"--{name}", "{}", *base])
            value = getattr(config, name)  # a dict (accelerator_config: transformers' object built from it)
            assert value is not None and not isinstance(value, str), (name, value)
        api_error(
            lambda name=name: cli.parse_args([f"--{name}", "{min_p: 0.1", *base]),
            f"--{name}='{{min_p: 0.1' is invalid: it is not valid JSON",  # the config's refusal, in flags
            "It takes a JSON object, keys in double quotes, e.g. `--" + name + " '{",
        )
    _, config, _ = cli.parse_args(["--generation_kwargs", '{"min_p": 0.1}', *base])
    assert config.generation_kwargs == {"min_p": 0.1}
    api_error(lambda: cli.parse_args(["--generation_kwargs", "min_p=0.1", *base]), "it is not valid JSON")
    api_error(lambda: cli.parse_args(["--chat_template_kwargs", "[1]", *base]), "it is a JSON list, not an object")
    api_error(lambda: cli.parse_args(["--deepspeed", "{ds: 1}", *base]), "or the path of a JSON file")
    # the Python API takes the same text, as TRL's configs do
    assert TRAPOConfig(
        output_dir=str(tmp_path), report_to="none", generation_kwargs='{"min_p": 0.1}'
    ).generation_kwargs == {"min_p": 0.1}


# ---- output dir, disk, saves ----
def finished_run(folder: Path) -> dict[str, bytes]:
    """A folder as a finished run leaves it (a model's config and weights, eval_results.json); its snapshot."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"weights of the first run")
    (folder / "eval_results.json").write_text('{"eval_accuracy": 0.97}')
    return snapshot(folder)


def test_cli_refuses_to_train_over_a_finished_run(tmp_path, monkeypatch, capsys):
    """The second run into the same output_dir stops before loading anything, names output_dir, what it found and
    the three fixes, and leaves the first run's files as they were."""
    out = tmp_path / "trapo-output"
    before = finished_run(out)
    code, output = run_cli_here("--output_dir", str(out), cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    cli_error(
        code,
        output,
        f"--output_dir {out} holds a finished run",  # the config's field, as its flag
        "eval_results.json",
        "model.safetensors",
        "--overwrite_output_dir",
        "another output_dir",
    )
    assert snapshot(out) == before
    from trl_trapo.jobs.main import parse_args
    from trl_trapo.saving import check_output_dir

    _, args, _ = parse_args(["--output_dir", str(out), "--overwrite_output_dir"])  # the fix parses and is accepted
    assert args.overwrite_output_dir is True
    check_output_dir(args)


def test_api_refuses_a_finished_run_unless_overwritten(tmp_path, tokenizer, suite, tiny_trainer):
    """At construction, before the model is even looked at (a missing model path is not reached); resuming one of its
    checkpoints *in place* is refused too (the final save would replace the finished model: a new user's resume from
    shell history trained 0 steps and replaced it), resuming it into another output_dir or `overwrite_output_dir=True`
    is accepted; a folder of checkpoints only (an interrupted run) is not finished: the trainer is built, and `train()`
    resumes it in place (see the next test)."""
    before = finished_run(tmp_path)
    with pytest.raises(ValueError, match=r"output_dir=.*holds a finished run \(config\.json.*overwrite_output_dir"):
        TRAPOTrainer("no/such/model-folder", args=TRAPOConfig(output_dir=str(tmp_path), report_to="none"))
    assert snapshot(tmp_path) == before
    (tmp_path / "checkpoint-2").mkdir()  # empty (a save killed mid-way): not offered for continuing (trial 11's N48)
    said = api_error(lambda: tiny_trainer(tmp_path, tokenizer, suite), "holds a finished run")
    assert "to continue from one of its checkpoints" not in said
    (tmp_path / "checkpoint-2" / "trapo").mkdir()  # complete, as far as names go
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-2" / "trapo" / "rank0.complete.json").write_text("{}")
    before = snapshot(tmp_path)
    with pytest.raises(
        ValueError, match=r"another output_dir \(to continue from one of its checkpoints: --output_dir"
    ):
        tiny_trainer(tmp_path, tokenizer, suite)
    with pytest.raises(ValueError, match=r"resuming in place replaces it too"):
        tiny_trainer(tmp_path, tokenizer, suite, resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert snapshot(tmp_path) == before
    from trl_trapo.saving import check_output_dir  # (the trainer would also verify the empty checkpoint-2 here)

    continued = str(tmp_path / "continued")
    check_output_dir(TRAPOConfig(output_dir=continued, resume_from_checkpoint=str(tmp_path / "checkpoint-2")))
    tiny_trainer(tmp_path, tokenizer, suite, overwrite_output_dir=True)
    interrupted = tmp_path / "interrupted"
    (interrupted / "checkpoint-2").mkdir(parents=True)
    tiny_trainer(interrupted, tokenizer, suite)


def test_an_unfinished_runs_checkpoints_are_resumed_or_replaced_only_when_told(
    tmp_path, tokenizer, suite, tiny_trainer, monkeypatch, capsys
):
    """A run into an output_dir holding an interrupted run's checkpoints warned, then wrote its own checkpoint-1,
    checkpoint-2 over them, destroying what the resume needed. `train()` now refuses before writing anything unless it
    resumes from one of them (True, or a path inside output_dir) or `overwrite_output_dir=True`; a run resuming
    another folder's checkpoint into it is refused too. The command line refuses before loading anything."""
    out = tmp_path / "run"
    tiny_trainer(out, tokenizer, suite, max_steps=2, save_strategy="steps", save_steps=1).train()
    shutil.rmtree(out / "checkpoint-2")  # interrupted after step 1 of 2 (a run at its max_steps finished: next test)
    before = snapshot(out)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-1"]
    fixes = [f"--resume_from_checkpoint {out / 'checkpoint-1'}", "another output_dir", "--overwrite_output_dir"]
    code, output = run_cli_here("--output_dir", str(out), cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    said = cli_error(code, output, "holds checkpoints of an unfinished run", *fixes)
    assert "trainer.train(" not in said and "TRAPOConfig(" not in said  # the command line's user is told flags
    assert snapshot(out) == before

    again = tiny_trainer(out, tokenizer, suite, max_steps=3, save_strategy="steps", save_steps=1)  # train() decides
    said = api_error(again.train, f"output_dir={str(out)!r} holds checkpoints of an unfinished run (checkpoint-1) "
                     "and this run starts from scratch", "trainer.train(resume_from_checkpoint=True)",
                     "another output_dir", "TRAPOConfig(overwrite_output_dir=True)")  # fmt: skip
    assert " --" not in said  # the Python user is told Python
    elsewhere = str(tmp_path / "other" / "checkpoint-1")
    api_error(lambda: again.train(resume_from_checkpoint=elsewhere), f"this run resumes from {elsewhere}")
    assert again.state.global_step == 0 and snapshot(out) == before  # nothing written
    again.train(resume_from_checkpoint=True)  # continues the run: its checkpoints stay as they were
    assert again.state.global_step == 3 and {k: v for k, v in snapshot(out).items() if k in before} == before
    tiny_trainer(out, tokenizer, suite, max_steps=1, overwrite_output_dir=True).train()  # told to replace them


def test_a_finished_runs_checkpoints_are_refused_with_the_fixes_that_work(
    tmp_path, tokenizer, suite, tiny_trainer, monkeypatch, capsys
):
    """Trial 11's N11: a finished script run again with the same output_dir was told its checkpoint-2 (at step 2 =
    max_steps 2) was "an unfinished run" and to resume it, which `train()` then refused ("nothing would be trained").
    A checkpoint at its run's max_steps is now a finished run, still refused (its checkpoints would be replaced), with
    the fixes that work: another output_dir, overwrite_output_dir, or a larger max_steps to continue it, which then
    trains on."""
    out = tmp_path / "run"
    tiny_trainer(out, tokenizer, suite, max_steps=2, save_strategy="steps", save_steps=2).train()
    before = snapshot(out)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2"]
    same = tiny_trainer(out, tokenizer, suite, max_steps=2)
    said = api_error(
        same.train,
        f"output_dir={str(out)!r} holds the checkpoints of a finished run (checkpoint-2; checkpoint-2 is at step 2, "
        "its max_steps) and this run starts from scratch",
        "Fix: choose another output_dir, pass TRAPOConfig(overwrite_output_dir=True) to replace them, or raise "
        "max_steps above 2 to continue it (trainer.train(resume_from_checkpoint=True)).",
    )
    assert "unfinished" not in said and " --" not in said
    code, output = run_cli_here(
        "--output_dir", str(out), "--max_steps", "2", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys
    )
    said = cli_error(code, output, "finished run", "--overwrite_output_dir", "raise max_steps above 2",
                     f"(--resume_from_checkpoint {out / 'checkpoint-2'})")  # fmt: skip
    assert "unfinished" not in said and "TRAPOConfig(" not in said and "trainer.train(" not in said
    assert snapshot(out) == before and same.state.global_step == 0
    longer = tiny_trainer(out, tokenizer, suite, max_steps=3, save_strategy="steps", save_steps=3)
    api_error(
        longer.train,
        "finished run",
        "or continue it to this run's max_steps=3 (trainer.train(resume_from_checkpoint=True))",
    )
    longer.train(resume_from_checkpoint=True)  # the fix it names works
    assert longer.state.global_step == 3


def test_a_checkpoint_at_this_runs_max_steps_is_not_offered_for_resuming(tmp_path):
    """An unfinished run's checkpoint at or past this run's max_steps cannot be resumed by it (`check_checkpoint_step`
    would refuse: nothing would be trained): the fix is a larger max_steps; where the reader is not known, both
    spellings."""
    from transformers import TrainerState

    from trl_trapo.saving import check_earlier_checkpoints

    (tmp_path / "checkpoint-3" / "trapo").mkdir(parents=True)
    TrainerState(global_step=3, max_steps=10).save_to_json(str(tmp_path / "checkpoint-3" / "trainer_state.json"))
    (tmp_path / "checkpoint-3" / "trapo" / "rank0.complete.json").write_text("{}")  # complete, as far as names go
    args = TRAPOConfig(output_dir=str(tmp_path), max_steps=3, report_to="none")
    said = api_error(
        lambda: check_earlier_checkpoints(args, None),
        "holds checkpoints of an earlier run (checkpoint-3; checkpoint-3 is at step 3, and this run's max_steps=3: "
        "resuming it would train nothing)",
        "pass --overwrite_output_dir (TRAPOConfig(overwrite_output_dir=True))",
        f"raise max_steps above 3 to continue it (--resume_from_checkpoint {tmp_path / 'checkpoint-3'} "
        "(trainer.train(resume_from_checkpoint=True)))",
    )
    assert "unfinished" not in said
    longer = TRAPOConfig(output_dir=str(tmp_path), max_steps=5, report_to="none")
    api_error(lambda: check_earlier_checkpoints(longer, None, cli=False), "holds checkpoints of an unfinished run")


def test_incomplete_checkpoints_are_told_apart_and_only_the_fixes_that_work_are_offered(
    tmp_path, tokenizer, suite, tiny_trainer, caplog
):
    """Trial 11's N48: an output_dir holding an empty checkpoint-1 (a save killed mid-way), or a file of that name,
    was refused as "checkpoints of an unfinished run" whose fix (resume) was refused in turn ("holds no complete
    checkpoint ... start without resuming"): a loop. Incomplete entries are now told apart: empty folders alone are
    written over with a warning; partly written ones alone are refused naming each and why, without resuming; a file
    is refused even with overwrite_output_dir (the save would fail on it mid-run); next to complete checkpoints,
    the newest *complete* one is offered."""
    from trl_trapo.checkpoint import CheckpointError, verify_checkpoint
    from trl_trapo.saving import check_earlier_checkpoints

    out = tmp_path / "run"
    (out / "checkpoint-1").mkdir(parents=True)
    trainer = tiny_trainer(out, tokenizer, suite, max_steps=2, save_strategy="steps", save_steps=1)
    said = api_error(lambda: trainer.train(resume_from_checkpoint=True), "holds no complete checkpoint",
                     "checkpoint-1' is an empty folder: a save stopped before writing anything",
                     "Fix: pass a checkpoint path, or start without resuming.", error=CheckpointError)  # fmt: skip
    assert "not written by TRAPOTrainer" not in said and "after deleting" not in said
    with caplog.at_level(logging.WARNING, logger="trl_trapo.saving"):
        trainer.train()  # the fix it names works: nothing was there to lose
    assert trainer.state.global_step == 2 and "checkpoint-1 (an empty folder" in caplog.text
    from trl_trapo.checkpoint import incomplete_reason, newest_complete_checkpoint  # noqa: E402 (after the old text)

    assert incomplete_reason(str(out / "checkpoint-1")) is None  # written over with a complete one

    (out / "checkpoint-3").mkdir()  # next to complete ones: the newest complete one is named, the empty one listed
    args = TRAPOConfig(output_dir=str(out), max_steps=4, report_to="none")
    said = api_error(lambda: check_earlier_checkpoints(args, None, cli=True),
                     "finished run (checkpoint-1, checkpoint-2; incomplete, not resumable: checkpoint-3 (an empty "
                     "folder: a save stopped before writing anything); checkpoint-2 is at step 2, its max_steps)",
                     f"(--resume_from_checkpoint {out / 'checkpoint-2'})")  # fmt: skip

    other = tmp_path / "partial"  # partly written only: nothing to resume; deleting is offered, resuming is not
    (other / "checkpoint-1").mkdir(parents=True)
    (other / "checkpoint-2").mkdir()
    (other / "checkpoint-2" / "model.safetensors").write_bytes(b"weights")
    args = TRAPOConfig(output_dir=str(other), max_steps=4, report_to="none")
    said = api_error(lambda: check_earlier_checkpoints(args, None, cli=False),
                     "holds incomplete checkpoints and no complete one (checkpoint-1: an empty folder: a save stopped "
                     "before writing anything; checkpoint-2: no trainer_state.json: a save stopped part-way)",
                     "checkpoint-2 holds model weights, perhaps their only copy",
                     "Fix: delete them, choose another output_dir, or pass TRAPOConfig(overwrite_output_dir=True)")  # fmt: skip
    assert "resum" not in said.split("Fix:")[1]
    said = api_error(lambda: newest_complete_checkpoint(str(other), 1), "start without resuming after deleting or "
                     "moving away checkpoint-2", error=CheckpointError)  # fmt: skip
    assert "checkpoint-1," not in said  # the empty one is written over
    assert "checkpoint-2' is incomplete: it has neither trainer_state.json nor a trapo/ folder" in said
    assert "not written by TRAPOTrainer" not in said  # nor told to start from its (partial) weights
    said = api_error(lambda: verify_checkpoint(str(other / "checkpoint-2"), 1), "is incomplete", error=CheckpointError)
    assert "--model_name_or_path" not in said and "start without --resume_from_checkpoint" in said
    check_earlier_checkpoints(TRAPOConfig(output_dir=str(other), overwrite_output_dir=True, report_to="none"), None)

    (other / "checkpoint-5").write_text("not a checkpoint")  # a file: the save would fail on it, overwrite or not
    for overwrite in (False, True):
        args = TRAPOConfig(output_dir=str(other), overwrite_output_dir=overwrite, report_to="none")
        api_error(lambda args=args: check_earlier_checkpoints(args, True), "holds a file named checkpoint-5, where "
                  "this run saves its checkpoint folders", f"Fix: move or delete {other / 'checkpoint-5'}")  # fmt: skip
    unsaved = TRAPOConfig(output_dir=str(other), overwrite_output_dir=True, save_strategy="no", report_to="none")
    check_earlier_checkpoints(unsaved, None)  # no checkpoint saved: the file is in nobody's way


def test_what_an_epoch_of_a_mixed_run_is_is_said_once_at_construction(
    tmp_path, tokenizer, suite, tiny_trainer, caplog
):
    """Trial 11's N50: max_steps=-1, num_train_epochs=1 with pretraining, SFT and RL data planned 545 steps from the
    RL prompts alone, and the 64 SFT rows were served ~20 times, without a word. A run planned from epochs with
    several datasets now says once which dataset the epochs are measured on, the steps, and how many times each other
    dataset is passed over; a run whose length max_steps sets, or with one dataset, says nothing."""
    with caplog.at_level(logging.WARNING, logger="trl_trapo"):
        mixed = tiny_trainer(tmp_path / "mixed", tokenizer, suite, max_steps=-1, num_train_epochs=1)
    notes = [r.getMessage() for r in caplog.records if "num_train_epochs=1 is measured on" in r.getMessage()]
    assert len(notes) == 1, caplog.text
    prompts, planned = len(suite.rl_train), mixed.args.max_steps
    assert notes[0].startswith(
        f"num_train_epochs=1 is measured on train_dataset ({prompts} prompts x 4 completions x num_ppo_epochs=4)"
    )
    assert f": {planned:,} optimizer steps." in notes[0] and "set max_steps" in notes[0]
    passes = dict(re.findall(r"(sft_dataset|pretrain_dataset) \([\d,]+ rows\) ~([\d.]+) times", notes[0]))
    assert set(passes) == {"sft_dataset", "pretrain_dataset"} and all(float(p) > 1 for p in passes.values())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo"):
        tiny_trainer(tmp_path / "fixed", tokenizer, suite, max_steps=4)  # the length is the user's
        TRAPOTrainer(  # one dataset: an epoch is one pass over it
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=exact_match_reward,
            args=TRAPOConfig(output_dir=str(tmp_path / "rl"), max_steps=-1, num_train_epochs=1, report_to="none"),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
        )
    assert "is measured on" not in caplog.text


@pytest.mark.parametrize(("weights", "warned"), [([0.0], True), ([-1.0], False), ([0.0, 2.0], False)])
def test_reward_weights_that_are_all_zero_are_warned_about(tmp_path, tokenizer, suite, caplog, weights, warned):
    """Trial 11's N65: reward_weights=[0.0] (the only reward weighted 0) trained without a word, although every
    completion then scores 0: RL rounds carry no signal and exploration takes every family for stuck. Said once at
    construction, with the fixes; a negative weight (minimising a reward) or one zero among others is taken as given."""
    funcs = [exact_match_reward, lambda completions, **kwargs: [0.0] * len(completions)][: len(weights)]
    with caplog.at_level(logging.WARNING, logger="trl_trapo"):
        TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=funcs,
            args=TRAPOConfig(output_dir=str(tmp_path), max_steps=1, reward_weights=weights, report_to="none"),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
        )
    notes = [r.getMessage() for r in caplog.records if "weighs every reward by 0" in r.getMessage()]
    assert len(notes) == int(warned), caplog.text
    if warned:
        assert notes[0].startswith("TRAPOConfig.reward_weights=[0.0] weighs every reward by 0")
        assert "give at least one reward a non-zero weight, or set rl_weight=0" in notes[0]


def test_rewards_of_one_name_are_logged_apart(tmp_path, tokenizer, suite, caplog):
    """Trial 11's N73: the same reward function listed twice (`[f, f]`, weights 1 and 0.5) logged one
    `rewards/exact_match_reward/mean`: two rewards, one metric key, one series lost without a word. The repeat is now
    `exact_match_reward_2` in the metrics and `reward_func_names`, said once at construction."""
    with caplog.at_level(logging.WARNING, logger="trl_trapo"):
        trainer = TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0),
            reward_funcs=[exact_match_reward, exact_match_reward],
            args=TRAPOConfig(output_dir=str(tmp_path), max_steps=1, logging_steps=1, reward_weights=[1.0, 0.5],
                             save_strategy="no", report_to="none", num_generations=4, per_device_train_batch_size=8,
                             max_prompt_length=16, response_length=4, activation_checkpointing=False),
            train_dataset=suite.rl_train,
            processing_class=tokenizer,
        )  # fmt: skip
    assert trainer.reward_func_names == ["exact_match_reward", "exact_match_reward_2"]
    assert "logged apart as 1: 'exact_match_reward' as 'exact_match_reward_2'" in caplog.text
    trainer.train()
    logged = {key for entry in trainer.state.log_history for key in entry}
    assert {"rewards/exact_match_reward/mean", "rewards/exact_match_reward_2/mean"} <= logged, sorted(logged)


def test_resuming_at_or_past_max_steps_is_refused(tmp_path, tokenizer, suite, tiny_trainer, monkeypatch, capsys):
    """A checkpoint at step 2 resumed with max_steps=2 trained 0 steps and saved the checkpoint as the final model
    (a new user's resume with a smaller --max_steps); refused naming both numbers and the fix, before any step.
    Through the command line: one clean message, and nothing written to the new output_dir."""
    first = tiny_trainer(tmp_path / "first", tokenizer, suite, max_steps=2, save_strategy="steps", save_steps=2)
    first.train()
    checkpoint = tmp_path / "first" / "checkpoint-2"
    again = tiny_trainer(tmp_path / "again", tokenizer, suite, max_steps=2)
    with pytest.raises(CheckpointError, match=r"is at step 2 and max_steps=2: nothing would be trained.*above 2"):
        again.train(resume_from_checkpoint=str(checkpoint))
    assert again.state.global_step == 0
    # refused where the checkpoint is verified, before the model is looked at (trial 4's N80: after the job's initial
    # evaluation)
    config = TRAPOConfig(
        output_dir=str(tmp_path / "early"), report_to="none", max_steps=1, resume_from_checkpoint=str(checkpoint)
    )
    with pytest.raises(CheckpointError, match=r"is at step 2 and max_steps=1: nothing would be trained"):
        TRAPOTrainer("no/such/model-folder", args=config)
    code, output = run_cli_here(
        "--max_steps", "1", "--output_dir", str(tmp_path / "cli2"),
        "--resume_from_checkpoint", str(checkpoint), cwd=tmp_path,  # refused before anything compares the runs
        monkeypatch=monkeypatch, capsys=capsys,
    )  # fmt: skip
    cli_error(code, output, "is at step 2 and max_steps=1", "Raise max_steps above 2")
    assert not (tmp_path / "cli2" / "model.safetensors").exists()


def test_a_corrupted_checkpoint_is_refused_before_anything_slow(
    tmp_path, tokenizer, suite, tiny_trainer, monkeypatch, capsys
):
    """A checkpoint whose files no longer match their recorded SHA-256 was found by `train()`, after the job's initial
    evaluation (53-66 s in a user's trial); it is found when the trainer is built, before the model is even looked at,
    and the command line reports it without evaluating anything. An intact one is hashed once: `train()` resumes
    from it without verifying it again."""
    import shutil

    import trl_trapo.trainer as trainer_module

    first = tiny_trainer(tmp_path / "first", tokenizer, suite, max_steps=2, save_strategy="steps", save_steps=2)
    first.train()
    intact = tmp_path / "first" / "checkpoint-2"
    damaged = tmp_path / "damaged" / "checkpoint-2"
    shutil.copytree(intact, damaged)
    state = damaged / "trapo" / "rank0.json"
    state.write_bytes(state.read_bytes()[:-12] + b" 0123456789}")  # same length, other bytes
    config = TRAPOConfig(output_dir=str(tmp_path / "api"), report_to="none", resume_from_checkpoint=str(damaged))
    with pytest.raises(CheckpointError, match=r"rank0\.json is corrupted or truncated"):
        TRAPOTrainer("no/such/model-folder", args=config)

    def not_reached(*args, **kwargs):
        raise AssertionError("evaluated before the checkpoint to resume from was verified")

    with monkeypatch.context() as patch:
        patch.setattr(TRAPOTrainer, "evaluate", not_reached)
        code, output = run_cli_here(
            "--max_steps", "4", "--resume_from_checkpoint", str(damaged), "--output_dir", str(tmp_path / "cli"),
            cwd=tmp_path, monkeypatch=patch, capsys=capsys,
        )  # fmt: skip
    cli_error(code, output, "rank0.json is corrupted or truncated")

    second = tiny_trainer(tmp_path / "second", tokenizer, suite, max_steps=4, resume_from_checkpoint=str(intact))
    verified = []
    monkeypatch.setattr(trainer_module, "verify_checkpoint", lambda *args: verified.append(args))
    second.train(resume_from_checkpoint=str(intact))
    assert second.state.global_step == 4 and verified == []


def test_a_damaged_checkpoint_is_refused_with_the_fix(tmp_path, tokenizer, suite, tiny_trainer):
    """A damaged checkpoint was named without a fix (trial 4's N76-N79), and one without `trapo/` was called
    "incomplete" (N142): the messages now say to resume from the earlier checkpoint (named), or to start over, and
    that intact weights can start a new run as its model."""
    import shutil

    from trl_trapo.checkpoint import verify_checkpoint

    run = tmp_path / "run"
    tiny_trainer(run, tokenizer, suite, max_steps=2, save_strategy="steps", save_steps=1).train()

    def damaged(name, change):
        copy = tmp_path / name / "checkpoint-2"
        shutil.copytree(run / "checkpoint-2", copy)
        shutil.copytree(run / "checkpoint-1", copy.parent / "checkpoint-1")
        change(copy)
        return copy

    no_optimizer = damaged("nooptim", lambda c: (c / "optimizer.pt").unlink())
    earlier = f"resume from an earlier checkpoint (--resume_from_checkpoint {no_optimizer.parent / 'checkpoint-1'})"
    with pytest.raises(CheckpointError, match=r"optimizer\.pt is missing") as error:
        verify_checkpoint(str(no_optimizer), 1)
    assert earlier in str(error.value) and "or start without --resume_from_checkpoint" in str(error.value)
    assert f"pass {no_optimizer} as --model_name_or_path" in str(error.value)
    no_weights = damaged("noweights", lambda c: (c / "model.safetensors").unlink())
    with pytest.raises(CheckpointError, match=r"model\.safetensors is missing") as error:
        verify_checkpoint(str(no_weights), 1)
    assert "resume from an earlier checkpoint" in str(error.value) and "--model_name_or_path" not in str(error.value)
    state = damaged("badstate", lambda c: (c / "trainer_state.json").write_text("{"))
    with pytest.raises(CheckpointError, match=r"trainer_state\.json is corrupted or truncated.*Fix: resume from"):
        verify_checkpoint(str(state), 1)
    not_ours = damaged("notrapo", lambda c: shutil.rmtree(c / "trapo"))
    with pytest.raises(
        CheckpointError, match=r"has no trapo/ folder: it was not written by TRAPOTrainer.*--model_name"
    ):
        verify_checkpoint(str(not_ours), 1)


@pytest.mark.parametrize("popped", ["StateCheckpointCallback", "StopOnSignalCallback", None])
def test_a_removed_callback_trapo_needs_is_warned_about_at_train_and_named_at_resume(
    tmp_path, tokenizer, suite, tiny_config, caplog, popped
):
    """Trial 15's N31: `pop_callback(StateCheckpointCallback)` trained and saved checkpoints without `trapo/` without a
    word, and resuming one said it "was not written by TRAPOTrainer". `train()` now warns once naming the callback and
    what is lost, and the resume message names the removed callback as a possible cause."""
    from trl_trapo import callbacks

    def trainer(output_dir, max_steps):
        return TRAPOTrainer(
            build_tiny_model(tokenizer, seed=0), processing_class=tokenizer, sft_dataset=suite.sft,
            args=tiny_config(output_dir, max_steps=max_steps, save_strategy="steps", save_steps=1),
        )  # fmt: skip

    first = trainer(tmp_path / "out", 1)
    if popped is not None:
        assert isinstance(first.pop_callback(getattr(callbacks, popped)), getattr(callbacks, popped))
    with caplog.at_level(logging.WARNING, logger="trl_trapo"):
        first.train()
    said = [r.getMessage() for r in caplog.records if "A callback TRAPO needs was removed" in r.getMessage()]
    if popped is None:
        assert said == [], said
        return
    assert len(said) == 1 and f"{popped}: it " in said[0] and f"Fix: keep {popped}" in said[0], said
    what = {"StateCheckpointCallback": "cannot be resumed", "StopOnSignalCallback": "a signal is held"}[popped]
    assert what in said[0], said
    if popped == "StateCheckpointCallback":
        with pytest.raises(CheckpointError) as raised:
            trainer(tmp_path / "again", 2).train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-1"))
        message = str(raised.value)
        assert "has no trapo/ folder" in message, message
        assert "StateCheckpointCallback, which writes that folder) was removed" in message, message


@pytest.mark.parametrize(
    ("saved", "resumed", "needles"),
    [
        (
            dict(sft_sampling="prioritized"),
            dict(sft_sampling="uniform"),
            ["sft_sampling='prioritized' when it was written, 'uniform' now", "sft_sampling='prioritized'"],
        ),
        (
            dict(weighting="uncertainty"),
            dict(dare_mode="static"),
            ["weighting='uncertainty' when it was written, 'static' now", "weighting='uncertainty' (--weighting"],
        ),
        (  # issue 42: a checkpoint of the previous default (DARE) resumed with the new default (static)
            dict(weighting="dare"),
            dict(),
            [
                "weighting='dare' when it was written, 'static' now",
                "The default weighting changed from 'dare' to 'static' in this release",
                "Fix: resume with the checkpoint's value, weighting='dare' (--weighting dare) to continue with DARE as "
                "it was trained",
            ],
        ),
        (
            dict(adapter_snapshot_steps=0, peft=True),
            dict(peft=True),
            ["holds no adapter bank", "adapter_snapshot_steps=0 (--adapter_snapshot_steps 0)"],
        ),
    ],
    ids=["sft_sampling", "weighting", "weighting_default", "adapter_bank"],
)
@pytest.mark.parametrize("when", ["train", "construction"])
def test_a_checkpoint_of_other_state_settings_is_refused_by_setting(
    tmp_path, tokenizer, suite, tiny_trainer, saved, resumed, needles, when
):
    """A checkpoint written with `sft_sampling="prioritized"` and resumed with "uniform" failed at `train()` with
    "rank0.json cannot be restored: KeyError: 'sampler'" (trial 10's PY38); another weighting strategy with "Cannot
    load a 'dare' weighting state into StaticWeighting" (a checkpoint of the previous default, DARE, resumed with the
    new one, static, also says the default changed), an adapter bank turned on with "adapter_bank.json is missing".
    Each is refused before anything loads, naming the setting, its value then and now, and the fix."""
    from peft import LoraConfig, get_peft_model

    def build(settings, **overrides):
        settings = dict(settings)
        model = None
        if settings.pop("peft", False):
            model = get_peft_model(build_tiny_model(tokenizer, seed=0), LoraConfig(r=4, target_modules=["q_proj"]))
        return tiny_trainer(tmp_path / "run", tokenizer, suite, model=model, **settings, **overrides)

    build(saved, max_steps=1, save_strategy="steps", save_steps=1).train()
    checkpoint = str(tmp_path / "run" / "checkpoint-1")
    with pytest.raises(CheckpointError) as raised:
        if when == "train":
            build(resumed, max_steps=2).train(resume_from_checkpoint=checkpoint)
        else:
            build(resumed, max_steps=2, resume_from_checkpoint=checkpoint)
    message = str(raised.value)
    for needle in [f"resume_from_checkpoint={checkpoint!r}", *needles, f"pass {checkpoint} as --model_name_or_path"]:
        assert needle in message, (needle, message)


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_an_output_dir_that_cannot_be_written_is_refused_first(tmp_path, monkeypatch, capsys, where):
    """A file, or a path under a file, fails at once with a ValueError naming output_dir (CLI: before any model
    loads; API: before the model argument is looked at), and the file is left alone."""
    blocker = tmp_path / "results.txt"
    blocker.write_text("the user's notes")
    out = blocker if where == "file" else blocker / "run"
    problem = "is a file, not a folder" if where == "file" else f"cannot be created: it is under {blocker}, which is"
    with pytest.raises(ValueError, match=rf"TRAPOConfig\.output_dir={str(out)!r} {problem}"):
        TRAPOTrainer("no/such/model-folder", args=TRAPOConfig(output_dir=str(out), report_to="none"))
    code, output = run_cli_here("--output_dir", str(out), cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    cli_error(code, output, f"--output_dir {out} {problem}")  # the config's field, as its flag
    assert blocker.read_text() == "the user's notes"


def test_max_steps_zero_is_refused(tmp_path, monkeypatch, capsys):
    """`max_steps=0` trained one step; it is refused with the fix (-1 = epochs, evaluate() to only evaluate)."""
    with pytest.raises(ValueError, match=r"TRAPOConfig\.max_steps=0 is invalid: .*-1.*num_train_epochs.*evaluate"):
        TRAPOConfig(output_dir=str(tmp_path), max_steps=0, report_to="none")
    code, output = run_cli_here(
        "--max_steps", "0", "--output_dir", str(tmp_path / "out"), cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys
    )  # fmt: skip
    cli_error(code, output, "--max_steps 0 is invalid")  # the config's refusal, in flags
    assert not (tmp_path / "out").exists()


# slow script runs: default-run sibling: test_negative_step_counts_are_refused[<id>-here]
@pytest.mark.parametrize(
    "settings, field, where",
    here_and_in_the_script(
        [
            ({"max_steps": -7}, "max_steps=-7"),
            ({"save_strategy": "steps", "save_steps": -3}, "save_steps=-3"),
            ({"eval_strategy": "steps", "eval_steps": -3}, "eval_steps=-3"),
            ({"logging_steps": -2}, "logging_steps=-2"),
        ],
        ids=["max_steps", "save_steps", "eval_steps", "logging_steps"],
        default_script_case="max_steps",
    ),
)
def test_negative_step_counts_are_refused(tmp_path, monkeypatch, capsys, settings, field, where):
    """Siblings of `max_steps=0`: a negative interval never fires (and `max_steps` < -1 silently trained for epochs);
    refused in the config and on the command line, before anything loads."""
    api_error(lambda: TRAPOConfig(output_dir=str(tmp_path), report_to="none", **settings), f"TRAPOConfig.{field} is")
    args = [part for key, value in settings.items() for part in (f"--{key}", str(value))]
    code, output = run_case(where, *args, cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    flag = "--" + field.replace("=", " ")  # the config's refusal, in flags; the CLI parses -3 as -3.0
    cli_error(code, output, flag, "is invalid", "positive number")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_push_to_hub_offline_is_refused_at_construction(tmp_path, monkeypatch, capsys):
    """With HF_HUB_OFFLINE=1 (set by the test suite and the helper), `push_to_hub` cannot succeed: refused in the
    config, naming push_to_hub, the variable and the fixes."""
    with pytest.raises(ValueError, match=r"push_to_hub=True is invalid: HF_HUB_OFFLINE=1 .*Hugging Face Hub"):
        TRAPOConfig(output_dir=str(tmp_path), push_to_hub=True, report_to="none")
    args = ("--push_to_hub", "--output_dir", str(tmp_path / "out"))
    code, output = run_cli_here(*args, cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    cli_error(code, output, "--push_to_hub true is invalid: HF_HUB_OFFLINE=1")


def test_the_configs_refusals_name_flags_on_the_command_line(tmp_path, monkeypatch, capsys):
    """Trial 13's C05: on the command line the bf16 refusal spoke Python ("TRAPOConfig.bf16=True ... set
    use_cpu=True") where docs/main_job.md says errors name the flags typed. Every refusal of the config the command
    line builds names flags (`config_flag_names`): its subject and the `field=value` fixes, in the main job and in the
    jobs that share its parsing; Python code in a message stays Python; the Python API keeps the field names."""
    import transformers.utils

    from trl_trapo.jobs import agent, vision

    monkeypatch.setattr(transformers.utils, "is_torch_bf16_gpu_available", lambda: False)  # a machine without bf16
    python = api_error(lambda: TRAPOConfig(output_dir=str(tmp_path), bf16=True), "TRAPOConfig.bf16=True, but")
    assert "or set use_cpu=True to train with bf16 autocast" in python
    code, output = run_cli_here("--bf16", "true", "--output_dir", str(tmp_path / "out"), cwd=tmp_path,
                                monkeypatch=monkeypatch, capsys=capsys)  # fmt: skip
    message = cli_error(code, output, "error: --bf16 true, but this machine has no GPU with bf16 support",
                        "Drop it (--bf16 left unset turns bf16 on", "or set --use_cpu true to train with bf16 autocast")  # fmt: skip
    assert "TRAPOConfig" not in message and "=True" not in message, message
    for parse in (vision.parse_args, agent.parse_args):
        api_error(lambda parse=parse: parse(["--bf16", "true"]), "--bf16 true, but", "set --use_cpu true")
    flags = cli.config_flag_names
    assert flags("TRAPOConfig.max_staleness=-1 is invalid: use 0, or set async_rollouts=False.") == (
        "--max_staleness -1 is invalid: use 0, or set --async_rollouts false."
    )
    kept = "e.g. `dataclasses.replace(args, beta=0.1, kl_coef=0.1)`, generation_kwargs={'top_k': 5}, not_a_field=1"
    assert flags(f"TRAPOConfig.kl_coef_range=[0.1] is bad: {kept}") == f"--kl_coef_range=[0.1] is bad: {kept}"
    assert flags("TRAPOConfig.report_to='a b' and output_dir='runs/x'") == "--report_to='a b' and --output_dir runs/x"


def test_a_disk_too_small_for_one_checkpoint_is_refused(tmp_path, tokenizer, suite, tiny_trainer, monkeypatch, caplog):
    """With checkpoints on, fewer free bytes than one checkpoint's weights + AdamW state is an error naming
    output_dir, needed and free bytes and the fix; with checkpoints off it is only a warning."""
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=1000))
    with pytest.raises(ValueError, match=r"output_dir=.* has 1,000 bytes free.*needs at least [\d,]+ bytes.*Free"):
        tiny_trainer(tmp_path / "a", tokenizer, suite, save_strategy="steps", save_steps=1)
    with caplog.at_level("WARNING", logger="trl_trapo.saving"):
        tiny_trainer(tmp_path / "b", tokenizer, suite, save_strategy="no")
    assert "a final save_model may not fit" in caplog.text


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ---- data and rewards ----
@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


RL = [{"prompt": "ab=", "answer": "ab"}, {"prompt": "cd=", "answer": "cd"}, {"prompt": "ef=", "answer": "ef"}]
SFT = [{"prompt": "ab=", "completion": "ab"}, {"prompt": "cd=", "completion": "cd"}]
TEXT = [{"text": "abc def"}, {"text": "ghi jkl"}]


def build(tmp_path, tok, reward=exact_match_reward, **datasets):
    """A tiny trainer on the given datasets (lists of rows or datasets); RL prompts come with `reward`."""

    def to_dataset(value):
        if isinstance(value, dict):
            return {k: to_dataset(v) for k, v in value.items()}
        return Dataset.from_list(value) if isinstance(value, list) else value

    datasets = {k: to_dataset(v) for k, v in datasets.items()}
    config = TRAPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=4,
        report_to="none",
        save_strategy="no",
        activation_checkpointing=False,
        pretrain_max_length=16,
        sft_max_length=16,
        max_prompt_length=16,
        response_length=4,
        num_generations=2,
    )
    return TRAPOTrainer(
        build_tiny_model(tok, seed=0),
        reward_funcs=reward if "train_dataset" in datasets else None,
        args=config,
        processing_class=tok,
        **datasets,
    )


def conv(text):
    return [{"role": "user", "content": text}]


MISSING = [
    # (datasets, the message's dataset / column / row / what)
    (
        dict(train_dataset=[RL[0], {"prompt": None, "answer": "x"}]),
        r"`train_dataset` column 'prompt'.*\(None\) at row 1",
    ),
    (
        dict(train_dataset=[{"prompt": conv("ab="), "answer": "ab"}, {"prompt": conv(None), "answer": "x"}]),
        r"`train_dataset` column 'prompt'.*\(None content in message 0\) at row 1",
    ),
    (
        dict(train_dataset=[{**RL[0], "task": "copy"}, {**RL[1], "task": None}]),
        r"`train_dataset` column 'task'.*at row 1",
    ),
    (dict(train_dataset=[{"input_ids": [5, 6]}, {"input_ids": [5, None]}]), r"column 'input_ids'.*at row 1"),
    (dict(sft_dataset=[SFT[0], {"prompt": "x", "completion": None}]), r"`sft_dataset` column 'completion'.*row 1"),
    (dict(sft_dataset=[{"prompt": None, "completion": "x"}, SFT[0]]), r"`sft_dataset` column 'prompt'.*row 0"),
    (
        dict(sft_dataset=[{"messages": conv("a") + [{"role": "assistant", "content": None}]}]),
        r"`sft_dataset` column 'messages'.*\(None content in message 1\) at row 0",
    ),
    (dict(pretrain_dataset=[TEXT[0], {"text": None}]), r"`pretrain_dataset` column 'text'.*\(None\) at row 1"),
    (
        dict(pretrain_dataset=TEXT, eval_dataset={"held": [{"text": "abc"}, {"text": None}]}),
        r"`eval_dataset\['held'\]` column 'text'.*row 1",
    ),
    (dict(pretrain_dataset=TEXT, eval_dataset=[{"prompt": None}]), r"`eval_dataset` column 'prompt'.*row 0"),
    (
        dict(pretrain_dataset=TEXT, eval_dataset=[{"prompt": "a", "completion": math.nan}]),
        r"`eval_dataset` column 'completion'.*\(NaN\) at row 0",
    ),
    (
        dict(pretrain_dataset=TEXT, eval_dataset=[{"text": math.nan}]),  # a float column where text is expected
        r"`eval_dataset` column 'text'.*\(NaN\) at row 0",
    ),
]


@pytest.mark.parametrize(("datasets", "message"), MISSING)
def test_a_missing_value_in_a_column_trapo_reads_is_refused_by_dataset_column_and_row(
    tmp_path, tok, datasets, message
):
    before = {k: list(v) if isinstance(v, list) else v for k, v in datasets.items()}
    with pytest.raises(ValueError, match=message) as error:
        build(tmp_path, tok, **datasets)
    assert "fill it, or drop such rows" in str(error.value)  # the fix
    assert datasets == before  # nothing the user had is changed
    assert not any(tmp_path.iterdir())  # refused before anything was written


BAD_CELLS = [
    # (datasets, the message: dataset, column, row, what; the fix)
    (
        dict(sft_dataset=[{"prompt": "ab=", "answer": "ab"}]),
        "`sft_dataset` must have 'prompt' and 'completion' columns",
        "'messages' column",
    ),
    (
        dict(train_dataset=[{"prompt": 7, "answer": "a"}, {"prompt": 8, "answer": "b"}]),
        "`train_dataset` column 'prompt' holds a value of type int at row 0 (and 1 more rows): '7'",
        "dataset.map(lambda row: {'prompt': str(row['prompt'])})",
    ),
    (
        dict(train_dataset=[{"prompt": ["ab=", "cd="], "answer": "a"}]),
        "`train_dataset` column 'prompt' holds a value of type list at row 0",
        "a list of {'role', 'content'} messages",
    ),
    (
        dict(train_dataset=[{"input_ids": ["5", "6"]}]),
        "`train_dataset` column 'input_ids' holds a value of type list at row 0",
        "a list of token ids (ints)",
    ),
    (dict(pretrain_dataset=[{"text": 3.5}]), "`pretrain_dataset` column 'text' holds a value of type float", "str("),
    # trial 10's PY64: files read in binary mode; `str(b"abc")` is "b'abc'", so the fix is to decode
    (
        dict(pretrain_dataset=[{"text": b"some text"}]),
        "`pretrain_dataset` column 'text' holds a value of type bytes",
        "row['text'].decode('utf-8')",
    ),
    (
        dict(sft_dataset=[SFT[0], {"prompt": "x=", "completion": "  "}]),
        "`sft_dataset` column 'completion' has an empty completion at row 1",
        "dataset.filter(lambda row: row['completion'].strip())",
    ),
    (
        dict(sft_dataset=[{"prompt": conv("a="), "completion": [{"role": "assistant", "content": ""}]}] * 2),
        "`sft_dataset` column 'completion' has an empty completion at row 0 (and 1 more rows)",
        "if m['role'] == 'assistant'",
    ),
    (
        dict(pretrain_dataset=TEXT, eval_dataset={"sft": [{"prompt": "a=", "completion": ""}]}),
        "`eval_dataset['sft']` column 'completion' has an empty completion at row 0",
        "Fill it, or drop such rows",
    ),
]


@pytest.mark.parametrize(("datasets", "message", "fix"), BAD_CELLS)
def test_a_cell_trapo_cannot_read_is_refused_before_any_model_loads(tmp_path, tok, datasets, message, fix):
    """A prompt column of ints failed inside the tokenizer ("text input must be of type `str`"), and SFT rows with an
    empty completion trained to stop at once without a word; each is one message naming the dataset, column, row and
    fix. Every dataset error that needs no tokenizer comes before the model is loaded (a column error came after the
    model, its reference copy and the teacher had loaded: 51 s on a loaded machine): here the model is a path that
    does not exist, and the data error is the one reported."""
    rows = {k: Dataset.from_list(v) if isinstance(v, list) else {n: Dataset.from_list(r) for n, r in v.items()}
            for k, v in datasets.items()}  # fmt: skip
    reward = {"reward_funcs": exact_match_reward} if "train_dataset" in rows else {}
    config = TRAPOConfig(output_dir=str(tmp_path), max_steps=1, report_to="none", save_strategy="no")
    with pytest.raises(ValueError) as error:
        TRAPOTrainer("no/such/model-folder", args=config, processing_class=tok, **reward, **rows)
    assert message in str(error.value) and fix in str(error.value), error.value
    assert not any(tmp_path.iterdir())  # refused before anything was written


@pytest.mark.parametrize(
    "row, message",
    [
        ({"prompt": "x=", "completion": ""}, "column 'completion' has an empty completion at row 1"),
        ({"prompt": "x=", "completion": None}, "column 'completion' has a missing value (None) at row 1"),
    ],
    ids=["empty", "missing"],
)
def test_an_added_demonstration_objective_checks_its_cells_as_the_sft_data(tmp_path, tok, row, message):
    """The sibling path: `TRAPOTrainer(objectives=[DemonstrationObjective(...)])` tokenized its rows without the SFT
    data's cell checks (an empty completion trained to stop, a missing one failed in the tokenizer)."""
    from trl_trapo.objectives import DemonstrationObjective

    demos = DemonstrationObjective("demos", Dataset.from_list([SFT[0], row]))
    config = TRAPOConfig(
        output_dir=str(tmp_path), max_steps=1, report_to="none", save_strategy="no", pretrain_max_length=16,
        curriculum_boundaries=[], curriculum_mixtures=[{"pretrain": 0.5, "demos": 0.5}],
    )  # fmt: skip
    api_error(
        lambda: TRAPOTrainer(
            build_tiny_model(tok, seed=0),
            args=config,
            processing_class=tok,
            pretrain_dataset=Dataset.from_list(TEXT),
            objectives=[demos],
        ),  # fmt: skip
        f"`objective 'demos' dataset` {message}",
    )


@pytest.mark.parametrize("assistant_only_loss", [False, True])
def test_an_added_demonstration_objective_trains_messages_rows_as_the_sft_data(tmp_path, assistant_only_loss):
    """The sibling path: an added objective's `messages` rows are trained as the built-in SFT data's are (every
    token; with assistant_only_loss, the assistant turns), not split at the last message (as it used to) nor
    trained whole when the built-in data is masked."""
    from trl_trapo.agents import use_tool_chat_template
    from trl_trapo.objectives import DemonstrationObjective

    marked = use_tool_chat_template(build_char_tokenizer())
    chat = (
        conv("ab=") + [{"role": "assistant", "content": "ab"}] + conv("ok?") + [{"role": "assistant", "content": "y"}]
    )
    demos = DemonstrationObjective("demos", Dataset.from_list([{"messages": chat}] * 2))
    config = TRAPOConfig(
        output_dir=str(tmp_path), max_steps=1, report_to="none", save_strategy="no", pretrain_max_length=16,
        curriculum_boundaries=[], curriculum_mixtures=[{"pretrain": 0.5, "demos": 0.5}],
        assistant_only_loss=assistant_only_loss,
    )  # fmt: skip
    TRAPOTrainer(
        build_tiny_model(marked, seed=0), args=config, processing_class=marked,
        pretrain_dataset=Dataset.from_list(TEXT), objectives=[demos],
    )  # fmt: skip
    row = demos.pool.dataset[0]
    trained = marked.decode([t for t, m in zip(row["input_ids"], row["completion_mask"]) if m])
    assert trained == ("ab</s>y</s>" if assistant_only_loss else marked.decode(row["input_ids"]))
    assert "ok?" in marked.decode(row["input_ids"])


MIXED = "has both `messages` and `prompt`/`completion` columns"  # a dataset holding two formats (trial 16's N16)


def mixed_format_notices(caplog) -> list[str]:
    """The warnings about datasets whose columns hold two formats, as logged."""
    notices = ("has both `messages` and", "has both `text` and", "has both `prompt` and `messages`")
    return [r.getMessage() for r in caplog.records if any(n in r.getMessage() for n in notices)]


def test_sft_rows_with_messages_and_prompt_completion_say_once_which_is_trained(tmp_path, tok, caplog):
    """Trial 16's N16: an SFT dataset with both a `messages` column and `prompt`/`completion` (a half-converted one)
    trained on prompt/completion and dropped the conversations without a word (TRL's SFTTrainer makes the same choice,
    silently). The choice stays; it is said once, at construction. RL prompts with an extra `messages` column (it
    reaches the reward functions) and pretraining documents beside other columns are not warned about."""
    chat = conv("ab=") + [{"role": "assistant", "content": "ba"}]
    sft = [{"messages": chat, "prompt": "cd=", "completion": "dc"}] * 2
    with caplog.at_level(logging.WARNING, logger="trl_trapo"):
        trainer = build(
            tmp_path,
            tok,
            sft_dataset=sft,
            train_dataset=[{**row, "messages": chat} for row in RL],
            pretrain_dataset=[{**row, "messages": chat} for row in TEXT],
        )
    assert mixed_format_notices(caplog) == [
        f"`sft_dataset` {MIXED}: training on prompt/completion; `messages` is ignored (remove one of them to "
        "silence this)"
    ]
    sft_objective = next(o for o in trainer.objectives if o.name == "sft")
    assert tok.decode(sft_objective.take(1, 0)[0].input_ids) == "cd=dc</s>"  # the pair the message names


def test_an_added_demonstration_objective_with_two_formats_says_which_is_trained(tmp_path, tok, caplog):
    """The sibling path of N16: `objectives=[DemonstrationObjective(...)]` reads its rows as `sft_dataset`'s."""
    from trl_trapo.objectives import DemonstrationObjective

    chat = conv("ab=") + [{"role": "assistant", "content": "ba"}]
    demos = DemonstrationObjective("demos", Dataset.from_list([{**SFT[0], "messages": chat}] * 2))
    config = TRAPOConfig(
        output_dir=str(tmp_path), max_steps=1, report_to="none", save_strategy="no", pretrain_max_length=16,
        curriculum_boundaries=[], curriculum_mixtures=[{"pretrain": 0.5, "demos": 0.5}],
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="trl_trapo"):
        TRAPOTrainer(
            build_tiny_model(tok, seed=0), args=config, processing_class=tok,
            pretrain_dataset=Dataset.from_list(TEXT), objectives=[demos],
        )  # fmt: skip
    assert mixed_format_notices(caplog) == [
        f"`objective 'demos' dataset` {MIXED}: training on prompt/completion; `messages` is ignored (remove one of "
        "them to silence this)"
    ]


def test_eval_sets_with_two_formats_say_which_is_evaluated(tmp_path, tok, caplog):
    """The eval sets of N16: evaluation reads `text` first (language-modelling loss), then SFT rows (prompt-completion
    before `messages`), then prompts (greedy rewards); a set holding a second format says which one is evaluated, at
    construction, and for a set passed to `evaluate()`. An RL or SFT set of one format says nothing."""
    chat = conv("ab=") + [{"role": "assistant", "content": "ba"}]
    sets = {
        "docs": [{**TEXT[0], "prompt": "ab="}],
        "demos": [{**SFT[0], "messages": chat}],
        "prompts": [{**RL[0], "messages": chat}],
        "rl": RL,
        "sft": SFT,
        "chat": [{"messages": chat}],
    }
    with caplog.at_level(logging.WARNING, logger="trl_trapo"):
        trainer = build(tmp_path, tok, train_dataset=RL, eval_dataset=sets)
    assert mixed_format_notices(caplog) == [
        "`eval_dataset['docs']` has both `text` and `prompt` columns: evaluating the language-modelling loss of "
        "`text`; `prompt` is ignored (remove one of them to silence this)",
        f"`eval_dataset['demos']` {MIXED}: evaluating the SFT loss of prompt/completion; `messages` is ignored "
        "(remove one of them to silence this)",
        "`eval_dataset['prompts']` has both `prompt` and `messages` columns: evaluating the SFT loss of `messages`; "
        "the prompts are not scored with rewards (remove one of them to silence this)",
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_trapo"):
        metrics = trainer.evaluate(Dataset.from_list([{**RL[0], "messages": chat}]))
    assert "eval_sft_loss" in metrics and "eval_reward" not in metrics  # what the message says
    assert mixed_format_notices(caplog) == [
        "`eval_dataset` has both `prompt` and `messages` columns: evaluating the SFT loss of `messages`; the prompts "
        "are not scored with rewards (remove one of them to silence this)"
    ]


def test_messages_rows_are_refused_only_where_trl_has_nothing_to_train(tmp_path, tok):
    """A `messages` row trains every token of the conversation, as TRL's SFTTrainer trains it: rows ending with a user
    turn, holding only the assistant's message, or with an empty assistant turn are accepted (they used to be
    refused: the row was split at its last message). With assistant_only_loss=True only the assistant turns are
    trained: a row whose assistant turns are empty would teach only to stop, and is refused before any model loads
    (TRL fails on a row without assistant tokens)."""
    rows = [
        {"messages": conv("a=") + [{"role": "assistant", "content": "a"}] + conv("b=")},
        {"messages": [{"role": "assistant", "content": "a"}]},
        {"messages": conv("a=") + [{"role": "assistant", "content": ""}]},
    ]
    config = TRAPOConfig(output_dir=str(tmp_path / "a"), max_steps=1, report_to="none", save_strategy="no")
    TRAPOTrainer(build_tiny_model(tok, seed=0), args=config, processing_class=tok, sft_dataset=Dataset.from_list(rows))
    masked = TRAPOConfig(
        output_dir=str(tmp_path / "b"), max_steps=1, report_to="none", save_strategy="no", assistant_only_loss=True
    )
    api_error(
        lambda: TRAPOTrainer(
            "no/such/model-folder", args=masked, processing_class=tok, sft_dataset=Dataset.from_list(rows[2:])
        ),
        "`sft_dataset` column 'messages' has an empty assistant turn at row 0",
        "would teach only to stop",
    )


def test_a_tool_call_is_a_completion_and_a_blank_prompt_is_a_prompt():
    """What the empty-completion check must not refuse: an assistant turn that only calls a tool, and SFT rows whose
    prompt is empty (unconditional text)."""
    from trl_trapo.data import check_cells

    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    messages = conv("1+2?") + [{"role": "assistant", "content": "", "tool_calls": [call]}]
    check_cells(Dataset.from_list([{"messages": messages}]), "sft_dataset", "sft")
    check_cells(Dataset.from_list([{"prompt": "", "completion": "abc"}]), "sft_dataset", "sft")


@pytest.mark.parametrize("role", ["train_dataset", "sft_dataset", "eval_dataset"])
def test_conversations_without_a_chat_template_are_one_message(tmp_path, role):
    """Conversational rows with a tokenizer that has no chat template failed with transformers' "Cannot use chat
    template functions because tokenizer.chat_template is not set"; refused at construction naming the dataset, the
    column and the fixes. `chat_template_kwargs={"chat_template": ...}` renders them and is accepted."""
    from trl_trapo.tasks import CHAT_TEMPLATE

    bare = build_char_tokenizer()
    bare.chat_template = None
    rows = {
        "train_dataset": [{"prompt": conv("ab="), "answer": "ab"}] * 2,
        "sft_dataset": [{"prompt": conv("ab="), "completion": [{"role": "assistant", "content": "ab"}]}] * 2,
        "eval_dataset": [{"prompt": conv("ab="), "answer": "ab"}],
    }
    datasets = {role: Dataset.from_list(rows[role])}
    if role == "eval_dataset":
        datasets["pretrain_dataset"] = Dataset.from_list(TEXT)

    def build_with(**template):
        config = TRAPOConfig(
            output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, report_to="none",
            save_strategy="no", activation_checkpointing=False, max_prompt_length=32, response_length=4,
            pretrain_max_length=16,
            num_generations=2, **template,
        )  # fmt: skip
        reward = {"reward_funcs": exact_match_reward} if role == "train_dataset" else {}
        return TRAPOTrainer(build_tiny_model(bare, seed=0), args=config, processing_class=bare, **reward, **datasets)

    message = api_error(build_with, f"`{role}` column 'prompt' holds conversations", "no chat template")
    assert "tokenizer.chat_template" in message and "plain text" in message
    build_with(chat_template_kwargs={"chat_template": CHAT_TEMPLATE})


def test_a_dataset_given_after_construction_is_checked_against_the_tokenizer_as_at_construction(tmp_path):
    """Trial 15's N45: conversations passed to `evaluate(ds)` with a tokenizer without a chat template got "row 0
    could not be rendered ... Fix the row", though the rows were fine; the same data at construction got "the
    tokenizer has no chat template". Every late entry point now says what construction says; an image column with a
    tokenizer too."""
    bare = build_char_tokenizer()
    bare.chat_template = None
    config = TRAPOConfig(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, report_to="none", save_strategy="no",
        activation_checkpointing=False, max_prompt_length=32, response_length=4, num_generations=2,
    )  # fmt: skip
    suite_rows = Dataset.from_list(RL)
    trainer = TRAPOTrainer(
        build_tiny_model(bare, seed=0), reward_funcs=exact_match_reward, args=config, processing_class=bare,
        train_dataset=suite_rows,
    )  # fmt: skip
    chats = Dataset.from_list([{"prompt": conv("ab="), "answer": "ab"}] * 2)
    for call, role in [
        (lambda: trainer.evaluate(chats), "eval_dataset"),
        (lambda: trainer.evaluate({"chat": chats}), "eval_dataset['chat']"),
        (lambda: trainer.generate_completions(dataset=chats), "eval_dataset"),
    ]:
        message = api_error(call, f"`{role}` column 'prompt' holds conversations", "no chat template")
        assert "could not be rendered" not in message and "Fix the row" not in message, message
    with_images = Dataset.from_list([{"prompt": "ab=", "answer": "ab", "images": None}] * 2)
    api_error(lambda: trainer.evaluate(with_images), "`eval_dataset` has an 'images' column", "cannot read images")
    assert trainer.evaluate(suite_rows)["eval_reward"] >= 0.0  # text rows need no template


def test_missing_values_in_reward_columns_reach_the_reward_function(tmp_path, tok):
    """Reward columns are the user's: a None there is passed as it is (a reward function may return None for "cannot
    score", as `numeric_answer_reward` does for a reference without a number)."""
    seen = []

    def reward(completions, answer, **kwargs):
        seen.extend(answer)
        return [None if a is None else 0.0 for a in answer]

    build(tmp_path, tok, reward=reward, train_dataset=[RL[0], {"prompt": "cd=", "answer": None}])
    assert None in seen


def test_a_missing_demonstration_is_no_demonstration_never_the_text_nan(tmp_path, tok):
    from trl_trapo.data import tokenize_demonstrations, tokenize_prompt_dataset

    rows = tokenize_prompt_dataset(
        Dataset.from_list([{"prompt": "ab=", "demo": "ab"}, {"prompt": "cd=", "demo": None}]), tok, 16
    )
    out = tokenize_demonstrations(rows, "demo", tok, [tok.eos_token_id], 8)
    assert out["demonstration_ids"][1] == []
    nan_rows = tokenize_prompt_dataset(Dataset.from_list([{"prompt": "ab=", "demo": math.nan}]), tok, 16)
    with pytest.raises(ValueError, match="No row of `train_dataset` keeps a demonstration"):  # NaN is not "nan"
        tokenize_demonstrations(nan_rows, "demo", tok, [tok.eos_token_id], 8)


UNKNOWN = [
    (dict(train_dataset=[RL[0], {"prompt": "🙂🙂", "answer": "x"}]), r"`train_dataset` column 'prompt' row 1"),
    (
        dict(train_dataset=[{"prompt": conv("ab="), "answer": "ab"}, {"prompt": conv("🙂 🙂"), "answer": "x"}]),
        r"`train_dataset` column 'prompt' row 1",
    ),
    (dict(sft_dataset=[SFT[0], {"prompt": "ab=", "completion": "😀"}]), r"`sft_dataset` column 'completion' row 1"),
    (dict(pretrain_dataset=[TEXT[0], {"text": "😀 😀\n"}]), r"`pretrain_dataset` column 'text' row 1"),
    (dict(pretrain_dataset=TEXT, eval_dataset=[{"prompt": "🙂"}]), r"`eval_dataset` column 'prompt' row 0"),
]


@pytest.mark.parametrize(("datasets", "message"), UNKNOWN)
def test_a_row_of_nothing_but_unknown_tokens_is_refused(tmp_path, tok, datasets, message):
    with pytest.raises(ValueError, match=message + r".*nothing but characters the tokenizer cannot represent"):
        build(tmp_path, tok, **datasets)


def test_unknown_tokens_are_counted_and_warned_with_examples(tmp_path, tok, caplog):
    rows = [RL[0], {"prompt": "ab🙂=", "answer": "ab"}, {"prompt": "c🙂🙂=", "answer": "c"}]
    with caplog.at_level("WARNING", logger="trl_trapo.data"):
        build(tmp_path, tok, train_dataset=rows)
    text = caplog.text
    assert "`train_dataset` column 'prompt': 2 rows hold 3 characters the tokenizer cannot represent" in text
    assert "row 1: '🙂' in 'ab🙂='" in text and "row 2: '🙂' in 'c🙂🙂='" in text  # the characters, where


NOT_NUMBERS = [("1", "str"), ([1.0], "list"), (b"1", "bytes"), ({"score": 1}, "dict"), (1 + 2j, "complex")]


@pytest.mark.parametrize(("value", "kind"), NOT_NUMBERS)
def test_a_reward_that_is_not_a_number_is_refused_at_construction(tmp_path, tok, value, kind):
    def stringly_reward(completions, **kwargs):
        return [value for _ in completions]

    with pytest.raises(
        ValueError, match=rf"Reward function 'stringly_reward' returned .* \({kind}\) for completion 0"
    ):
        build(tmp_path, tok, reward=stringly_reward, train_dataset=RL)


def test_a_reward_column_missing_from_an_eval_set_is_refused_at_construction(tmp_path, tok):
    """The construction-time reward check ran on train rows only: an eval set whose answer column is named
    differently failed at the first evaluation, after training steps, without saying which dataset (trial 4's N139).
    A set of SFT rows is evaluated by loss, not by rewards, and needs no reward column."""

    def needs_answer(completions, answer, **kwargs):
        return [float(c == a) for c, a in zip(completions, answer)]

    other = [{"prompt": "ab=", "solution": "ab"}]
    with pytest.raises(
        RuntimeError, match=r"first 1 row\(s\) of `eval_dataset\['held'\]`.*'needs_answer' failed"
    ) as error:
        build(tmp_path, tok, reward=needs_answer, train_dataset=RL, eval_dataset={"ok": RL, "held": other})
    assert "`eval_dataset['held']` has columns ['prompt', 'solution'], the RL prompts (train_dataset) have" in str(
        error.value
    )
    build(tmp_path, tok, reward=needs_answer, train_dataset=RL, eval_dataset={"ok": RL, "sft": SFT})


def test_conversations_stored_as_json_text_are_refused_with_the_fix(tmp_path, tok):
    """A CSV stores a conversation as the JSON text of its list of messages; it was trained on as a plain-text prompt,
    brackets and quotes included (trial 4's N141). Text that merely starts with a bracket is still a prompt."""
    as_text = [{"prompt": json.dumps([{"role": "user", "content": r["prompt"]}]), "answer": r["answer"]} for r in RL]
    with pytest.raises(ValueError, match=r"`train_dataset` column 'prompt' row 0 is text that holds a JSON list of"):
        build(tmp_path, tok, train_dataset=as_text)
    sft = [{"prompt": "ab=", "completion": json.dumps([{"role": "assistant", "content": "ab"}])}]
    with pytest.raises(
        ValueError, match=r"`sft_dataset` column 'completion' row 0 .*json\.loads\(r\['completion'\]\)"
    ):
        build(tmp_path, tok, sft_dataset=sft)
    build(tmp_path, tok, train_dataset=[{"prompt": "[ab]=", "answer": "ab"}, {"prompt": "[1, 2]=", "answer": "3"}])


NO_TEXT = [
    # (datasets, the message's dataset, column(s), row count and what they hold)
    (
        dict(pretrain_dataset=[{"text": ""}] * 5),
        r"`pretrain_dataset` column 'text' is empty in all 5 rows \(every value ''\)",
    ),
    (
        dict(train_dataset=[{"prompt": conv(""), "answer": "a"}] * 3),
        r"`train_dataset` column 'prompt' is empty in all 3 rows \(no message with content\)",
    ),
    (
        dict(train_dataset=[{"prompt": "", "answer": "a"}] * 3),
        r"`train_dataset` column 'prompt' is empty in all 3 rows \(every value ''\)",
    ),
    (
        dict(sft_dataset=[{"messages": conv("") + [{"role": "assistant", "content": ""}]}] * 4),
        r"`sft_dataset` column 'messages' is empty in all 4 rows",
    ),
    (
        dict(sft_dataset=[{"prompt": "", "completion": ""}] * 2),
        r"`sft_dataset` columns 'prompt' and 'completion' are empty in all 2 rows",
    ),
    (
        dict(pretrain_dataset=TEXT, eval_dataset=[{"text": ""}] * 2),
        r"`eval_dataset` column 'text' is empty in all 2 rows",
    ),
]


@pytest.mark.parametrize(
    "datasets, message", NO_TEXT, ids=["text", "conv-prompts", "prompts", "messages", "pairs", "eval"]
)
def test_a_dataset_with_no_text_in_any_row_is_refused_at_construction(tmp_path, tok, datasets, message):
    """Trial 15's N49 / C21: a pretraining dataset whose `text` values were all "" passed construction, then failed at
    the first step ("produced no tokens"), after the model load and the initial evaluation; all-empty conversational
    prompts or `messages` trained on the template's boilerplate. Each is refused with the dataset, the column and the
    row count, by the checks made before any model loads (`check_datasets`, no tokenizer)."""
    from trl_trapo.data import check_datasets
    from trl_trapo.objectives import WITH_DATA

    with pytest.raises(ValueError, match=message) as error:
        build(tmp_path, tok, **datasets)
    assert "Fix: fill" in str(error.value) and "drop the dataset" in str(error.value)
    given = {k: Dataset.from_list(v) for k, v in datasets.items()}
    names = {"pretrain_dataset": "pretrain", "train_dataset": "rl", "sft_dataset": "sft"}
    config = TRAPOConfig(output_dir=str(tmp_path), report_to="none", max_steps=1)
    with pytest.raises(ValueError, match=message):  # no tokenizer, no model: the checks before any model loads
        check_datasets(
            config, {names[k]: v for k, v in given.items() if k in names}, given.get("eval_dataset"), WITH_DATA
        )


def test_a_few_rows_without_text_among_others_are_still_accepted(tmp_path, tok):
    """Only a dataset with no text at all is refused: an empty pretraining document among others is skipped (it adds
    no token) and whitespace is text."""
    trainer = build(tmp_path, tok, pretrain_dataset=TEXT + [{"text": ""}, {"text": "  \n"}])
    trainer.train()
    assert trainer.state.global_step == 1


def test_cli_refuses_a_data_file_without_text_before_the_first_evaluation(tmp_path, monkeypatch, capsys):
    """Trial 15's C21: `--pretrain_dataset_name` a JSONL whose `text` values are all "" ran the initial evaluation
    (minutes on a real model), then died at the first step with a traceback naming `pretrain_dataset`, exit 1. Now:
    one `error:` line naming the flag, the column and the row count, exit 2, before the evaluation."""
    empty = write_jsonl(tmp_path / "pre_empty.jsonl", [{"text": ""}] * 32)
    code, out = run_cli_here("--max_steps", "1", "--pretrain_dataset_name", str(empty), cwd=tmp_path,
                             monkeypatch=monkeypatch, capsys=capsys)  # fmt: skip
    cli_error(code, out, "`--pretrain_dataset_name` column 'text' is empty in all 32 rows")
    assert code == 2
    assert "Evaluation" not in out and "pretrain_dataset`" not in out, out[-2000:]


def test_cli_refuses_missing_values_in_local_data_files(tmp_path, monkeypatch, capsys):
    rl = write_jsonl(tmp_path / "rl.jsonl", [{"prompt": "ab=", "answer": "ab"}, {"prompt": None, "answer": "x"}])
    code, out = run_cli_here("--max_steps", "1", "--dataset_name", str(rl), cwd=tmp_path, monkeypatch=monkeypatch,
                             capsys=capsys)  # fmt: skip
    cli_error(
        code,
        out,
        "`--dataset_name` column 'prompt' has a missing value (None) at row 1",  # the flag, not `train_dataset`
        "dataset.filter(lambda row: row['prompt'] is not None)",  # the fix
    )
    sft = write_jsonl(
        tmp_path / "sft.jsonl", [{"prompt": "ab=", "completion": "ab"}, {"prompt": "c", "completion": None}]
    )
    code, out = run_cli_here("--max_steps", "1", "--sft_dataset_name", str(sft), cwd=tmp_path,
                             monkeypatch=monkeypatch, capsys=capsys)  # fmt: skip
    cli_error(code, out, "`--sft_dataset_name` column 'completion' has a missing value (None) at row 1")
    # refused before anything was written (the output_dir check may have created the empty folder, as the Trainer would)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, tok) -> Path:
    """A tiny teacher saved where `--teacher_model_name_or_path` can load it."""
    folder = tmp_path_factory.mktemp("teacher")
    build_tiny_model(tok, seed=1).save_pretrained(folder)
    return folder


# slow script runs: default-run sibling: test_cli_errors_the_trainer_raises_name_the_flag_the_user_typed[<id>-here]
@pytest.mark.parametrize(
    "case, needles, where",
    here_and_in_the_script(
        [
            (
                "distill-demonstrations",  # the reported one: `distillation_dataset` has a 'completion' column
                [
                    "`--distillation_dataset_name` has a 'completion' column",
                    "pass demonstrations as `--sft_dataset_name`",
                ],
            ),
            ("distill-missing", ["`--distillation_dataset_name` column 'prompt' has a missing value (None) at row 1"]),
            ("pretrain-missing", ["`--pretrain_dataset_name` column 'text' has a missing value (None) at row 1"]),
            (
                "eval-missing",
                ["`--dataset_name` (held-out split) column 'prompt' has a missing value (None) at row 1"],
            ),
            (
                "teacher-without-prompts",
                ["A teacher (`--teacher_model_name_or_path`) scores", "`--distillation_dataset_name`"],
            ),
        ],
        ids=[
            "distill-demonstrations",
            "distill-missing",
            "pretrain-missing",
            "eval-missing",
            "teacher-without-prompts",
        ],
        default_script_case="distill-demonstrations",
    ),
)
def test_cli_errors_the_trainer_raises_name_the_flag_the_user_typed(
    tmp_path, teacher_dir, monkeypatch, capsys, case, needles, where
):
    """Errors about data (and models) raised while the trainer is built named its Python arguments
    (`distillation_dataset`, `pretrain_dataset`, `eval_dataset`, `teacher_model`), which a command-line user never
    typed; they name the flag (`--distillation_dataset_name`, ...), as the job's own errors do."""
    teacher = ["--teacher_model_name_or_path", str(teacher_dir)]
    if case == "distill-demonstrations":
        data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ab=", "completion": "ab"}])
        args = ["--distillation_dataset_name", str(data), *teacher]
    elif case == "distill-missing":
        data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ab="}, {"prompt": None}])
        args = ["--distillation_dataset_name", str(data), *teacher]
    elif case == "pretrain-missing":
        data = write_jsonl(tmp_path / "p.jsonl", [{"text": "abc"}, {"text": None}])
        args = ["--pretrain_dataset_name", str(data)]
    elif case == "eval-missing":
        folder = tmp_path / "rl"
        folder.mkdir()
        write_jsonl(folder / "train.jsonl", RL)
        write_jsonl(folder / "test.jsonl", [RL[0], {"prompt": None, "answer": "x"}])
        args = ["--dataset_name", str(folder)]
    else:  # a teacher, no distillation prompts and no RL
        args = [*teacher, "--rl_weight", "0"]
    code, out = run_case(where, "--max_steps", "1", *args, cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    message = cli_error(code, out, *needles)
    named = re.findall(
        r"(?<![\w-])(distillation_dataset|pretrain_dataset|eval_dataset|train_dataset|sft_dataset)\b", message
    )
    assert not named, f"the message names trainer arguments {named}:\n{message}"


@pytest.mark.parametrize(
    "message, expected",
    [
        ("`sft_dataset` column 'x'", "`--sft_dataset_name` column 'x'"),
        ("pass `reward_funcs` and/or `reward_model`", "pass `--reward_funcs` and/or `--reward_model_name_or_path`"),
        ("drop the value_model or set x", "drop the --value_model_name_or_path or set x"),
        ("`eval_dataset` row 0", "`--dataset_name` (held-out split) row 0"),
        ("pass `teacher_model` (or set teacher_model_name_or_path).", "pass `--teacher_model_name_or_path`."),
        ("A teacher (`teacher_model` / teacher_model_name_or_path)", "A teacher (`--teacher_model_name_or_path`)"),
        # left alone: flags, config fields and longer names that contain an argument's name
        ("--sft_dataset_name, sft_dataset_split, pretrain_dataset_name", None),
        ("TRAPOConfig.teacher_model_name_or_path='x'; `eval_dataset['a']`", None),
    ],
)
def test_flag_names_turns_trainer_arguments_into_flags(message, expected):
    assert cli.flag_names(message) == (message if expected is None else expected)


@pytest.mark.parametrize("kind", ["streaming", "splits"])
def test_ppo_trainer_refuses_a_train_dataset_it_cannot_size_by_name(tmp_path, kind):
    """PPOTrainer sizes the run from `len(train_dataset)` before TRAPOTrainer's checks: a streaming set was a raw
    `TypeError`, a `DatasetDict` was sized by its number of splits."""
    from datasets import DatasetDict

    from trl_trapo import PPOConfig, PPOTrainer

    prompts = Dataset.from_list([{"input_ids": [5, 6]}] * 4)
    dataset = prompts.to_iterable_dataset() if kind == "streaming" else DatasetDict({"train": prompts})
    message = r"`train_dataset` is an IterableDataset" if kind == "streaming" else r"`train_dataset` is a DatasetDict"
    with pytest.raises(ValueError, match=message):
        PPOTrainer(
            args=PPOConfig(output_dir=str(tmp_path), report_to="none"),
            processing_class=None,
            model=None,
            ref_model=None,
            reward_model=None,
            train_dataset=dataset,
        )


# ---- interrupts and launches ----
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.slow
def test_cli_interrupted_during_training_saves_says_how_to_resume_and_exits(tmp_path, sig):
    """Ctrl-C / a preemption mid-run: a complete checkpoint, one line naming it and the resume flag, exit 130 / 143,
    no traceback, no final model or results (the run is not finished)."""
    out = tmp_path / "out"
    args = ("--max_steps", "300", "--save_strategy", "steps", "--save_steps", "2", "--output_dir", str(out))
    args = cli_args((*args, "--max_eval_samples", "8"), tmp_path)  # the evaluation before training: 8 prompts
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal, even if pytest's is not
    )
    first = out / "checkpoint-2" / "trapo" / "rank0.complete.json"
    deadline = time.monotonic() + 240
    try:
        while not first.exists():  # training has started
            assert process.poll() is None, f"the run ended early:\n{process.stdout.read()[-3000:]}"
            assert time.monotonic() < deadline, "no checkpoint-2 in time"
            time.sleep(0.02)
        process.send_signal(sig)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + sig, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if "Interrupted by" in line]
    assert len(lines) == 1, output[-3000:]
    found = re.search(
        rf"Interrupted by {sig.name} at step (\d+): saved the complete checkpoint (\S+)\. Resume with the same command "
        r"plus `--resume_from_checkpoint (\S+)`",
        lines[0],
    )
    assert found, lines[0]
    step = int(found[1])
    assert 2 < step < 300 and found[2] == found[3] == str(out / f"checkpoint-{step}")
    verify_checkpoint(found[2], 1)
    assert not (out / "eval_results.json").exists() and not (out / "model.safetensors").exists()


@pytest.mark.slow  # two interpreters and a training run; default-run sibling: tests/test_saving.py's in-use tests
def test_a_second_run_into_the_folder_of_a_running_one_is_refused(tmp_path):
    """Two runs started into one --output_dir (trial 15's C18): both trained and overwrote each other's checkpoints
    and model file by file. The second is refused at once, naming the first; the first's lock goes with it."""
    out = tmp_path / "out"
    args = ("--max_steps", "300", "--save_strategy", "steps", "--save_steps", "2", "--output_dir", str(out))
    log = tmp_path / "first.log"  # a file, not a pipe: its progress bars must never block it
    with open(log, "w") as handle:
        first = subprocess.Popen(
            [sys.executable, str(SCRIPT), *cli_args((*args, "--max_eval_samples", "8"), tmp_path)],
            cwd=tmp_path,
            env=cli_env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 240
    try:
        while not (out / "checkpoint-2" / "trapo" / "rank0.complete.json").exists():  # the first run is training
            assert first.poll() is None, f"the first run ended early:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no checkpoint-2 in time"
            time.sleep(0.05)
        code, output = run_cli(*args, "--learning_rate", "0.01", cwd=tmp_path)
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    errors = log.read_text()
    assert code == 2, output[-3000:]
    assert re.search(
        rf"error: --output_dir {re.escape(str(out))} is in use by another run \(pid {first.pid}, started "
        r"\d\d:\d\d:\d\d\): two runs writing into one folder replace each other's checkpoints",
        output,
    ), output[-3000:]
    assert first.returncode == 143, errors[-3000:]  # the first run went on, and stopped as told
    assert "Interrupted by SIGTERM" in errors and not (out / "_trapo_run.lock").exists()


def test_cli_whose_reader_goes_away_saves_and_exits_141(tmp_path):
    """`trapo train ... | head` (trial 15's C16): once the reader of stdout has gone, the run stops at the end of the
    step with a complete checkpoint, one line on stderr, exit 141 (128 + SIGPIPE), no traceback."""
    out = tmp_path / "out"
    args = cli_args(
        ("--max_steps", "300", "--logging_steps", "1", "--max_eval_samples", "8", "--output_dir", str(out)), tmp_path
    )
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in process.stdout:  # as `head` does: read until a training step's line, then go away
            if "'loss'" in line:
                break
        process.stdout.close()
        _, errors = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 141, errors[-3000:]
    assert "Traceback" not in errors and "BrokenPipeError" not in errors, errors[-3000:]
    assert "stdout was closed (the program reading it went away): finishing the current optimizer step" in errors
    found = re.search(
        r"Stopped because the output was closed \(SIGPIPE: the program reading it went away\) at step (\d+): saved the "
        r"complete checkpoint (\S+)\. Resume with the same command plus `--resume_from_checkpoint (\S+)`",
        errors,
    )
    assert found, errors[-3000:]
    assert 1 <= int(found[1]) < 300 and found[2] == found[3] == str(out / f"checkpoint-{found[1]}")
    verify_checkpoint(found[2], 1)


def test_a_closed_output_outside_training_is_one_line_and_exit_141(tmp_path):
    """A `BrokenPipeError` of stdout outside the training steps (loading, evaluation, the summary): one line on stderr,
    exit 141, no traceback, and none at the interpreter's exit either (stdout points at os.devnull)."""
    code = (
        "from trl_trapo.jobs.main import exits_cleanly\n"
        "with exits_cleanly():\n"
        "    while True:\n"
        "        print('x' * 100, flush=True)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    process.stdout.readline()
    process.stdout.close()
    _, errors = process.communicate(timeout=120)
    assert process.returncode == 141, errors[-3000:]
    assert errors.strip().splitlines()[-1] == (
        "Stopped because the output was closed (SIGPIPE: the program reading it went away) outside the training "
        "steps (only those stop at a checkpoint): nothing more was saved."
    ), errors[-3000:]
    assert "Traceback" not in errors and "Exception ignored" not in errors, errors[-3000:]


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
@pytest.mark.parametrize("terminal", ["pipes", "closed"])
def test_cli_saves_and_stops_when_its_terminal_closes(tmp_path, terminal):
    """Trial 15's C20: SIGHUP (an ssh session dropped, a terminal window closed) killed the run at once, exit 129,
    nothing saved. Now it stops as on SIGTERM: the step finishes, a complete checkpoint is saved, exit 129 without a
    traceback, the resume line on stderr ("pipes"). With "closed", the run's stdout / stderr are a terminal that is
    closed before the SIGHUP arrives, as when ssh drops: every write to it fails (EIO), and the run still saves."""
    import pty
    import select
    import threading

    out = tmp_path / "out"
    args = ("--max_steps", "300", "--save_strategy", "steps", "--save_steps", "2", "--output_dir", str(out))
    args = cli_args((*args, "--max_eval_samples", "8"), tmp_path)
    if terminal == "closed":
        master, slave = pty.openpty()
        streams = dict(stdout=slave, stderr=slave)
    else:
        streams = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args], cwd=tmp_path, env=cli_env(), stdin=subprocess.DEVNULL, text=True,
        start_new_session=True, **streams,
        # SIGHUP's default action in the child even when this test runs under `nohup` (SIG_IGN is inherited, and a
        # run under nohup rightly goes on)
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )  # fmt: skip
    if terminal == "closed":
        os.close(slave)
        reading = threading.Event()
        reading.set()

        def drain():  # read what the run writes until the terminal closes (a full terminal would block the run)
            while reading.is_set():
                if select.select([master], [], [], 0.1)[0]:
                    try:
                        os.read(master, 65536)
                    except OSError:
                        return

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
    first = out / "checkpoint-2" / "trapo" / "rank0.complete.json"
    deadline = time.monotonic() + 240
    try:
        while not first.exists():  # training has started
            assert process.poll() is None, "the run ended early"
            assert time.monotonic() < deadline, "no checkpoint-2 in time"
            time.sleep(0.02)
        if terminal == "closed":
            reading.clear()
            reader.join()
            os.close(master)  # the terminal hangs up: from now on every write to it fails
        process.send_signal(signal.SIGHUP)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGHUP, (process.returncode, stdout, stderr and stderr[-3000:])
    checkpoints = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    step = checkpoints[-1]
    assert 2 < step < 300
    verify_checkpoint(str(out / f"checkpoint-{step}"), 1)
    assert not (out / "eval_results.json").exists() and not (out / "model.safetensors").exists()
    if terminal == "pipes":
        assert "Traceback" not in stderr, stderr[-3000:]
        assert "Interrupted by" not in stdout
        assert f"Interrupted by SIGHUP at step {step}: saved the complete checkpoint {out / f'checkpoint-{step}'}" in (
            stderr
        )
        assert "SIGHUP received: finishing the current optimizer step" in stderr


def test_ctrl_c_outside_training_is_one_line_and_exit_130(capsys):
    with pytest.raises(SystemExit) as exit_:
        with cli.exits_cleanly():
            raise KeyboardInterrupt
    assert exit_.value.code == 130
    assert capsys.readouterr().err.strip() == (
        "Interrupted by SIGINT outside the training steps (only those stop at a checkpoint): nothing more was saved."
    )
    with pytest.raises(SystemExit) as exit_:
        with cli.exits_cleanly():
            raise TrainingInterrupted(Interruption(signal.SIGTERM, 5, "/runs/out/checkpoint-5"))
    assert exit_.value.code == 143
    assert capsys.readouterr().out.strip().startswith("Interrupted by SIGTERM at step 5")


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
def test_the_line_of_a_run_stopped_by_sighup_goes_to_stderr_and_a_gone_terminal_is_no_error(capsys, monkeypatch):
    """After SIGHUP the terminal may be gone: the resume line goes to stderr, and a write that fails there (EIO,
    EPIPE) changes nothing: the exit status stays 129 (the checkpoint is saved)."""
    stopped = TrainingInterrupted(Interruption(signal.SIGHUP, 4, "/runs/out/checkpoint-4"))
    with pytest.raises(SystemExit) as exit_:
        with cli.exits_cleanly():
            raise stopped
    assert exit_.value.code == 129
    said = capsys.readouterr()
    assert said.out == "" and said.err.strip().startswith("Interrupted by SIGHUP at step 4")

    class Gone:
        def write(self, text):
            raise OSError(5, "Input/output error")

        def flush(self):
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(sys, "stderr", Gone())
    with pytest.raises(SystemExit) as exit_:
        with cli.exits_cleanly():
            raise stopped
    assert exit_.value.code == 129


@pytest.mark.skipif(torch.cuda.device_count() > 1, reason="with several GPUs accelerate launches several processes")
def test_accelerate_launch_of_two_processes_that_starts_one_is_refused(tmp_path):
    """`accelerate launch --num_processes 2` without `--multi_gpu` runs one process on a machine without GPUs: refused
    before anything is loaded, saying what to pass."""
    out = tmp_path / "out"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.accelerate_cli",
            "launch",
            "--num_processes",
            "2",
            "--main_process_port",
            str(free_port()),
            str(SCRIPT),
            "--max_steps",
            "2",
            "--output_dir",
            str(out),
        ],  # fmt: skip
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode != 0, output[-3000:]
    message = "`accelerate launch` was asked for --num_processes 2 but started this process alone"
    # said once, by the one process that started (accelerate >= 1.16 also quotes the child's stderr in its own
    # CalledProcessError traceback, as "RuntimeError: trapo.py: error: ..."; that quote is not a second report)
    reports = [line for line in output.splitlines() if line.startswith(f"trapo.py: error: {message}")]
    assert len(reports) == 1, output[-3000:]
    assert "Pass `--multi_gpu`, e.g. `accelerate launch --multi_gpu --num_processes 2 examples/trapo.py ...`" in output
    assert not out.exists()  # refused before anything was built or written


class FakeLauncher:
    """Stands for `psutil.Process(parent)`: the launcher's environment and command line."""

    def __init__(self, environ: dict | None, cmdline: list[str]):
        self._environ, self._cmdline = environ, cmdline

    def __call__(self, pid):
        return self

    def environ(self):
        if self._environ is None:
            import psutil

            raise psutil.AccessDenied()
        return self._environ

    def cmdline(self):
        return self._cmdline


LAUNCHER_ARGV = ["python", "accelerate", "launch", "--num_processes=4", "examples/trapo.py"]


def test_processes_started_advice_drops_cpu(monkeypatch):
    """`accelerate launch --num_processes 2 --cpu` starts one process; following the advice to add `--multi_gpu`
    while keeping `--cpu` was accelerate's own "You can only use one of `--cpu`, `--multi_gpu`" traceback (ACC03)."""
    import psutil

    from trl_trapo.distributed import check_processes_started

    for name in ("WORLD_SIZE", "RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    # what accelerate's simple launcher exports for `--cpu --num_processes 2` (`prepare_simple_launcher_cmd_env`)
    env = {"ACCELERATE_DYNAMO_BACKEND": "NO", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for name, value in {**env, "ACCELERATE_USE_CPU": "True"}.items():
        monkeypatch.setenv(name, value)
    argv = ["python", "accelerate", "launch", "--num_processes", "2", "--cpu", "examples/trapo.py"]
    monkeypatch.setattr(psutil, "Process", FakeLauncher({}, argv))
    with pytest.raises(ValueError, match=r"Pass `--multi_gpu` instead of `--cpu` \(accelerate takes only one"):
        check_processes_started()


@pytest.mark.parametrize(
    ("launcher_env", "child_env", "outcome"),
    [
        ({}, {}, "error"),  # the launcher set MASTER_ADDR (asked for 4) and started one process
        ({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, {}, "ok"),  # the user's own MASTER_ADDR, one process
        ({}, {"WORLD_SIZE": "4", "RANK": "0"}, "ok"),  # torchrun / --multi_gpu: really distributed
        (None, {}, "warning"),  # the launcher's environment cannot be read: say it, do not refuse
    ],
    ids=["lost-processes", "inherited-master-addr", "torchrun", "unreadable"],
)
def test_processes_started_check(monkeypatch, caplog, launcher_env, child_env, outcome):
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    import psutil

    from trl_trapo.distributed import check_processes_started

    for name in ("WORLD_SIZE", "RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    env = {"ACCELERATE_DYNAMO_BACKEND": "NO", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", **child_env}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(psutil, "Process", FakeLauncher(launcher_env, LAUNCHER_ARGV))
    if outcome == "error":
        with pytest.raises(ValueError, match=r"asked for --num_processes 4 but started this process alone") as error:
            check_processes_started()
        assert "accelerate launch --multi_gpu --num_processes 4 examples/trapo.py" in str(error.value)
        assert "instead of `--cpu`" not in str(error.value)  # the launcher was not given --cpu
    else:
        check_processes_started()
        assert ("started this process alone" in caplog.text) == (outcome == "warning")


def test_predict_and_a_non_path_resume_are_refused_by_name(tmp_path, tokenizer, suite, tiny_trainer):
    """`trainer.predict(dataset)` was a `KeyError: 'ticket'` from the collator, and
    `train(resume_from_checkpoint=42)` posixpath's TypeError (trial 5: W37, W33)."""
    trainer = tiny_trainer(tmp_path, tokenizer, suite)
    with pytest.raises(NotImplementedError, match=r"TRAPOTrainer has no `predict`: use `trainer.evaluate\(dataset\)`"):
        trainer.predict(suite.rl_train)
    # trial 14's N25: it sent users to generate_completions() "for sampled completions", which are greedy, of the
    # eval set; the pointer now passes the rows by name and says what comes back
    with pytest.raises(NotImplementedError, match=r"generate_completions\(dataset=dataset\)` for the policy's greedy"):
        trainer.predict(suite.rl_train)
    with pytest.raises(
        TypeError, match=r"resume_from_checkpoint=42 \(int\) is not a path: pass a checkpoint folder's path, True"
    ):
        trainer.train(resume_from_checkpoint=42)
    assert trainer.state.global_step == 0 and not list(tmp_path.glob("checkpoint-*"))


def eval_trainer(tmp_path, tokenizer, suite) -> TRAPOTrainer:
    """A one-step trainer with two named eval sets and 3 rows per eval batch."""
    return TRAPOTrainer(
        build_tiny_model(tokenizer, seed=0),
        reward_funcs=exact_match_reward,
        args=TRAPOConfig(output_dir=str(tmp_path), report_to="none", max_steps=1, per_device_eval_batch_size=3),
        train_dataset=suite.rl_train,
        eval_dataset={"rl": suite.eval, "more": suite.eval.select(range(2))},
        processing_class=tokenizer,
    )


def test_eval_and_test_dataloaders_serve_the_rows_as_grpo_does(tmp_path, tokenizer, suite):
    """Trial 10's TM04: `next(iter(trainer.get_eval_dataloader(ds)))` (to look at eval batches) was `KeyError:
    'ticket'` from the step-ticket collator. The eval and test dataloaders serve the rows as TRL's GRPOTrainer does
    (its collator is `identity`): lists of row dicts, `per_device_eval_batch_size` each; `prediction_step`, which
    would need the loss collator's batches, says what to use instead."""
    trainer = eval_trainer(tmp_path, tokenizer, suite)
    batch = next(iter(trainer.get_eval_dataloader("rl")))
    assert batch == [suite.eval[i] for i in range(3)]
    assert [len(b) for b in trainer.get_eval_dataloader(suite.eval.select(range(4)))] == [3, 1]
    assert next(iter(trainer.get_test_dataloader(suite.eval))) == batch
    with pytest.raises(ValueError, match=r"eval_dataset is a dict; name one of its keys \['rl', 'more'\]"):
        trainer.get_eval_dataloader()
    with pytest.raises(NotImplementedError, match=r"no `prediction_step`: use `trainer.evaluate\(dataset\)`"):
        trainer.prediction_step(trainer.model, batch, prediction_loss_only=True)


def test_train_with_a_search_trial_is_refused_before_anything_runs(tmp_path, tokenizer, suite):
    """Trial 10's TM07: `train(trial={"learning_rate": 1e-3})` ended in transformers' "Unknown type for trial" after
    the model was prepared (transformers applies a trial only inside hyperparameter_search, which TRAPO refuses). It
    is refused first, naming the config field to set instead."""
    trainer = eval_trainer(tmp_path, tokenizer, suite)
    with pytest.raises(
        ValueError, match=r"train\(trial=\{'learning_rate': 0.001\}\): `trial` is the hyperparameter"
    ) as error:
        trainer.train(ignore_keys_for_eval=["x"], trial={"learning_rate": 1e-3})
    assert "TRAPOConfig(learning_rate=0.001, ...)" in str(error.value)
    assert trainer.state.global_step == 0 and not list(tmp_path.glob("checkpoint-*"))


def test_compute_loss_on_a_batch_of_ones_own_says_what_to_use(tmp_path, tokenizer, suite):
    """Trial 10's TM10: `trainer.compute_loss(model, {"input_ids": ...})` (a Trainer-subclass habit) said only why it
    could not; it now names evaluate() and the objective seam."""
    trainer = eval_trainer(tmp_path, tokenizer, suite)
    with pytest.raises(TypeError, match=r"compute_loss needs the step's StepContext") as error:
        trainer.compute_loss(trainer.model, {"input_ids": torch.tensor([[1, 2, 3]])})
    assert "call trainer.evaluate(dataset)" in str(error.value) and "docs/seams.md" in str(error.value)


@pytest.mark.parametrize("disabled", ["no_grad", "inference_mode", "set_grad_enabled"])
def test_train_with_gradients_disabled_is_refused_before_anything_runs(
    tmp_path, tokenizer, suite, tiny_trainer, disabled
):
    """Trial 9's PX68 / PX69: `trainer.train()` inside `torch.no_grad()` or `torch.inference_mode()` (a notebook cell
    after evaluation code) ran a rollout and then failed at the first backward with torch's "element 0 of tensors
    does not require grad and does not have a grad_fn". It is refused at the start of `train()`, naming the cause
    and the fix, before a step runs or anything is written; outside the context the same trainer trains."""
    trainer = tiny_trainer(tmp_path, tokenizer, suite, max_steps=1)
    context = {
        "no_grad": torch.no_grad,
        "inference_mode": torch.inference_mode,
        "set_grad_enabled": lambda: torch.set_grad_enabled(False),
    }[disabled]
    with context(), pytest.raises(RuntimeError) as error:
        trainer.train()
    if disabled == "inference_mode":  # trial 14's N52: set_grad_enabled(True) was offered, and does not lift it
        assert "train() was called inside `torch.inference_mode()`" in str(error.value), error.value
        assert "torch.set_grad_enabled(True) does not change that" in str(error.value)
    else:
        assert "train() was called with gradients disabled" in str(error.value), error.value
        assert "torch.no_grad()" in str(error.value) and "torch.set_grad_enabled(True) first" in str(error.value)
    assert trainer.state.global_step == 0 and not list(tmp_path.glob("checkpoint-*"))
    trainer.train()
    assert trainer.state.global_step == 1


def test_a_trainer_built_in_inference_mode_trains_outside_it(tmp_path, tokenizer, suite, tiny_trainer):
    """Trial 14's N52: a trainer built inside `torch.inference_mode()` (a notebook cell wrapped in it) made its state
    tensors there, as inference tensors, and `train()` outside the block, as the refusal inside it says, failed with
    torch's "Inplace update to inference tensor outside InferenceMode" (trl_trapo/schedules.py). Construction now
    runs with inference mode off, so that trainer trains; the inference mode of the caller is restored after."""
    model = build_tiny_model(tokenizer, seed=0)
    with torch.inference_mode():
        trainer = tiny_trainer(tmp_path, tokenizer, suite, model=model, max_steps=1)
        assert torch.is_inference_mode_enabled() and not torch.is_grad_enabled()
    assert not trainer.schedules.window.is_inference()
    trainer.train()
    assert trainer.state.global_step == 1
    with torch.no_grad():  # outside inference mode the call is unchanged: grad mode stays off inside
        from trl_trapo.setup_checks import built_outside_inference_mode

        assert built_outside_inference_mode(torch.is_grad_enabled)() is False
    with torch.inference_mode():
        assert built_outside_inference_mode(lambda: torch.ones(1).is_inference())() is False


def test_a_model_built_in_inference_mode_is_refused_at_construction(tmp_path, tokenizer, suite, tiny_trainer):
    """Trial 14's N53: a model loaded inside `torch.inference_mode()` (an evaluation cell) has inference-tensor
    parameters; the trainer took it and the first training forward failed with torch's "Inference tensors cannot be
    saved for backward". It is refused at construction, naming the argument and the fix; a critic likewise."""
    with torch.inference_mode():
        model = build_tiny_model(tokenizer, seed=0)
    with pytest.raises(ValueError, match=r"`model` \(\w+\) was created inside `torch.inference_mode\(\)`") as error:
        tiny_trainer(tmp_path, tokenizer, suite, model=model)
    assert "are inference tensors (e.g. 'model.embed_tokens.weight'" in str(error.value)
    assert "build or load the model outside `with torch.inference_mode():`" in str(error.value)
    from trl_trapo.models import check_not_inference_tensors

    with pytest.raises(ValueError, match=r"`value_model` \(\w+\) was created inside"):
        check_not_inference_tensors("value_model", model)
    check_not_inference_tensors("model", build_tiny_model(tokenizer, seed=0))  # built outside: taken


def test_hyperparameter_search_is_refused_by_name(tmp_path, tokenizer, suite, tiny_trainer):
    """Trial 9's TR07: `trainer.hyperparameter_search()` ended in transformers' "No hyperparameter search backend
    available" (install optuna, ...), and with a backend in "pass your model through a model_init function", which
    TRAPOTrainer refuses: advice that led nowhere. It now says TRAPOTrainer does not support it and what to do."""
    trainer = tiny_trainer(tmp_path, tokenizer, suite)
    with pytest.raises(NotImplementedError, match=r"TRAPOTrainer does not support hyperparameter_search\(\)") as error:
        trainer.hyperparameter_search(n_trials=1, backend="optuna")
    assert "one trainer per setting" in str(error.value)


def test_eval_on_start_without_an_eval_dataset_is_refused_at_construction(tmp_path, tokenizer, suite, tiny_trainer):
    """Trial 9's CM21 through the Python API: `eval_on_start=True` without an `eval_dataset` was accepted at
    construction and failed in `train()` with "No `eval_dataset`", after the models were wrapped. It is now refused
    when the trainer is built, naming `eval_on_start` and the fixes."""
    with pytest.raises(
        ValueError, match=r"TRAPOConfig.eval_on_start=True evaluates before the first step, and there "
    ):
        tiny_trainer(tmp_path, tokenizer, suite, eval_on_start=True)


@pytest.mark.parametrize("strategy", ["steps", "epoch"])
def test_eval_strategy_without_an_eval_dataset_is_refused_before_the_models_load(
    tmp_path, tokenizer, suite, tiny_trainer, monkeypatch, strategy
):
    """Trial 11's N25: `eval_strategy="steps"` without an `eval_dataset` was transformers' traceback from
    `Trainer.__init__`, after the policy was built and the datasets tokenized. It is now one message of the
    construction's checks, naming the field, its value and both fixes."""
    from trl_trapo import assembly

    def loaded(*args, **kwargs):
        raise AssertionError("the policy was built before the check that refuses the run")

    monkeypatch.setattr(assembly, "build_policy", loaded)
    with pytest.raises(ValueError) as raised:
        tiny_trainer(tmp_path, tokenizer, suite, eval_strategy=strategy, eval_steps=1)
    assert str(raised.value) == (
        f"TRAPOConfig.eval_strategy='{strategy}' evaluates during training, and there is no eval_dataset. Fix: pass "
        'eval_dataset= to the trainer, or set eval_strategy="no".'
    )


@pytest.mark.parametrize(
    "error, said",
    [
        (
            RuntimeError("[gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:1956."),
            "another process of this run",
        ),
        (RuntimeError("a fault of the program"), "RuntimeError: a fault of the program"),
    ],
)
def test_a_rank_that_fails_on_several_processes_exits_at_once(monkeypatch, capsys, error, said):
    """Trial 9's CD01: on a multi-process run a failed rank must not reach `end_process_group`'s barrier (the others
    wait for it in a collective: the run hung). `exits_cleanly` now exits such a rank at once with status 1 (here the
    exit is recorded instead), with its traceback, or, for a collective that failed because another rank's process
    ended (gloo's "Connection closed by peer"), one line saying so: that rank printed the cause."""
    from trl_trapo.jobs import main as job

    exits = []
    monkeypatch.setattr(job, "in_process_group_of_several", lambda: True)
    monkeypatch.setattr(job, "exit_failed_rank", exits.append)
    monkeypatch.setattr(job, "end_process_group", lambda: pytest.fail("a failed rank waited for the others"))
    monkeypatch.setattr(job, "LOST_PEER_GRACE_S", 0.0)  # the wait for the launcher to see the failed rank first
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(RuntimeError):
        with job.exits_cleanly():
            raise error
    err = capsys.readouterr().err
    assert exits == [1] and said in err, err
    assert ("Traceback" in err) == ("closed by peer" not in str(error)), err
