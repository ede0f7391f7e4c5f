"""The models ``--model`` names: name -> a builder of a Flax module, and the preprocessing its weights expect.

The EfficientNet family is registered here, a notebook's own module with :func:`register_model`; ``--model``
then trains it through ``run.train``, ``cross_validate``, ``predict``, ensembles and reports (``--weights`` reads an
EfficientNet's parameter names; ``--layer-decay`` / ``--head-lr-mult`` a module's ``lr_parts()``, as
``EfficientNet.lr_parts``: refused for others). A builder takes ``num_classes``
and those of ``dtype``, ``drop_rate``, ``drop_path_rate``, ``bn_axis_name``, ``remat`` it names. The kit applies
the module as ``apply(variables, images)`` to evaluate and with ``mutable=["batch_stats"]`` and a ``dropout``
rng to train: ``self.is_mutable_collection("batch_stats")`` tells the two apart, as in the EfficientNet.
"""
import dataclasses
import functools
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
