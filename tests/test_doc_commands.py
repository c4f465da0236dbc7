# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Every command block of the README and the docs runs in a test, or says why it does not.

The documents are `README.md`, `docs/**/*.md` and `examples/**/*.md`. A *command block* is a fenced code block tagged
`bash`, `sh`, `shell` or `console`, or an untagged one whose first line is a command (`python ...`, `$ pip ...`,
`VAR=1 accelerate ...`); a *Python block* is one tagged `python`. Each must either

- be registered in `REGISTRY` below — its fingerprint (the document and the block's first line) mapped to the test
  that runs it, shortened with flags where it would take minutes — or
- be preceded by an HTML comment `<!-- not-run: reason -->` (the Hub, a GPU, a multi-minute experiment, ...).

Every Python block must also compile. The blocks that run offline on a CPU in seconds run here, from the text of the
document itself: the README's main job (`--max_steps 3 --eval_strategy no`) and quickstart (`max_steps=3`), the main
job page's offline GSM8K path (the tiny model, `--max_steps 3`), the Python guide's example (`max_steps=3`) and the
loading code of `examples/data/README.md`. The install
lines in front of the README's two commands run in `.ci/run`, which must hold the test command verbatim.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/**/*.md", "examples/**/*.md")
SHELL_TAGS = {"bash", "sh", "shell", "console"}
PYTHON_TAGS = {"python", "py"}
# first words that make an untagged block a command block
COMMANDS = {
    "python", "python3", "pip", "pip3", "accelerate", "pytest", "git", "bash", "sh", "cd", "export", "source", ".",
    "ruff", "trl", "uv", "conda", "make", "docker", "deepspeed", "torchrun", "hf", "huggingface-cli", "curl", "wget",
    "mkdir", "cp", "mv", "rm", "ls", "cat",
}  # fmt: skip
NOT_RUN = re.compile(r"^<!--\s*not-run:(.*?)-->\s*$")

# fingerprint ("<document>: <first line of the block>") -> the test that runs the block
REGISTRY = {
    # the main job: its command after the install runs here, shortened; the install is .ci/run's
    "README.md: python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e . && accelerate launch "
    "examples/trapo.py": "tests/test_doc_commands.py::test_readme_main_job_command",
    # the test command: .ci/run runs it verbatim on a fresh clone
    'README.md: python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e ".[dev,deepspeed]" && '
    "pytest": "tests/test_doc_commands.py::test_ci_runs_the_readme_test_command",
    "README.md: from trl_trapo import TRAPOConfig, TRAPOTrainer": "tests/test_doc_commands.py::test_readme_quickstart",
    "docs/results/main_job.md: python scripts/experiments/main_job_seeds.py": (
        "tests/test_result_pages.py::test_main_job_seeds_runs_shortened_and_writes_the_docs_block"
    ),
    "docs/main_job.md: python scripts/gsm8k_to_trl.py examples/data/gsm8k/train_first1500.jsonl --output_dir "
    "data/gsm8k": "tests/test_doc_commands.py::test_offline_gsm8k_commands",
    "docs/python.md: from datasets import load_dataset": "tests/test_doc_commands.py::test_python_guide_example",
    # `--quick`, shortened further
    "docs/results/pipeline.md: python scripts/experiments/compare_pipelines.py # ~20 min on 2 CPU cores; --quick: < 1 "
    "min; --ablations adds rows": (
        "tests/test_compare_pipelines.py::test_smoke_run_serial_vs_trapo_writes_table_csv_and_plots"
    ),
    # `--quick` (the recipe on a tiny model with SmolLM2's tokenizer), run, resumed and rendered
    "docs/results/real_model.md: python scripts/experiments/compare_real.py # 3 arms + the shared initial evaluation; "
    "--quick: < 1 min": (
        "tests/test_compare_real.py::test_quick_run_measures_every_arm_and_resumes_without_rerunning"
    ),
    # the same accelerate configs and flags, with tests/distributed_job.py (examples/trapo.py + per-rank records)
    "docs/distributed.md: accelerate launch --config_file examples/accelerate_configs/multi_gpu.yaml --num_processes 2 "
    "--mixed_precision no examples/trapo.py": (
        "tests/test_distributed.py::test_job_on_two_processes_saves_resumes_and_reloads"
    ),
    "docs/migrating_from_ppo.md: # run: an unchanged 1.12 pipeline, with the settings that remove the intended "
    "differences": "tests/test_ppo_docs.py::test_doc_block_runs",
    "docs/migrating_from_ppo.md: # run: a 1.12 PPO job with PPO-ptx and SFT added": (
        "tests/test_ppo_docs.py::test_doc_block_runs"
    ),
    "examples/data/README.md: from datasets import load_dataset": (
        "tests/test_doc_commands.py::test_example_data_loading_block"
    ),
    "docs/seams.md: # run: an objective of your own": (
        "tests/test_objectives.py::test_the_documented_objective_of_your_own_trains"
    ),
    "docs/writing_a_rollout_source.md: # run: fixed completions as a rollout source": (
        "tests/test_sources.py::test_the_worked_example_trains_on_exactly_its_completions"
    ),
    "docs/agents.md: # run: a tool the policy may call": (
        "tests/test_agents.py::test_the_documented_tool_example_trains"
    ),
    "docs/agents.md: # run: SFT on tool-calling traces": (
        "tests/test_agent_traces.py::test_the_documented_trace_example_trains"
    ),
    # the model folder replaced by a tiny random Llama over SmolLM2's tokenizer; the measurement's `--quick`
    "docs/agents.md: # run: tools with a ChatML model whose template has none": (
        "tests/test_agents_real.py::test_the_documented_chatml_example_trains"
    ),
    "docs/agents.md: python scripts/experiments/agents_real.py # 20 steps; hours on 2 loaded CPU cores": (
        "tests/test_agents_real.py::test_the_measurement_scripts_quick_run_writes_its_results"
    ),
    # shortened to two steps on small data
    "docs/agents.md: python examples/trapo_tools.py": (
        "tests/test_agent_task.py::test_the_documented_example_runs_two_steps_and_writes_its_results"
    ),
    # `--quick`
    "docs/agents.md: python scripts/experiments/compare_agents.py": (
        "tests/test_compare_agents.py::test_quick_run_measures_both_arms_from_one_base_and_reuses_them"
    ),
    "docs/distillation.md: # run: a teacher and reward-free prompts next to the built-in suite": (
        "tests/test_distillation.py::test_the_documented_distillation_example_trains"
    ),
    "docs/writing_a_rollout_source.md: # run: a rollout_func with a tool": (
        "tests/test_rollout_func.py::test_the_documented_rollout_func_trains"
    ),
}
# what the shortened runs append to the README's main-job command lines
SHORT_MAIN_JOB = ["--max_steps", "3", "--eval_strategy", "no"]


# =====================================================================================================================
# Finding the blocks
# =====================================================================================================================
@dataclass(frozen=True)
class Block:
    """One fenced code block of a document."""

    document: str  # path relative to the repository root
    line: int  # 1-based line of the opening fence
    tag: str  # the info string's first word, lower case ("" when untagged)
    text: str  # the block's lines, dedented by the fence's indentation, ending with a newline
    not_run: str | None  # the reason of a `<!-- not-run: ... -->` comment just above the fence, else None

    @property
    def kind(self) -> str | None:
        """'shell', 'python' or None (a block of another kind: YAML, text, an output listing)."""
        if self.tag in SHELL_TAGS:
            return "shell"
        if self.tag in PYTHON_TAGS:
            return "python"
        if self.tag == "" and looks_like_command(self.text):
            return "shell"
        return None

    @property
    def fingerprint(self) -> str:
        """`"<document>: <first non-empty line>"`, whitespace collapsed, without a `$ ` prompt or a trailing `\\`."""
        first = next((line for line in self.text.splitlines() if line.strip()), "")
        first = re.sub(r"^\$\s+", "", first.strip()).removesuffix("\\").strip()
        return f"{self.document}: {' '.join(first.split())}"

    def where(self) -> str:
        """`"<document>:<line>"`, for messages."""
        return f"{self.document}:{self.line}"


def looks_like_command(text: str) -> bool:
    """Whether a block's first non-empty, non-comment line is a shell command (`$ ...`, or a known program, after any
    `VAR=value` assignments)."""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("$ "):
            return True
        words = line.split()
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0]):
            words = words[1:]
        return bool(words) and (words[0] in COMMANDS or words[0].startswith(("./", "scripts/")))
    return False


