"""The package's layers (docs/architecture.md#layers): a module imports only from its own layer or a lower
one, siblings of layer 2 not from each other, nothing imports the package's own ``__init__``, the import
graph has no circle (function-local imports counted), the algorithm core loads no Lightning, and the
Python API runs a config through ``lit_ppo.launch`` alone, not the command line's modules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = [
    ["lit_ppo.errors", "lit_ppo.utils"],
    ["lit_ppo.config"],
    ["lit_ppo.algos", "lit_ppo.models"],
    ["lit_ppo.tasks"],
    ["lit_ppo.rollout"],
    ["lit_ppo.training", "lit_ppo.callbacks"],
    ["lit_ppo.run"],
    ["lit_ppo.schedulers"],
    ["lit_ppo.launch"],
    ["lit_ppo.cli", "lit_ppo.api", "lit_ppo.__main__"],
]
"""Bottom to top. Within a layer the packages may import each other, except in layer 2."""
INDEPENDENT = {2}
"""Layers whose packages must not import each other (the math and the models)."""
TOP = {"lit_ppo"}
"""The package itself (its ``__init__`` loads the Python API on first use): above every layer."""


def _source_files() -> dict[str, Path]:
    """Module name -> file, for lit_ppo/ and callbacks/ (installed as lit_ppo.callbacks)."""
    modules = {}
    for top, package in ((ROOT / "lit_ppo", "lit_ppo"), (ROOT / "callbacks", "lit_ppo.callbacks")):
        for path in top.rglob("*.py"):
            parts = [package, *path.relative_to(top).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = _source_files()


def _resolve(name: str) -> str | None:
    """The lit_ppo module that the dotted ``name`` (a module or a name inside one) is or lies in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    """The lit_ppo modules ``module`` imports, anywhere in its file."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            # ``from lit_ppo import schedulers`` imports the module lit_ppo.schedulers, not the package
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        for name in names:
            target = _resolve(name) if name.startswith("lit_ppo") else None
            if target is not None and target != module:
                found.add(target)
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def _layer(module: str) -> tuple[int, str] | None:
    for index, packages in enumerate(LAYERS):
        for package in packages:
            if module == package or module.startswith(package + "."):
                return index, package
    return None


def test_every_module_has_a_layer():
    assert sorted(m for m in MODULES if _layer(m) is None and m not in TOP) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_its_own_layer_or_lower(module):
    place = _layer(module)
    if place is None:
        return
    wrong = []
    for target in sorted(GRAPH[module]):
        there = _layer(target)
        if there is None:
            wrong.append(f"{target} (the package's __init__)")
        elif there[0] > place[0]:
            wrong.append(f"{target} (layer {there[0]}, above layer {place[0]})")
        elif there[0] == place[0] in INDEPENDENT and there[1] != place[1]:
            wrong.append(f"{target} (an independent sibling in layer {place[0]})")
    assert wrong == [], f"{module} imports {', '.join(wrong)}"


def test_the_import_graph_has_no_circle():
    """Tarjan's strongly connected components: each must be a single module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert circles == []


ROOMS = {
    "lit_ppo.rollout.engines": ("lit_ppo.rollout.engines",),
    "lit_ppo.rollout.episodes": ("lit_ppo.rollout.episodes", "lit_ppo.rollout.engines", "lit_ppo.rollout.batch"),
}
"""Rooms inside a layer's package -> what of that package they may import: the engines sample and know nothing
of episodes; the episodes play a task's problems on an engine into the batch layout, below the stream, the
collector and the producer that use them."""


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_a_room_imports_only_the_rooms_below_it(room):
    package = room.rsplit(".", 1)[0]
    wrong = sorted(f"{module} imports {target}" for module in GRAPH if module.startswith(room)
                   for target in GRAPH[module] if target.startswith(package + ".")
                   and not any(target == allowed or target.startswith(allowed + ".") for allowed in ROOMS[room]))
    assert wrong == []


def test_the_task_contracts_live_with_the_tasks():
    # A task implements them (an environment, an agent and the client it is handed) without importing rollout/.
    assert not any(target.startswith("lit_ppo.rollout") for target in GRAPH["lit_ppo.tasks.base"])
    from lit_ppo.tasks import base

    assert {"Environment", "MultiTurnTask", "AgentTask", "ChatClient", "is_agent", "is_multi_turn"} <= set(vars(base))


