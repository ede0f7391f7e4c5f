"""The models ``--model`` names: name -> a builder of a Flax module, and the preprocessing its weights expect.

The EfficientNet family (timm's names and the short V2 names) is registered here; a notebook
registers its own module with :func:`register_model`, and ``--model NAME`` /
``config.replace(model=NAME)`` then trains it through ``run.train``, ``cross_validate``,
``predict``, ensembles and reports like an EfficientNet (``--weights`` and ``--layer-decay`` read
an EfficientNet's parameter names: those are refused for another family).

A builder is called with ``num_classes`` and whichever of ``dtype`` (the compute precision),
``drop_rate``, ``drop_path_rate``, ``bn_axis_name`` (BatchNorm statistics over the replicas) and
``remat`` its signature names (all of them with ``**kwargs``). The kit applies the module as
``model.apply(variables, images)`` to evaluate and with ``mutable=["batch_stats"]`` and a
``dropout`` rng to train: the module tells the two apart by
``self.is_mutable_collection("batch_stats")``, as the EfficientNet does.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Callable

from .config import ConfigError
from .efficientnet import create_model, get_spec, list_models, resolve_name

__all__ = ["RegisteredModel", "build_model", "register_model", "registered"]


@dataclasses.dataclass(frozen=True)
class RegisteredModel:
    builder: Callable
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)  # of pixel values in [0, 1], as its weights were trained
    std: tuple[float, ...] = (0.229, 0.224, 0.225)
    crop_pct: float = 0.875  # the evaluation centre crop of its weights (timm's pretrained_cfg)
    efficientnet: str | None = None  # the EfficientNet variant it is (ported --weights, lr groups by stage)


_MODELS: dict[str, RegisteredModel] = {}


def register_model(name: str, builder: Callable | None = None, **preprocessing):
    """Registers ``builder`` under ``name`` (replacing an earlier one); a decorator without ``builder``."""
    if builder is None:
        return lambda fn: register_model(name, fn, **preprocessing)
    _MODELS[name] = RegisteredModel(builder, **preprocessing)
    return builder


def registered(name: str) -> RegisteredModel:
    if name not in _MODELS:
        try:
            return _MODELS[resolve_name(name)]  # the short V2 names ("m")
        except ValueError:
            pass
        raise ConfigError(f"--model: unknown model {name!r}: choose one of {', '.join(sorted(_MODELS))}, or register yours "
                         "(kaggle_utils.models.register_model)")
    return _MODELS[name]


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
                   crop_pct=_spec.crop_pct, efficientnet=_name)
