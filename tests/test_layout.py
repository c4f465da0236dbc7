# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""The package's shape: no import cycles (imports inside functions included), the core never importing
`experimental/`, optional capabilities imported only where they are used (a lazy `import trl_trapo`), every module
importable on its own, no module reading another object's underscore attributes, no
collaborator built from the trainer, one definition of the objective order."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import trl_trapo
from trl_trapo.data import PreparedData


PACKAGE = Path(trl_trapo.__file__).parent
ALLOWED_PRIVATE_ACCESS = {
    # transformers' per-class constructor that honours `deepspeed.zero.Init`; the public `AutoModel*.from_config`
    # would require the policy's class to be registered with an Auto class
    ("distributed.py", "type(model)._from_config"),
    # transformers' list of the dict fields whose JSON text `TrainingArguments.__post_init__` parses, which every TRL
    # config extends the same way (`_BaseConfig._VALID_DICT_FIELDS + [...]`)
    ("config.py", "_BaseConfig._VALID_DICT_FIELDS"),
    # argparse's list of a parser's actions, which it has no public accessor for: accelerate's launch parser, read for
    # its options (their names and types), and the job's parser, whose `--curriculum_mixtures` values get a type that
    # takes a JSON object too (HfArgumentParser sets a `list[float]` field's type to float)
    ("launcher.py", "parser._actions"),
    ("main.py", "parser._actions"),
    # Python's documented exit without finalisation (public despite its name): a rank of a multi-process run that
    # failed exits at once, as a child after `fork` does (`distributed.exit_failed_rank`)
    ("distributed.py", "os._exit"),
}


def module_names() -> list[str]:
    names = ["trl_trapo"]
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="trl_trapo."):
        names.append(info.name)
    return sorted(names)


def module_path(name: str) -> Path:
    parts = name.split(".")[1:]
    path = PACKAGE.joinpath(*parts)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def intra_package_imports(name: str, module_level: bool = False) -> set[str]:
    """Modules of the package that `name` imports anywhere: at module level and inside functions or methods
    (relative or absolute). An import inside a function runs later, but it is still a dependency: one that closes a
    cycle only hides a layering mistake (the lower module reaching back up), so it counts. Imports under
    `if TYPE_CHECKING:` never run (they name types for annotations only) and do not count. With `module_level`, only
    the imports that run when `name` is imported (none inside a function or method)."""
    tree = ast.parse(module_path(name).read_text())
    is_package = module_path(name).name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]
    skipped = not_run_at_import(tree) if module_level else type_only_nodes(tree)
    out = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - node.level + 1]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("trl_trapo"):
                known = set(module_names())
                for alias in node.names:  # `from . import x` may name a submodule
                    candidate = f"{target}.{alias.name}"
                    out.add(candidate if candidate in known else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("trl_trapo"))
    return {m for m in out if m != name}


def type_only_nodes(tree: ast.AST) -> set[int]:
    """The ids of the nodes under `if TYPE_CHECKING:` (never run)."""
    return {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for statement in node.body
        for inner in ast.walk(statement)
    }


def not_run_at_import(tree: ast.AST) -> set[int]:
    """The ids of the nodes that do not run when the module is imported: under `if TYPE_CHECKING:` or inside a
    function, method or lambda body."""
    inside = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for inner in ast.walk(node)
        if inner is not node
    }
    return inside | type_only_nodes(tree)


def test_no_import_cycle():
    graph = {name: intra_package_imports(name) for name in module_names()}
    # a package's __init__ imports its children by design; a child importing its own package is not a cycle here
    # because Python runs the package __init__ first anyway, so drop child -> ancestor-package edges
    for name, targets in graph.items():
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in graph.get(node, ()):
            if state.get(target) == 1:
                cycle = stack[stack.index(target) :] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name)


# entry points sit on top of everything, optional extensions included: the command line picks few-shot mode's trainer
ENTRY_POINTS = {"trl_trapo.jobs.main", "trl_trapo.cli"}


def test_the_core_never_imports_experimental():
    """Optional extensions sit on top of the core (TRL's `experimental/` convention): no module outside
    `trl_trapo/experimental/` but an entry point imports it, at module level or inside a function. An extension
    plugs in by subclassing (e.g. overriding the trainer's construction hooks), never by the core reaching up."""

    def experimental(module: str) -> bool:
        return module == "trl_trapo.experimental" or module.startswith("trl_trapo.experimental.")

    offenders = [
        f"{name} imports {target}"
        for name in module_names()
        if not experimental(name) and name not in ENTRY_POINTS
        for target in sorted(intra_package_imports(name))
        if experimental(target)
    ]
    assert not offenders, offenders