def test_the_python_api_reaches_no_command_line_module():
    assert sorted(m for m in GRAPH["lit_ppo.api"] if m.startswith("lit_ppo.cli")) == []
    assert any(m.startswith("lit_ppo.launch.") for m in GRAPH["lit_ppo.api"])


def test_layer_checks_see_function_local_imports():
    # The walk must count imports inside functions, or a circle held open by one would pass.
    assert "lit_ppo.launch.ray_worker" in GRAPH["lit_ppo.cli.fit"]


@pytest.mark.parametrize("package", ["lit_ppo.algos", "lit_ppo.config", "lit_ppo.models", "lit_ppo.tasks",
                                     "lit_ppo.training.checkpoint_files", "lit_ppo.run.resume"])
def test_the_math_models_and_tasks_load_no_lightning(package):
    code = (f"import sys, {package}; loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
            f"('lightning', 'pytorch_lightning', 'lightning_fabric')); print(loaded[:3]); sys.exit(bool(loaded))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, f"import {package} loads Lightning: {result.stdout}{result.stderr}"


@pytest.mark.parametrize("module", ["lit_ppo.config", "lit_ppo.launch.presets", "lit_ppo.launch.compose",
                                    "lit_ppo.cli.help", "lit_ppo.cli.fit", "lit_ppo.cli.reporting",
                                    "lit_ppo.launch.run", "lit_ppo.launch.check", "lit_ppo.tasks",
                                    "lit_ppo.models", "lit_ppo.models.teacher", "lit_ppo.training.sft_examples",
                                    "lit_ppo.training.rm_examples"])
def test_the_configs_presets_and_help_load_no_torch(module):
    # `fit --help`, the composition of presets and the checks before a run stay fast: no torch, no Lightning,
    # no transformers until a check needs one (lit_ppo.launch.check); the models' names, a teacher's vocabulary
    # and sft's examples are read without them.
    code = (f"import sys, {module}; loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
            f"('torch', 'lightning', 'transformers')); print(loaded[:3]); sys.exit(bool(loaded))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, f"import {module} loads: {result.stdout}{result.stderr}"


def test_a_run_loads_no_agent_client_nor_vllm_unless_its_config_uses_them():
    # Seconds at the start of every run: the openai SDK (an agent's client) and vLLM load where they are used.
    code = ("import sys, lit_ppo.training.module, lit_ppo.training.datamodule, lit_ppo.launch.lightning_cli; "
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('openai', 'vllm')); "
            "print(loaded[:3]); sys.exit(bool(loaded))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, f"a run loads: {result.stdout}{result.stderr}"


UNIT = ROOT / "tests" / "unit"
NOT_ONE_MODULE = {"tasks/test_registry.py": "lit_ppo.tasks", "algos/test_properties.py": "lit_ppo.algos"}
"""Unit test files that test a package as a whole: its registry (``__init__``), properties across its modules."""


def _tested_module(path: Path) -> str | None:
    """The module a unit test file beside it tests: ``algos/test_losses.py`` -> ``lit_ppo.algos.losses``;
    ``rollout/engines/test_hf_bf16.py`` -> ``lit_ppo.rollout.engines.hf`` (a topic of that module); None if
    no module of that package has the name."""
    relative = path.relative_to(UNIT).as_posix()
    if relative in NOT_ONE_MODULE:
        return NOT_ONE_MODULE[relative]
    package = "lit_ppo." + ".".join(path.relative_to(UNIT).parent.parts)
    words = path.stem.removeprefix("test_").split("_")
    for end in range(len(words), 0, -1):
        module = f"{package}.{'_'.join(words[:end])}"
        if module in MODULES:
            return module
    return None


def test_unit_tests_mirror_the_package():
    # The test of lit_ppo/algos/losses.py is tests/unit/algos/test_losses.py; only cross-cutting tests
    # (the docs, these layers, the suite's scheduling) stand at the top.
    top = sorted(p.name for p in UNIT.glob("test_*.py"))
    assert top == ["test_docs.py", "test_layers.py", "test_suite_scheduling.py"]
    astray = [p.relative_to(UNIT).as_posix() for p in sorted(UNIT.glob("*/**/test_*.py")) if _tested_module(p) is None]
    assert astray == []
