"""Progress bars that render where the loop runs: widgets in a notebook that has them (Kaggle's), text bars in
a terminal, none in a notebook without ``ipywidgets`` (nbmake), where ``tqdm.auto``'s text fallback would
leave carriage-return fragments in the saved output and the loop's line per evaluation is the progress.
"""
import functools
import importlib.util

from tqdm.std import tqdm


@functools.cache
def _bar_class():
    """The tqdm class for this process, or None where no bar renders cleanly."""
    try:
        from IPython import get_ipython  # only to ask whether this is a notebook
    except ImportError:
        return tqdm
    if type(get_ipython()).__name__ != "ZMQInteractiveShell":  # a terminal, or no IPython shell (None)
        return tqdm
    if importlib.util.find_spec("ipywidgets") is None:  # tqdm.notebook needs it to draw
        return None
    from tqdm.notebook import tqdm as notebook_tqdm  # imports ipywidgets: only in a notebook that has them

    return notebook_tqdm


def progress_bar(*, disable: bool = False, **kwargs):
    """A tqdm bar (``write`` included) for this environment; a disabled text bar where none renders."""
    cls = _bar_class()
    return tqdm(disable=True, **kwargs) if cls is None else cls(disable=disable, **kwargs)