# optional capabilities (issue 39): the core imports them only inside the function that builds or needs them, so a run
# that does not use them never loads them; the package's `__init__` is lazy (PEP 562) and imports no submodule
OPTIONAL_MODULES = (
    "trl_trapo.agents",
    "trl_trapo.tasks.agent",
    "trl_trapo.jobs.agent",
    "trl_trapo.async_rollouts",
    "trl_trapo.tasks.vision",
    "trl_trapo.jobs.vision",
    "trl_trapo.jobs",
    "trl_trapo.cli",
    "trl_trapo.tasks",
    "trl_trapo.experimental",
)
OPTIONAL_LIBRARIES = ("vllm", "deepspeed")


def is_optional(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in OPTIONAL_MODULES + OPTIONAL_LIBRARIES)


def library_imports_at_module_level(name: str) -> set[str]:
    """The top-level names of the libraries outside the package that `name` imports when it is imported."""
    tree = ast.parse(module_path(name).read_text())
    skipped = not_run_at_import(tree)
    out = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
    return out


def test_the_core_imports_optional_capabilities_only_where_it_uses_them():
    offenders = [
        f"{name} imports {target} at module level"
        for name in module_names()
        if not is_optional(name)
        for target in sorted(intra_package_imports(name, module_level=True) | library_imports_at_module_level(name))
        if is_optional(target)
    ]
    assert not offenders, offenders
    assert intra_package_imports("trl_trapo", module_level=True) == set(), "trl_trapo/__init__.py must stay lazy"


@pytest.mark.parametrize("source", ["from .agents import AgentSpec", "import deepspeed", "from vllm import LLM"])
def test_the_optional_import_check_catches_each_form(tmp_path, monkeypatch, source):
    (tmp_path / "core.py").write_text(f"{source}\n\ndef build():\n    from .async_rollouts import x\n")
    monkeypatch.setattr(sys.modules[__name__], "module_path", lambda name: tmp_path / "core.py")
    found = intra_package_imports("trl_trapo.core", module_level=True) | library_imports_at_module_level("core")
    assert [m for m in found if is_optional(m)] == [source.split()[1].replace(".", "trl_trapo.", 1)]


def test_import_trl_trapo_is_lazy_and_every_public_name_resolves():
    """In a fresh interpreter: `import trl_trapo` loads no submodule; the core (`TRAPOTrainer`, `PPOTrainer`, ...)
    loads no optional capability; every name of `__all__` resolves to its module's object and is listed by `dir`
    and `from trl_trapo import *`; a submodule is reachable as an attribute; an unknown name raises AttributeError."""
    script = (
        "import sys\n"
        "import trl_trapo\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('trl_trapo.'))\n"
        "assert loaded == [], f'import trl_trapo loaded {loaded}'\n"
        "from trl_trapo import GRPOConfig, PPOTrainer, TRAPOConfig, TRAPOTrainer\n"
        f"optional = {OPTIONAL_MODULES + OPTIONAL_LIBRARIES!r}\n"
        "loaded = sorted(m for m in sys.modules if any(m == o or m.startswith(o + '.') for o in optional))\n"
        "assert loaded == [], f'the core loaded {loaded}'\n"
        "for name in trl_trapo.__all__:\n"
        "    value = getattr(trl_trapo, name)\n"
        "    assert getattr(sys.modules[value.__module__], name) is value, name\n"
        "assert set(trl_trapo.__all__) <= set(dir(trl_trapo)), set(trl_trapo.__all__) - set(dir(trl_trapo))\n"
        "namespace = {}\n"
        "exec('from trl_trapo import *', namespace)\n"
        "assert set(trl_trapo.__all__) <= set(namespace)\n"
        "assert callable(trl_trapo.tasks.build_tiny_model)\n"
        "try:\n"
        "    trl_trapo.no_such_name\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('trl_trapo.no_such_name resolved')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_every_module_imports_on_its_own():
    """Each module, imported first in a fresh copy of the package (third-party libraries stay loaded, so the run is
    cheap): an import-order dependency or a cycle through a package `__init__` fails here."""
    script = (
        "import importlib, sys, torch, transformers, trl, datasets\n"
        "failures = []\n"
        f"for name in {module_names()!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'trl_trapo' or m.startswith('trl_trapo.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as error:\n"
        "        failures.append(f'{name}: {type(error).__name__}: {error}')\n"
        "print('\\n'.join(failures))\n"
        "sys.exit(1 if failures else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]


def test_no_module_reads_another_objects_underscore_attributes():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            where = (path.name, ast.unparse(node))
            if where not in ALLOWED_PRIVATE_ACCESS:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


def test_no_constructor_takes_the_trainer():
    from trl_trapo import PPOTrainer, TRAPOTrainer

    offenders = []
    for name in module_names():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or issubclass(cls, (TRAPOTrainer, PPOTrainer)):
                continue
            for parameter in inspect.signature(cls.__init__).parameters.values():
                annotation = str(parameter.annotation)
                if parameter.name == "trainer" or "TRAPOTrainer" in annotation or "PPOTrainer" in annotation:
                    offenders.append(f"{name}.{cls.__name__}({parameter.name})")
    assert not offenders, offenders


def test_the_objective_order_is_defined_once():
    from trl_trapo import config, memory

    assert config.OBJECTIVES == ("pretrain", "sft", "rl")
    assert (config.PRETRAIN, config.SFT, config.RL) == (0, 1, 2)
    assert memory.replay.RL is config.RL
    definitions = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign):
                targets = [t for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)]
                if any(t.id in ("PRETRAIN", "SFT", "RL", "OBJECTIVES") for t in targets):
                    definitions.append(path.name)
    assert definitions == ["config.py", "config.py"], definitions


