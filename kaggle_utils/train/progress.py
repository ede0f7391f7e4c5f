"""Progress bars that render where the loop runs: widgets in a notebook that has them (Kaggle's), text bars in
a terminal, none in a notebook without ``ipywidgets`` (nbmake), where ``tqdm.auto``'s text fallback would
leave carriage-return fragments in the saved output and the loop's line per evaluation is the progress.
"""
import functools
import importlib.util

from tqdm.std import tqdm

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
        return tqdm
    if importlib.util.find_spec("ipywidgets") is None:  # tqdm.notebook needs it to draw
        return None
    from tqdm.notebook import tqdm as notebook_tqdm  # imports ipywidgets: only in a notebook that has them

    return notebook_tqdm


def progress_bar(*, disable: bool = False, **kwargs):
    """A tqdm bar (``write`` included) for this environment; a disabled text bar where none renders."""
    cls = _bar_class()
    return tqdm(disable=True, **kwargs) if cls is None else cls(disable=disable, **kwargs)
