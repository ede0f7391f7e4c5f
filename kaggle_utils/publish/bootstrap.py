"""The first cell: the README and every notebook that uses the kit hold ``runtime.BOOTSTRAP`` verbatim.

The cell runs before the kit is importable, so it is copied text, and copies drift (an old search
list finds no kit on Kaggle). These checks compare every copy with the one source; ``lint --fix``
rewrites a notebook's stale copy. A notebook that never names ``kaggle_utils`` needs no bootstrap.
"""
from __future__ import annotations

import textwrap

from ..runtime import BOOTSTRAP

MARKER = BOOTSTRAP.splitlines()[0]  # "# kaggle_utils bootstrap: ..." opens every copy
FENCE = "```"


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def notebook_issue(notebook: dict, *, fix: bool = False) -> str | None:
    """Why the notebook's first code cell is not the bootstrap, or None; ``fix`` replaces a stale copy
    (a first code cell that opens with :data:`MARKER`) in place. A missing cell is not added by ``fix``:
    where it belongs is for a person to say."""
    code = [c for c in notebook.get("cells", []) if isinstance(c, dict) and c.get("cell_type") == "code"]
    if not any("kaggle_utils" in _source(c) for c in code):
        return None
    expected = BOOTSTRAP.rstrip("\n")
    first = _source(code[0])
    if first.rstrip() == expected:
        return None
    if not first.lstrip().startswith(MARKER):
        return ("the first code cell is not the kit's bootstrap, and a later cell imports kaggle_utils: start the "
                "notebook with the cell `python -m kaggle_utils.runtime --bootstrap` prints")
    if fix:
        code[0]["source"] = expected.splitlines(keepends=True)
    return "the bootstrap cell differs from kaggle_utils.runtime.BOOTSTRAP: " + _first_difference(first, expected)


def markdown_issues(text: str) -> list[tuple[int, str]]:
    """``(line number, why)`` for each fenced block holding :data:`MARKER` that is not the bootstrap verbatim."""
    lines = text.splitlines()
    issues = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        start = next((j for j in range(i - 1, -1, -1) if lines[j].strip().startswith(FENCE)), None)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == FENCE), None)
        if start is None or end is None:
            issues.append((i + 1, "the bootstrap is not inside a fenced code block"))
            continue
        block = textwrap.dedent("\n".join(lines[start + 1:end]))
        if block.rstrip() != BOOTSTRAP.rstrip():
            issues.append((i + 1, "the bootstrap block differs from kaggle_utils.runtime.BOOTSTRAP: "
                                  + _first_difference(block, BOOTSTRAP)))
    return issues


def _first_difference(copy: str, expected: str) -> str:
    got, want = copy.rstrip().splitlines(), expected.rstrip().splitlines()
    for n, (a, b) in enumerate(zip(got, want), 1):
        if a != b:
            return f"line {n} is {a!r}, expected {b!r}"
    n = min(len(got), len(want)) + 1
    return f"line {n}: {'extra' if len(got) > len(want) else 'missing'} " \
           f"{(got if len(got) > len(want) else want)[n - 1]!r}"
