"""The notebooks' first cell: one source (``runtime.BOOTSTRAP``), every copy checked by ``publish lint``."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from kaggle_utils import publish, runtime

REPO = Path(__file__).resolve().parent.parent


def code_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def write_notebook(path: Path, first: str, rest: str = "from kaggle_utils import surgery\n") -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A notebook"),
                                         nbformat.v4.new_code_cell(first), nbformat.v4.new_code_cell(rest)])
    nbformat.write(nb, str(path))
    return path


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_runtime_prints_the_one_source():
    done = subprocess.run([sys.executable, "-m", "kaggle_utils.runtime", "--bootstrap"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == runtime.BOOTSTRAP


def test_readme_and_every_notebook_hold_it_verbatim():
    notebooks = sorted((REPO / "notebooks").glob("*.ipynb"))
    assert len(notebooks) >= 4
    for nb in notebooks:
        assert code_cells(nb)[0].rstrip() == runtime.BOOTSTRAP.rstrip(), nb.name
    assert textwrap.indent(runtime.BOOTSTRAP, "   ") in (REPO / "README.md").read_text()
    assert publish.lint([*notebooks, REPO / "README.md"]) == []


def test_a_stale_notebook_copy_is_reported_and_fixed(tmp_path, capsys):
    stale = runtime.BOOTSTRAP.replace('"input/*/*/*"', '"input/*/*"')
    path = write_notebook(tmp_path / "stale.ipynb", stale)
    problems = publish.lint([path])
    assert [(p.key, p.fixed) for p in problems] == [("cells[bootstrap]", False)], problems
    assert "line 5" in problems[0].message and "expected" in problems[0].message
    assert publish.main(["lint", str(path)]) == 1
    assert publish.main(["lint", "--fix", str(path)]) == 0
    assert code_cells(path)[0] == runtime.BOOTSTRAP.rstrip("\n")
    assert code_cells(path)[1] == "from kaggle_utils import surgery\n"  # the rest untouched
    assert publish.lint([path]) == []


def test_a_missing_bootstrap_is_reported_not_invented(tmp_path):
    path = write_notebook(tmp_path / "bare.ipynb", "import numpy as np\n")
    before = path.read_text()
    problems = publish.lint([path], fix=True)
    assert [(p.key, p.fixed) for p in problems] == [("cells[bootstrap]", False)]
    assert "not the kit's bootstrap" in problems[0].message
    assert path.read_text() == before
    # a notebook that does not use the kit needs no bootstrap
    assert publish.lint([write_notebook(tmp_path / "plain.ipynb", "print(1)\n", "print(2)\n")]) == []


def test_a_changed_readme_block_names_its_line(tmp_path):
    readme = (REPO / "README.md").read_text()
    changed = readme.replace('_root = os.environ.get("KAGGLE_UTILS_ROOT", "/kaggle")',
                             '_root = os.environ.get("KAGGLE_ROOT", "/kaggle")')
    assert changed != readme
    path = tmp_path / "README.md"
    path.write_text(changed)
    marker_line = changed.splitlines().index(next(line for line in changed.splitlines()
                                                   if line.strip() == runtime.BOOTSTRAP.splitlines()[0])) + 1
    problems = publish.lint([path])
    assert [(p.key, p.fixed) for p in problems] == [(f"line {marker_line}", False)], problems
    assert "KAGGLE_ROOT" in problems[0].message


def test_an_edited_setup_line_is_reported_never_rewritten(tmp_path):
    """The natural edit (a model in the first cell) is the user's: --fix leaves it and names the settings cell."""
    edited = runtime.BOOTSTRAP.replace("RT = runtime.setup()", 'RT = runtime.setup(model="tf_efficientnetv2_s")')
    settings = 'MODEL = "tf_efficientnetv2_s"\nRT = RT.configure(model=MODEL)\n'
    path = write_notebook(tmp_path / "edited.ipynb", edited, settings)
    before = path.read_text()
    problems = publish.lint([path], fix=True)
    assert [(p.key, p.fixed) for p in problems] == [("cells[bootstrap]", False)], problems
    assert "settings cell" in problems[0].message and "RT.configure" in problems[0].message
    assert path.read_text() == before
    # a stale copy whose setup line is the bootstrap's is still brought up to date, the settings cell untouched
    stale = runtime.BOOTSTRAP.replace('"input/*/*/*"', '"input/*/*"')
    path = write_notebook(tmp_path / "stale.ipynb", stale, settings)
    assert publish.main(["lint", "--fix", str(path)]) == 0
    assert code_cells(path) == [runtime.BOOTSTRAP.rstrip("\n"), settings]