def parse_blocks(text: str, document: str) -> list[Block]:
    """The fenced code blocks (``` or ~~~, possibly indented) of a Markdown text, in order.

    Raises:
        ValueError: for a fence that is never closed.
    """
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = re.match(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)[^`]*$", lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, tag = opening.groups()
        j = i + 1
        while j < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
            j += 1
        if j == len(lines):
            raise ValueError(f"{document}:{i + 1}: a code fence that is never closed")
        body = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : j]) + "\n"
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = NOT_RUN.match(lines[k].strip()) if k >= 0 else None
        blocks.append(Block(document, i + 1, tag.lower(), body, marker.group(1).strip() if marker else None))
        i = j + 1
    return blocks


def documents() -> list[Path]:
    """The documents whose blocks are checked, sorted."""
    return sorted({path for pattern in DOCUMENTS for path in ROOT.glob(pattern) if ".venv" not in path.parts})


def all_blocks() -> list[Block]:
    """The command and Python blocks of every document."""
    found = []
    for path in documents():
        found += parse_blocks(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    return [block for block in found if block.kind is not None]


def registered_block(fingerprint: str) -> Block:
    """The one block with this fingerprint (which must be in `REGISTRY`)."""
    assert fingerprint in REGISTRY, fingerprint
    matches = [block for block in all_blocks() if block.fingerprint == fingerprint]
    assert len(matches) == 1, f"{len(matches)} blocks have the fingerprint {fingerprint!r}"
    return matches[0]


def block_of(test_name: str) -> Block:
    """The one registered block that `test_name` (a function of this file) runs."""
    names = [key for key, test in REGISTRY.items() if test == f"tests/test_doc_commands.py::{test_name}"]
    assert len(names) == 1, names
    return registered_block(names[0])


def logical_lines(script: str) -> list[str]:
    """The commands of a shell block: continuation lines (`\\` newline) joined, blank and comment lines dropped."""
    joined = re.sub(r"[ \t]*\\\n\s*", " ", script)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def with_flags(commands: list[str], prefix: str, flags: list[str]) -> list[str]:
    """`commands` with `flags` appended to those starting with `prefix` (at least one must)."""
    out = [f"{c} {shlex.join(flags)}" if c.startswith(prefix) else c for c in commands]
    assert out != commands, f"no command starts with {prefix!r}: {commands}"
    return out


def sandbox(path: Path) -> Path:
    """A working directory where the documents' relative paths resolve: `scripts/` and `examples/` link to this
    checkout, so that what the commands write (`data/`, `models/`, output folders) lands in `path`."""
    path.mkdir(parents=True, exist_ok=True)
    for name in ("scripts", "examples"):
        if not (path / name).exists():
            (path / name).symlink_to(ROOT / name)
    return path


def run_shell(commands: list[str], cwd: Path, timeout: int = 300) -> str:
    """Run shell commands (`&&`-joined) in `cwd` with this interpreter's `python` / `accelerate` first on the PATH,
    this checkout importable, offline, one thread; the output, or an assertion error with its end."""
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    script = " && ".join(commands)
    completed = subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, f"`{script}` failed in {cwd}:\n{output[-4000:]}"
    return output


# =====================================================================================================================
# The checker itself
# =====================================================================================================================
def test_every_command_block_runs_in_a_test_or_says_why_not():
    unaccounted = [
        f"{block.where()} ({block.kind}): {block.fingerprint!r}"
        for block in all_blocks()
        if block.not_run is None and block.fingerprint not in REGISTRY
    ]
    assert not unaccounted, (
        "these blocks are neither run by a test nor marked: register each fingerprint in REGISTRY "
        "(tests/test_doc_commands.py) with the test that runs it, or put `<!-- not-run: reason -->` on the line "
        "above the fence:\n" + "\n".join(unaccounted)
    )


def test_registry_names_existing_blocks_and_tests():
    blocks = all_blocks()
    fingerprints = [block.fingerprint for block in blocks]
    for fingerprint, test in REGISTRY.items():
        count = fingerprints.count(fingerprint)
        assert count == 1, f"REGISTRY key {fingerprint!r} matches {count} blocks (a stale or ambiguous entry)"
        block = blocks[fingerprints.index(fingerprint)]
        assert block.not_run is None, f"{block.where()} is both registered and marked not-run"
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file(), test
        functions = {n.name for n in ast.walk(ast.parse((ROOT / path).read_text())) if isinstance(n, ast.FunctionDef)}
        assert name in functions, f"{test}: no such test function"


def test_not_run_reasons_are_given():
    for block in all_blocks():
        if block.not_run is not None:
            assert len(block.not_run) >= 10, f"{block.where()}: say why the block is not run"


def test_python_blocks_compile():
    blocks = [block for block in all_blocks() if block.kind == "python"]
    assert blocks
    for block in blocks:
        compile(block.text, block.where(), "exec")


def test_the_parser_finds_tagged_untagged_console_and_indented_blocks():
    """What the checks above rely on: a block of each kind is found, classified and fingerprinted, and a `not-run`
    comment counts only directly above its fence (blank lines allowed)."""
    text = (
        "# Title\n\n"
        "<!-- not-run: needs the Hub, a GPU and an hour -->\n\n"
        "```bash\npython a.py --x 1 \\\n    --y 2\n```\n\n"
        "```\n$ pip install foo\n```\n\n"
        "```\nDS_ACCELERATOR=cpu accelerate launch b.py\n```\n\n"
        "```\nsome output, not a command\n```\n\n"
        "<!-- not-run: this comment is followed by text, not by a fence -->\ntext\n\n"
        "- a list item:\n\n  ~~~console\n  $ python c.py\n  ~~~\n\n"
        "```python\nimport os\n```\n\n"
        "```yaml\nkey: value\n```\n"
    )
    blocks = [b for b in parse_blocks(text, "doc.md") if b.kind is not None]
    assert [(b.kind, b.fingerprint, b.not_run) for b in blocks] == [
        ("shell", "doc.md: python a.py --x 1", "needs the Hub, a GPU and an hour"),
        ("shell", "doc.md: pip install foo", None),
        ("shell", "doc.md: DS_ACCELERATOR=cpu accelerate launch b.py", None),
        ("shell", "doc.md: python c.py", None),
        ("python", "doc.md: import os", None),
    ]
    assert logical_lines(blocks[0].text) == ["python a.py --x 1 --y 2"]
    with pytest.raises(ValueError, match="never closed"):
        parse_blocks("```bash\nls\n", "doc.md")


# =====================================================================================================================
# The blocks that run here
# =====================================================================================================================
def test_ci_runs_the_readme_test_command():
    """The README's test command (install + `pytest`) is what `.ci/run` runs on a fresh clone, verbatim."""
    (command,) = logical_lines(block_of("test_ci_runs_the_readme_test_command").text)
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert command in ci, f".ci/run does not run the README's test command {command!r}"


@pytest.mark.slow
def test_readme_main_job_command(tmp_path):
    """The README's first command: the install (what `.ci/run` also installs), then the main job, run here as written
    after the install, shortened with `--max_steps 3 --eval_strategy no`; it writes `trapo-output/eval_results.json`."""
    (command,) = logical_lines(block_of("test_readme_main_job_command").text)
    install, _, job = command.rpartition(" && ")
    assert "pip install" in install and job.startswith("accelerate launch examples/trapo.py"), command
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install torch==2.13.0 -e " in ci  # the same pinned torch and editable install as the test command
    work = sandbox(tmp_path)
    output = run_shell(with_flags([job], "accelerate launch examples/trapo.py", SHORT_MAIN_JOB), work)
    results = json.loads((work / "trapo-output" / "eval_results.json").read_text())  # the README's default folder
    for key in ("eval_accuracy", "eval_accuracy_initial", "eval_accuracy_sft_tasks", "eval_accuracy_rl_only"):
        assert 0.0 <= results[key] <= 1.0, key
    assert "Output folder:" in output  # the end-of-job summary


@pytest.fixture(scope="module")
def offline_sandbox(tmp_path_factory) -> tuple[Path, str]:
    """The main job page's offline GSM8K block, run as written with the main job shortened to `--max_steps 3` and its
    held-out evaluation (128 new tokens a prompt) to the first 8 of the 100 test questions; its working directory and
    output."""
    work = sandbox(tmp_path_factory.mktemp("offline"))
    commands = logical_lines(block_of("test_offline_gsm8k_commands").text)
    short = ["--max_steps", "3", "--max_eval_samples", "8"]
    output = run_shell(with_flags(commands, "accelerate launch examples/trapo.py", short), work)
    return work, output


@pytest.mark.slow
def test_offline_gsm8k_commands(offline_sandbox):
    work, _ = offline_sandbox
    for part in ("rl/train.jsonl", "rl/test.jsonl", "sft/train.jsonl", "pretrain/train.jsonl"):
        assert (work / "data" / "gsm8k" / part).is_file(), part
    assert json.loads((work / "models" / "tiny" / "config.json").read_text())["max_position_embeddings"] == 2048
    results = json.loads((work / "tiny-gsm8k" / "eval_results.json").read_text())
    assert "eval_rewards/numeric_answer_reward" in results  # the held-out split rl/test.jsonl was evaluated
    assert "eval_rewards/numeric_answer_reward_initial" in results


def test_offline_numbers_are_the_measured_ones(offline_sandbox):
    """The numbers the main job page gives for the offline path: the longest GSM8K prompt in characters (= tokens of the
    tiny model's tokenizer) and with SmolLM2's tokenizer, `TRAPOConfig`'s defaults, the tiny config's context."""
    from transformers import AutoTokenizer

    from trl_trapo import TRAPOConfig
    from trl_trapo.tasks import build_char_tokenizer

    work, _ = offline_sandbox
    prompts = [
        json.loads(line)["prompt"]
        for split in ("train", "test")
        for line in (work / "data" / "gsm8k" / "rl" / f"{split}.jsonl").read_text().splitlines()
    ]
    char_tokens = max(len(ids) for ids in build_char_tokenizer()(prompts, add_special_tokens=False)["input_ids"])
    smollm2 = AutoTokenizer.from_pretrained(ROOT / "tests" / "fixtures" / "smollm2_tokenizer")
    subword_tokens = max(len(ids) for ids in smollm2(prompts, add_special_tokens=False)["input_ids"])
    defaults = {f.name: f.default for f in dataclasses.fields(TRAPOConfig)}
    tiny_config = json.loads((ROOT / "trl_trapo" / "configs" / "tiny_causal_lm.json").read_text())
    context = tiny_config["max_position_embeddings"]
    page = (ROOT / "docs" / "main_job.md").read_text(encoding="utf-8")
    paragraph = page[page.index("Two settings differ from the Qwen run") :].split("\n\n")[0]
    paragraph = " ".join(paragraph.split())
    needed = 1024 + defaults["response_length"]
    for claim in (
        f"GSM8K prompts take up to {char_tokens} tokens",
        f"default `max_prompt_length` of {defaults['max_prompt_length']}",
        f"= 1024 + {defaults['response_length']} = {needed:,} positions",
        f"the tiny config has {context}",
        f"`sft_max_length` = {defaults['sft_max_length']} tokens",
        f"at most {subword_tokens} tokens long",
    ):
        assert claim in paragraph, f"docs/main_job.md's offline paragraph should say {claim!r}"
    assert char_tokens > defaults["max_prompt_length"] and char_tokens <= 1024 and needed <= 2048 and context < needed
    python_block = block_of("test_python_guide_example").text
    assert f"up to {char_tokens} tokens (default: {defaults['max_prompt_length']})" in python_block


def test_python_guide_example(offline_sandbox, monkeypatch):
    """The Python guide's GSM8K example as written, in the offline commands' folder, with `max_steps=3`: it trains, writes
    `checkpoint-N` folders into its `output_dir` (every `save_steps` and at the end) and saves a loadable model. It runs
    in this process (`run_script`, as `python python_example.py` would): its subject is the code, not the process."""
    from conftest import run_script
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_trapo import TRAPOConfig

    work, _ = offline_sandbox
    code = block_of("test_python_guide_example").text
    assert code.count("max_steps=2000") == 1
    save_steps = {f.name: f.default for f in dataclasses.fields(TRAPOConfig)}["save_steps"]
    assert f"checkpoint-{save_steps}" in code and "checkpoint-2000" in code  # what the comments promise
    (work / "python_example.py").write_text(code.replace("max_steps=2000", "max_steps=3"), encoding="utf-8")
    monkeypatch.chdir(work)
    assert run_script(work / "python_example.py", [], monkeypatch) == 0
    output_dir = work / re.search(r'output_dir="([^"]+)"', code).group(1)
    checkpoint = output_dir / "checkpoint-3"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "optimizer.pt").is_file()
    assert (checkpoint / "trapo").is_dir()  # TRAPO's state, to resume from
    AutoModelForCausalLM.from_pretrained(output_dir)
    AutoTokenizer.from_pretrained(output_dir)


