"""Progress bars that render where the loop runs: a terminal, a notebook with widgets, or one without.

``tqdm.auto`` picks the widget bar in any notebook and, where ``ipywidgets`` is missing (a bare
Jupyter, nbmake), prints an "IProgress not found" warning and falls back to a text bar whose
carriage returns a saved notebook output keeps as fragments (``eval: 3batch [00:01, ...]``).
So: widgets where they exist (Kaggle's notebooks), text bars in a terminal, and no bars in a
notebook without widgets, where the loop's one line per evaluation is the progress.
"""
from __future__ import annotations

import functools

__all__ = ["progress_bar"]


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


@functools.cache
def _bar_class():
    """The tqdm class for this process, or None where no bar renders cleanly."""
    if not _in_notebook():
        from tqdm.std import tqdm

        return tqdm
    try:
        import ipywidgets  # noqa: F401  (tqdm.notebook needs it to draw)
    except ImportError:
        return None
    from tqdm.notebook import tqdm

    return tqdm


def progress_bar(*, disable: bool = False, **kwargs):
    """A tqdm bar (``write`` included) for this environment; a disabled text bar where none renders."""
    cls = _bar_class()
    if cls is None:
        from tqdm.std import tqdm

        return tqdm(disable=True, **kwargs)
    return cls(disable=disable, **kwargs)
