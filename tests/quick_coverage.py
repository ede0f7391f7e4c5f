"""Which quick test covers each kit module: run the quick tier under coverage, one context per test, and write
``tests/quick_coverage.json`` ({module: the quick test that ran most of its functions' lines}), which
``test_tiers.py`` checks against the modules and the tests as they are now.

    pip install coverage && python tests/quick_coverage.py     # from the repository root; 1.5x the tier's time

A module-level line (imports, definitions) runs on import, so only lines inside functions count: a module whose
functions no quick test calls is not covered, however often it is imported.
"""
import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("kaggle_utils", "weights_port")
OUT = REPO / "tests" / "quick_coverage.json"
CHECK = "test_every_kit_module_has_a_quick_test_that_runs_its_functions"


def kit_modules() -> list[str]:
    """The kit's modules, as paths from the repository root (``__init__`` and ``__main__`` files included)."""
    return sorted(str(p.relative_to(REPO)) for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def function_lines(path: Path) -> set[int]:
    """The lines inside function bodies of ``path``."""
    lines = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            body = node.body if isinstance(node.body, list) else [node.body]
            lines.update(range(body[0].lineno, node.end_lineno + 1))
    return lines


def main() -> int:
    import coverage

    with tempfile.TemporaryDirectory() as folder:  # the coverage files: the map is what is kept
        work = Path(folder)
        rcfile = work / "coveragerc"
        rcfile.write_text(f"[run]\ndata_file = {work / '.coverage'}\ndynamic_context = test_function\n"
                          f"source = {','.join(PACKAGES)}\nconcurrency = thread\nparallel = true\n"
                          f"patch = subprocess\n")  # the xdist workers measured too, each to its own file
        rc = subprocess.call([sys.executable, "-m", "coverage", "run", f"--rcfile={rcfile}", "-m", "pytest", "-q",
                              "-m", "not slow", "-n", "2", "-p", "no:cacheprovider", "tests",
                              "--deselect", f"tests/test_tiers.py::{CHECK}"], cwd=REPO)  # the check of the map to write
        if rc != 0:
            print(f"the quick tier failed (exit {rc}); the map is not written", file=sys.stderr)
            return rc
        subprocess.check_call([sys.executable, "-m", "coverage", "combine", f"--rcfile={rcfile}", "-q"], cwd=REPO)
        data = coverage.CoverageData(basename=str(work / ".coverage"))
        data.read()
        mapping = {}
        for measured in data.measured_files():
            module = str(Path(measured).resolve().relative_to(REPO))
            inside, lines_by_test = function_lines(Path(measured)), {}
            for line, contexts in data.contexts_by_lineno(measured).items():
                for context in contexts if line in inside else ():
                    test_module, _, name = context.partition(".")  # "test_job.test_x": the test function's module
                    if test_module.startswith("test_") and name.startswith("test_"):
                        nodeid = f"{test_module}.py::{name}"
                        lines_by_test[nodeid] = lines_by_test.get(nodeid, 0) + 1
            if lines_by_test:
                mapping[module] = max(lines_by_test.items(), key=lambda item: (item[1], item[0]))[0]
        OUT.write_text(json.dumps(dict(sorted(mapping.items())), indent=1) + "\n")
        missing = [module for module in kit_modules() if module not in mapping and function_lines(REPO / module)]
        print(f"wrote {OUT}: {len(mapping)} modules; no quick test runs a function of: {', '.join(missing) or 'none'}")
        return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