def test_readme_quickstart(tmp_path, monkeypatch, capsys):
    """The README's quickstart as written, in an empty folder, with `max_steps=3`: it builds everything in-process,
    trains the three objectives, saves a checkpoint in its `output_dir` and prints the held-out evaluation."""
    from conftest import run_script

    code = block_of("test_readme_quickstart").text
    assert code.count("max_steps=300") == 1
    assert len(code.strip().splitlines()) <= 22  # short enough to read at a glance
    (tmp_path / "quickstart.py").write_text(code.replace("max_steps=300", "max_steps=3"), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert run_script(tmp_path / "quickstart.py", [], monkeypatch) == 0
    output_dir = tmp_path / re.search(r'output_dir="([^"]+)"', code).group(1)
    assert (output_dir / "checkpoint-3" / "trapo").is_dir()  # a checkpoint with TRAPO's state
    printed = capsys.readouterr().out
    assert "'eval_reward_rl_only'" in printed and "'eval_reward_sft_tasks'" in printed  # the held-out splits


def test_example_data_loading_block(monkeypatch):
    """`examples/data/README.md`'s loading code, as written, from the repository root."""
    monkeypatch.chdir(ROOT)
    namespace: dict = {}
    block = block_of("test_example_data_loading_block")
    exec(compile(block.text, block.where(), "exec"), namespace)
    assert len(namespace["gsm8k"]) == 1500 and len(namespace["gsm8k_eval"]) == 500
    assert namespace["shakespeare"].column_names == ["text"] and len(namespace["heldout"]) > 0


def test_gitignore_covers_what_the_documented_commands_write():
    """The folders the documents' commands create in the repository root are ignored by git."""
    if subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True, check=False).returncode != 0:
        pytest.skip("not a git checkout")
    sys.path.insert(0, str(ROOT / "scripts" / "experiments"))
    import main_job_seeds

    from trl_trapo.jobs.main import BUILTIN_DEFAULTS

    folders = {BUILTIN_DEFAULTS["output_dir"], main_job_seeds.make_parser().get_default("work_dir"), "compare-output"}
    for block in all_blocks():
        folders |= set(re.findall(r"--output_dir[ =]([^\s\\]+)", block.text))
        folders |= set(re.findall(r'output_dir="([^"]+)"', block.text))
    folders = {f for f in folders if not f.startswith(("/", "~", "$", "<"))}
    assert {"trapo-output", "data/gsm8k", "models/tiny", "tiny-gsm8k", "trapo-gsm8k", "qwen-trapo"} <= folders
    for folder in sorted(folders):
        for path in (f"{folder}/x", f"{folder}/checkpoint-500/model.safetensors"):
            ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, check=False).returncode == 0
            assert ignored, f"{path} (written by a documented command) is not in .gitignore"


def test_every_tracker_the_documents_name_is_installed_or_comes_with_its_install_command():
    """`--report_to X` / `report_to: X` / `report_to="X"` in the documents, the examples and the recipes names `none`,
    a backend installed here, or one whose `pip install X` is in the same paragraph (the README once showed
    `--report_to trackio`, which nothing installs)."""
    from transformers.integrations import get_available_reporting_integrations

    installed = set(get_available_reporting_integrations()) | {"none"}
    files = [*documents(), *sorted((ROOT / "examples").rglob("*.py")), *sorted((ROOT / "examples").rglob("*.yaml"))]
    pattern = re.compile(r"""report_to(?:[ =]+|:\s*|=\s*["'])["']?([A-Za-z_]+)""")
    found = []
    for path in files:
        for paragraph in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            for name in pattern.findall(paragraph):
                found.append(name)
                assert name in installed or f"pip install {name}" in paragraph, (
                    f"{path.relative_to(ROOT)}: report_to {name!r} names a tracker that is not installed, and the "
                    f"paragraph does not say `pip install {name}`:\n{paragraph}"
                )
    assert "none" in found and "trackio" in found  # the pattern sees both forms the documents use
