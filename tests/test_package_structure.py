"""The package's shape: every module imports, imports go one way (no cycle, between modules and between packages),
each package sits in its layer, and a long module says why it is one concern.

The import graph is read from the source (``ast``), so it includes imports inside functions:
"imports one way" is about the design, not only about what Python would trip over at import time.
A cycle that is known and not fixed yet is listed below by name, with why; the tests fail when one is
fixed and still listed, so the list only shrinks.
"""
import ast
import importlib
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "kaggle_utils"
LONG = 400  # past this a module is warned about, unless its docstring says why it is one concern
SIZE_REASON = "Size:"  # ... in a paragraph opening with this
NEVER_ONE_CONCERN = 2 * LONG  # past this, no reason makes a module one concern: a failure

# strongly connected groups of modules that import each other, known and not fixed yet
KNOWN_CYCLES: dict = {}  # data.augment <-> data.tfrecords went with pipeline.py

# The layers, lowest first: a package (or a base module) imports only what sits in its own layer or below.
LAYERS = [
    {"kaggle_utils", "xla_cpu", "compilation", "config", "metrics", "parallel", "precision", "variable_trees",
     "checkpoint", "outdir", "randaugment_ops", "registry"},  # base modules: jax, flax, numpy and each other
    {"efficientnet", "models", "surgery", "device_augment", "data", "train"},  # the models, surgery, input, engine
    {"runtime", "report"},  # the notebooks' machine set-up; a run's words and pictures
    {"run"},  # one training run from a TrainConfig, and what is made of runs (cv, predict)
    {"job", "__main__"},  # command lines
]
TOOLING = {"publish"}  # release tooling: imported by nothing of the kit


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted((REPO / PACKAGE).rglob("*.py"))}


def resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (``from .. import x`` -> the parent package)."""
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str) -> set[str]:
    """The kit modules ``name`` imports anywhere in its source (top level or inside functions)."""
    path = MODULES[name]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = resolve(name, path.name == "__init__.py", node)
            # `from pkg import sub` imports the submodule when there is one, else names of pkg
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # `import a.b.c` of a name inside a module: its module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle_and_the_resolver_reads_relative_imports():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    assert "kaggle_utils.variable_trees" in GRAPH["kaggle_utils.train.steps"]  # `from .. import variable_trees`
    assert "kaggle_utils.checkpoint" in GRAPH["kaggle_utils.runtime"]  # a lazy import inside a function
    assert "kaggle_utils.surgery.inheritance" in GRAPH["kaggle_utils.surgery.variants"]


@pytest.mark.parametrize("name", [n for n in MODULES if not n.endswith("__main__")])
def test_every_module_imports(name):
    importlib.import_module(name)


def test_no_import_cycle_but_the_known_ones():
    found = set(cycles(GRAPH))
    new = [sorted(c) for c in found - set(KNOWN_CYCLES)]
    assert not new, f"import cycles: {new}; make the imports go one way"
    fixed = [sorted(c) for c in set(KNOWN_CYCLES) - found]
    assert not fixed, f"listed in KNOWN_CYCLES but gone: {fixed}; remove them from the list"


def unit(module: str) -> str:
    """The package (or base module) a module belongs to: ``kaggle_utils.run.cv`` -> ``run``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


UNITS = {unit(name) for name in MODULES}
UNIT_GRAPH = {u: {unit(t) for n in MODULES if unit(n) == u for t in GRAPH[n]} - {u} for u in UNITS}


def test_no_package_imports_another_that_imports_it():
    assert not cycles(UNIT_GRAPH), f"package-level import cycles: {[sorted(c) for c in cycles(UNIT_GRAPH)]}"


LAYER_OF = {u: i for i, layer in enumerate(LAYERS) for u in layer}


def upward(imports) -> list[str]:
    """Of ``(importer's package, imported package, what)`` triples, those that import tooling or a higher layer."""
    return sorted(what for u, t, what in imports
                  if u != t and u in LAYER_OF and (t in TOOLING or LAYER_OF.get(t, len(LAYERS)) > LAYER_OF[u]))


def test_every_package_sits_in_a_layer_and_imports_none_above_it():
    assert UNITS - TOOLING <= set(LAYER_OF), f"in no layer: {sorted(UNITS - TOOLING - set(LAYER_OF))}"
    found = upward((unit(name), unit(target), f"{name} imports {target}") for name in MODULES for target in GRAPH[name])
    assert not found, f"imports of a package above the importer: {found}"


def test_the_layer_check_catches_an_upward_import():
    assert upward([("report", "run", "report -> run"), ("run", "report", "run -> report"),
                   ("train", "publish", "train -> publish"), ("data", "data", "within")]) == [
        "report -> run", "train -> publish"]


def test_the_training_engine_does_not_import_user_tools():
    engine = {n for n in MODULES if n.startswith("kaggle_utils.train")}
    reached, todo = set(), list(engine)
    while todo:
        for target in GRAPH[todo.pop()] - reached:
            reached.add(target)
            todo.append(target)
    assert not {n for n in reached if n.startswith(("kaggle_utils.surgery", "kaggle_utils.publish"))}, reached


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def test_long_modules_say_why_they_are_one_concern():
    """A module past ``LONG`` lines is warned about unless its docstring says why it is one concern (a split
    along the concern's own seams is usually the better answer); past ``NEVER_ONE_CONCERN`` it fails."""
    lines = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()}
    unexplained = {n: count for n, count in lines.items() if count > LONG and SIZE_REASON not in docstring(MODULES[n])}
    for name, count in sorted(unexplained.items()):
        warnings.warn(f"{name} has {count} lines and no '{SIZE_REASON}' paragraph: is it one concern?")
    huge = {n: count for n, count in lines.items() if count > NEVER_ONE_CONCERN}
    assert not huge, f"modules of more than {NEVER_ONE_CONCERN} lines: {huge}; split them along their concerns"