def test_trainer_has_no_mixins():
    from trl_trapo import TRAPOTrainer
    from trl_trapo.trainer import _BaseTrainer

    assert TRAPOTrainer.__bases__ == (_BaseTrainer,)
    assert not list(PACKAGE.glob("trainer_*.py"))


OBJECTIVE_REGISTRY = ("config.py", "objectives.py")  # the built-in names are defined, and objectives are objects, here
OBJECTIVE_NAMES = {"pretrain", "sft", "rl"}
OBJECTIVE_SLOT_CONTAINERS = {"shares", "weights", "factors", "counts", "local", "signals", "active", "mixture"}
# few-shot mode keeps one prototype set per *pool* it draws from (RL prompts, SFT rows), whatever the objectives
ALLOWED_OBJECTIVE_NAMES = {"experimental/fewshot.py"}


def objective_count_assumptions(source: str) -> list[str]:
    """Places in `source` that assume there are exactly three objectives (or name them as a fixed collection):
    `tuple[float, float, float]`, `range(3)`, an integer index into a per-objective container (`local[3]`,
    `counts[4]`, `shares[2]`), a literal tuple / list / set / dict of the built-in names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        text = None
        if isinstance(node, ast.Subscript) and ast.unparse(node).replace(" ", "") == "tuple[float,float,float]":
            text = ast.unparse(node)
        elif isinstance(node, ast.Call) and ast.unparse(node) == "range(3)":
            text = ast.unparse(node)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id in OBJECTIVE_SLOT_CONTAINERS
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, int)
        ):
            text = ast.unparse(node)
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            names = {i.value for i in items if isinstance(i, ast.Constant) and i.value in OBJECTIVE_NAMES}
            if len(names) >= 2:
                text = ast.unparse(node)
        if text is not None:
            found.append(f"{getattr(node, 'lineno', '?')}: {text}")
    return found


def test_only_the_objective_registry_knows_how_many_objectives_there_are():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if (path.name in OBJECTIVE_REGISTRY and path.parent == PACKAGE) or str(
            path.relative_to(PACKAGE)
        ) in ALLOWED_OBJECTIVE_NAMES:
            continue
        offenders += [
            f"{path.relative_to(PACKAGE)}:{where}" for where in objective_count_assumptions(path.read_text())
        ]
    assert not offenders, offenders


@pytest.mark.parametrize(
    "source",
    [
        "def f() -> tuple[float, float, float]: ...",
        "for o in range(3): pass",
        "local[3] += 1",
        "x = counts[4]",
        "names = ('pretrain', 'sft', 'rl')",
        "keys = {'pretrain': 1, 'rl': 2}",
    ],
)
def test_the_objective_count_check_catches_each_form(source):
    assert objective_count_assumptions(source), source


# the jobs and the toy task suites (issue 41) sit on top of the library, as TRL keeps its jobs in `trl/scripts/`
JOB_PACKAGES = ("trl_trapo.jobs", "trl_trapo.tasks", "trl_trapo.cli")


def test_the_core_never_imports_the_jobs_or_the_toy_tasks():
    """No module of the library's core imports `trl_trapo.jobs` (the jobs, the `trapo` command) or `trl_trapo.tasks`
    (the toy task suites), at module level or inside a function: the core trains any model on any data; the jobs and
    the toy tasks are one use of it."""

    def on_top(module: str) -> bool:
        return any(module == p or module.startswith(p + ".") for p in JOB_PACKAGES + ("trl_trapo.experimental",))

    offenders = [
        f"{name} imports {target}"
        for name in module_names()
        if not on_top(name)
        for target in sorted(intra_package_imports(name))
        if on_top(target) and not target.startswith("trl_trapo.experimental")
    ]
    assert not offenders, offenders


# ---- no objective's identity outside its own class and the config (issue 39) --------------------------------------
OBJECTIVE_INDEX_NAMES = {"PRETRAIN", "SFT", "RL"}  # config's indices of the built-in objectives
OBJECTIVE_WEIGHT_FIELDS = {"pretrain_weight", "sft_weight", "rl_weight", "distillation_weight"}
OBJECTIVE_DATA_FIELDS = {"pretrain", "sft", "rl", "distill"}  # `data.PreparedData`'s fields, one per objective
OBJECTIVE_PREFIXES = ("pretrain_", "sft_", "rl_", "distill_")
# the trainer's dataset arguments, one per objective with data (`train_dataset`, `sft_dataset`, ...): as parameters,
# as a collection of names or compared with a name, they spell the objectives out one by one
OBJECTIVE_ARGUMENTS = {"train_dataset", "sft_dataset", "pretrain_dataset", "distillation_dataset"}
# What still spells out more than one objective outside objectives.py and config.py, by (module, function), and why
# it may. A ratchet: each entry must still be found (remove it when its code moves into the objectives), and nothing
# else may appear.
ALLOWED_OBJECTIVE_IDENTITY = {
    ("data.py", "PreparedData.prompt_sets"): "the tokenized datasets of prompts the policy samples (RL, distillation)",
    ("ppo.py", "PPOTrainer.__init__"): "TRL's PPOTrainer derives its batch sizes unless pretraining / SFT data share "
    "the steps",
    ("trainer.py", "TRAPOTrainer.__init__"): "the public API: one dataset argument per objective, TRL's names",
    ("data.py", "named_datasets"): "the trainer's arguments whose rows a chat template renders (all but pretraining's "
    "`text`)",
    ("rl_supply.py", "build_successes"): "self-imitation serves RL's successes as SFT rows: it needs both",
    ("jobs/vision.py", "build_trainer"): "the vision job splits the built-in pretraining and SFT data by modality",
    ("weighting.py", "GACWeighting.__init__"): "GAC weighs SFT against RL by construction (a two-objective method)",
    ("weighting.py", "GACWeighting.value"): "GAC weighs SFT against RL by construction (a two-objective method)",
    ("weighting.py", "GACWeighting.update"): "GAC weighs SFT against RL by construction (a two-objective method)",
}


def objective_identity_leaks(source: str) -> list[tuple[str, str]]:
    """`(enclosing function, code)` of each place in `source` that spells out the built-in objectives one by one: a
    comparison with or an index by `PRETRAIN` / `SFT` / `RL` (`index == RL`, `objectives[PRETRAIN]`), a tuple / list
    / set of two or more objectives' weight fields or datasets (`(args.sft_weight, args.rl_weight)`,
    `(data.rl, data.sft)`), a function with parameters for two or more objectives (`rl_prompts, sft_rows`, or the
    trainer's dataset arguments `train_dataset, sft_dataset`), a collection of two or more of the trainer's dataset
    argument names (`("train_dataset", "sft_dataset")`) or a comparison with one (`role == "sft_dataset"`)."""
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, scope: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = f"{scope}.{node.name}" if scope else node.name
        text = None
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Name) and s.id in OBJECTIVE_INDEX_NAMES for s in sides) or any(
                isinstance(s, ast.Constant) and s.value in OBJECTIVE_ARGUMENTS for s in sides
            ):
                text = ast.unparse(node)
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name):
            if node.slice.id in OBJECTIVE_INDEX_NAMES:
                text = ast.unparse(node)
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            items = [i for i in (node.keys if isinstance(node, ast.Dict) else node.elts) if i is not None]
            attributes = {a.attr for e in items for a in ast.walk(e) if isinstance(a, ast.Attribute)}
            arguments = {c.value for e in items for c in ast.walk(e) if isinstance(c, ast.Constant)}
            if (
                len(attributes & OBJECTIVE_WEIGHT_FIELDS) >= 2
                or len(attributes & OBJECTIVE_DATA_FIELDS) >= 2
                or len(arguments & OBJECTIVE_ARGUMENTS) >= 2
            ):
                text = ast.unparse(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
            prefixes = {p for n in names for p in OBJECTIVE_PREFIXES if n.startswith(p) and not n.endswith("_dataset")}
            if len(prefixes) >= 2 or len(set(names) & OBJECTIVE_ARGUMENTS) >= 2:
                text = f"def {node.name}({', '.join(names)})"
        if text is not None:
            found.append((scope, text))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(ast.parse(source), "")
    return found


def test_no_objectives_identity_outside_its_class_and_the_config():
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent == PACKAGE and path.name in OBJECTIVE_REGISTRY:
            continue
        for scope, text in objective_identity_leaks(path.read_text()):
            found.setdefault((str(path.relative_to(PACKAGE)), scope), []).append(text)
    unexpected = {where: texts for where, texts in found.items() if where not in ALLOWED_OBJECTIVE_IDENTITY}
    assert not unexpected, f"spell the objectives out in their classes (trl_trapo/objectives.py): {unexpected}"
    fixed = set(ALLOWED_OBJECTIVE_IDENTITY) - set(found)
    assert not fixed, f"no longer found, remove from ALLOWED_OBJECTIVE_IDENTITY: {fixed}"


@pytest.mark.parametrize(
    "source",
    [
        "def f(objective):\n    return values if objective == RL else None",
        "state = self.objectives[PRETRAIN].state_dict()",
        "weights = (args.pretrain_weight, args.sft_weight, args.rl_weight)",
        "sets = [d for d in (data.rl, data.distill) if d is not None]",
        "def plan_steps(args, rl_prompts, sft_rows, pretrain_docs): ...",
        "def prepare_datasets(args, tokenizer, train_dataset, sft_dataset, pretrain_dataset): ...",
        "names = ('train_dataset', 'eval_dataset', 'sft_dataset')",
        "summary = {'train_dataset': a, 'distillation_dataset': b}",
        "for role, d, w in (('train_dataset', a, 1.0), ('sft_dataset', b, 1.0)): pass",
        "masked = role == 'sft_dataset'",
    ],
)
def test_the_objective_identity_check_catches_each_form(source):
    assert objective_identity_leaks(source), source


def test_the_built_in_objectives_say_their_own_names():
    from trl_trapo import TRAPOTrainer, config, objectives

    assert tuple(cls.NAME for cls in objectives.BUILT_IN) == config.OBJECTIVES
    for cls in (*objectives.BUILT_IN, objectives.DistillationObjective):
        assert hasattr(config.TRAPOConfig, cls.WEIGHT_FIELD), cls
        assert cls.DATA_FIELD in {f.name for f in dataclasses.fields(PreparedData)}, cls
    # every objective with data is registered once, says its trainer argument, prepares and checks its own data
    assert objectives.WITH_DATA == (*objectives.BUILT_IN, objectives.DistillationObjective)
    assert {cls.ARGUMENT for cls in objectives.WITH_DATA} == OBJECTIVE_ARGUMENTS
    assert {cls.ARGUMENT for cls in objectives.WITH_DATA} <= set(inspect.signature(TRAPOTrainer.__init__).parameters)
    for cls in objectives.WITH_DATA:
        assert "prepare_data" in vars(cls) and "check_data" in vars(cls), cls


def test_the_data_functions_are_driven_by_the_objectives():
    """`prepare_datasets` and `check_datasets` take the objectives' data as one mapping keyed by objective name, and
    the objective classes that prepare it: no parameter per objective (the layout check above catches that too)."""
    from trl_trapo.data import check_datasets, prepare_datasets

    for function in (prepare_datasets, check_datasets):
        parameters = set(inspect.signature(function).parameters)
        assert {"datasets", "objectives"} <= parameters, function
        assert not parameters & OBJECTIVE_ARGUMENTS, function
