"""The names a flag accepts, registered by the code that dispatches on them: one registration adds a choice.

``--optimizer``, ``--schedule``, ``--task`` and ``--train-crop`` take the names registered in :data:`OPTIMIZERS`,
:data:`SCHEDULES`, :data:`TASKS` and :data:`TRAIN_CROPS`, and a registry's ``settled`` words, chosen before anything
is built (``--train-crop auto``, from the data); :mod:`kaggle_utils.config` reads a field's choices, its help and
the option fields a choice reads from here, so a new optimizer is its builder and one ``register`` call::

    @OPTIMIZERS.register("rmsprop", help="lr 1e-3, weight decay 0", lr=1e-3, weight_decay=0.0)
    def rmsprop(optim, schedule, weight_decay):
        return optax.rmsprop(schedule)

A registry is filled by its home module, imported at the first look-up, so importing the config stays light.
"""
import dataclasses
import importlib
from typing import Any, Callable, Iterator, Mapping


@dataclasses.dataclass(frozen=True)
class Entry:
    """One choice: its builder, its words in ``--help``, the option fields only it reads, its defaults."""

    name: str
    build: Callable
    help: str = ""
    reads: tuple[str, ...] = ()  # config fields of the choice's own (e.g. sgd: momentum, nesterov)
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # e.g. an optimizer's lr, weight_decay


class Registry:
    """``name -> Entry``; iterating gives the names, so a registry is a flag's ``choices`` as it is."""

    def __init__(self, what: str, home: str, *, settled: Mapping[str, str] | None = None):
        self.what, self.home, self._entries, self._loaded = what, home, {}, False
        # names the flag takes that are chosen before anything is built (``name -> help``): train crop ``auto``,
        # settled from the data by run.resolve; choices and ``--help`` list them, a look-up refuses them
        self.settled = dict(settled or {})

    def register(self, name: str, build: Callable | None = None, *, help: str = "", reads: tuple[str, ...] = (),
                 **defaults):
        """Registers ``build`` under ``name`` (replacing an earlier one); a decorator without ``build``."""
        if build is None:
            return lambda fn: self.register(name, fn, help=help, reads=reads, **defaults)
        self._entries[name] = Entry(name, build, help, tuple(reads), dict(defaults))
        return build

    def _filled(self) -> dict[str, Entry]:
        if not self._loaded:  # the home module registers the built-in choices as it is imported
            self._loaded = True
            importlib.import_module(self.home)
        return self._entries

    def __getitem__(self, name: str) -> Entry:
        if name in self.settled:
            raise KeyError(f"{self.what} {name!r} is settled before it is built (run.resolve chooses one of "
                           f"{', '.join(self._filled())})")
        try:
            return self._filled()[name]
        except KeyError:
            raise KeyError(f"unknown {self.what} {name!r}: choose one of {', '.join(self)}") from None

    def __contains__(self, name) -> bool:
        return name in self.settled or name in self._filled()

    def __iter__(self) -> Iterator[str]:
        return iter([*self.settled, *(name for name in self._filled() if name not in self.settled)])

    def built(self) -> tuple[str, ...]:
        """The names with a builder (the flag's choices less the :attr:`settled` ones)."""
        return tuple(name for name in self._filled() if name not in self.settled)

    def option_fields(self) -> tuple[str, ...]:
        """The fields some choice reads and others do not: given with a choice that does not read them, refused."""
        return tuple(dict.fromkeys(field for entry in self._filled().values() for field in entry.reads))

    def describe(self) -> str:
        """The choices as ``--help`` lists them: ``name (its help) | ...``."""
        words = [*self.settled.items(), *((e.name, e.help) for e in self._filled().values())]
        return " | ".join(f"{name} ({help})" if help else name for name, help in words)


OPTIMIZERS = Registry("optimizer", "kaggle_utils.train.optim")
SCHEDULES = Registry("schedule", "kaggle_utils.train.optim")
TASKS = Registry("task", "kaggle_utils.train.tasks")
INTERPOLATIONS = ("bilinear", "bicubic")  # the crops' resize filters (tf.image.resize's names), a parameter of each
TRAIN_CROPS = Registry("train crop", "kaggle_utils.data.transforms", settled={
    "auto": "from the data: random-resized for photos stored larger than --image-size, else flip; none on the digits "
            "sample"})
