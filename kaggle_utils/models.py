"""The models ``--model`` names: name -> a builder of a Flax module, and the preprocessing its weights expect.

The EfficientNet family is registered here, a notebook's own module with :func:`register_model`; ``--model``
then trains it through ``run.train``, ``cross_validate``, ``predict``, ensembles and reports (``--weights`` reads an
EfficientNet's parameter names; ``--layer-decay`` / ``--head-lr-mult`` a module's ``lr_parts()``, as
``EfficientNet.lr_parts``: refused for others). A builder takes ``num_classes``
and those of ``dtype``, ``drop_rate``, ``drop_path_rate``, ``bn_axis_name``, ``remat`` it names. The kit applies
the module as ``apply(variables, images)`` to evaluate and with ``mutable=["batch_stats"]`` and a ``dropout``
rng to train: ``self.is_mutable_collection("batch_stats")`` tells the two apart, as in the EfficientNet.

A registry is per process, so a run folder records where a model of yours is defined (:func:`builder_path`,
``module:qualname``); :func:`import_model` registers it again from there in a new process (``predict``,
``cv --resume``, ``--init-from``), or says which module to make importable.
"""
import dataclasses
import functools
import importlib
import inspect
from typing import Callable

from .config import ConfigError
from .efficientnet import create_model, get_spec, list_models, resolve_name


@dataclasses.dataclass(frozen=True)
class RegisteredModel:
    builder: Callable
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)  # of pixels in [0, 1], as its weights were trained
    std: tuple[float, ...] = (0.229, 0.224, 0.225)
    crop_pct: float = 0.875  # the evaluation centre crop its weights were scored with (timm's pretrained config)
    efficientnet: bool = False  # ported --weights read an EfficientNet's parameter names


_MODELS: dict[str, RegisteredModel] = {}


def register_model(name: str, builder: Callable | None = None, **preprocessing):
    """Registers ``builder`` under ``name`` (replacing an earlier one); a decorator without ``builder``."""
    if builder is None:
        return lambda fn: register_model(name, fn, **preprocessing)
    _MODELS[name] = RegisteredModel(builder, **preprocessing)
    return builder


def registered(name: str) -> RegisteredModel:
    """``name``'s entry; a short V2 name ("m") as its timm name."""
    try:
        return _MODELS.get(name) or _MODELS[resolve_name(name)]
    except ValueError:
        raise ConfigError(f"--model: unknown model {name!r}: choose one of {', '.join(sorted(_MODELS))}, or "
                          "register yours (kaggle_utils.models.register_model)") from None


def builder_path(name: str) -> str | None:
    """``module:qualname`` of a model's builder, what a run folder records; None for the kit's own models."""
    entry = registered(name)
    if entry.efficientnet:
        return None
    builder = entry.builder.func if isinstance(entry.builder, functools.partial) else entry.builder
    return f"{builder.__module__}:{builder.__qualname__}"


def import_model(name: str, path: str | None, *, where: str, **preprocessing) -> None:
    """Registers ``name`` from the builder ``path`` a run folder recorded (``where``), unless this process has it:
    the module is imported (registering it, if it does so itself), else its builder is registered with
    ``preprocessing`` (the run's mean and std). Refused, naming the module, where it cannot be imported."""
    if name in _MODELS:
        return
    try:
        registered(name)  # a short V2 name, or a built-in
        return
    except ConfigError:
        if path is None:
            raise
    module, _, qualname = path.partition(":")
    if module == "__main__" or "<locals>" in qualname:
        raise ConfigError(f"--model {name}: {where} records its builder as {path}, which only the process that "
                          "trained it had: define it in a module of its own (a .py file) and register it there, so "
                          "that a new process can import it")
    try:
        found = importlib.import_module(module)
        if name not in _MODELS:
            builder = functools.reduce(getattr, qualname.split("."), found)
            register_model(name, builder, **preprocessing)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"--model {name}: {where} records its builder as {path}, which does not import here "
                          f"({type(err).__name__}: {err}): put the folder holding {module.replace('.', '/')}.py on "
                          "the path (PYTHONPATH, or sys.path in a notebook)") from None


def build_model(name: str, *, num_classes: int, **options):
    """``name``'s module with ``num_classes`` outputs and the ``options`` its builder takes (the module docstring)."""
    builder = registered(name).builder
    accepted = inspect.signature(builder).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        if options.get("remat") and "remat" not in accepted:
            raise ConfigError(f"--remat blocks: the builder of model {name!r} takes no remat argument")
        options = {k: v for k, v in options.items() if k in accepted}
    return builder(num_classes=num_classes, **options)


for _name in list_models():
    _spec = get_spec(_name)
    register_model(_name, functools.partial(create_model, _name), mean=_spec.mean, std=_spec.std,
                   crop_pct=_spec.crop_pct, efficientnet=True)
