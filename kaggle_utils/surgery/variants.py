"""Variants of a model: other fields, another block layout, another classifier or a new head on a backbone (optionally
padded to a TPU-friendly width), its variables inherited; the stem of an RGB model for other input channels."""
import dataclasses
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from ..variable_trees import (Patterns, VariableTreeError, abstract_variables, flatten, init_variables, listing,
                              path_name, select_paths, unflatten)
from .inheritance import inherit


class ModelAndVariables(NamedTuple):
    """A changed model, its variables, and the report of how they were obtained."""

    model: Any
    variables: dict
    report: Any


def variant(model: nn.Module, **changes) -> nn.Module:
    """``model`` with some fields changed, e.g. ``act="gelu"`` or ``num_classes=104``; a name may also be a
    field of a dataclass-valued field (the EfficientNet's ``spec``: ``arch_def``, ``channel_multiplier``).
    Unknown or ambiguous names are errors."""
    own = {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name not in ("parent", "name")}
    configs = {f: v for f, v in own.items() if dataclasses.is_dataclass(v) and not isinstance(v, (type, nn.Module))}
    updates = {k: v for k, v in changes.items() if k in own}
    for key, value in changes.items():
        if key in own:
            continue
        holders = [f for f, cfg in configs.items() if key in {g.name for g in dataclasses.fields(cfg)}]
        if len(holders) != 1:
            problem = "is ambiguous" if holders else "is not a field"
            raise VariableTreeError(f"variant: {key!r} {problem} of {type(model).__name__} (fields: {sorted(own)}"
                                    + "".join(f"; {f}: {sorted(g.name for g in dataclasses.fields(c))}"
                                              for f, c in configs.items()) + ")")
        updates[holders[0]] = dataclasses.replace(updates.get(holders[0], configs[holders[0]]), **{key: value})
    return model.clone(**updates)


def rewire(model: nn.Module, variables: dict, sample_input, *, child: nn.Module | None = None,
           reinit: Patterns = (), seed: int = 0, **changes) -> ModelAndVariables:
    """``child`` (any module) or ``model`` with ``changes`` (``act="gelu"``, ``arch_def=...``), inheriting all that
    fits; when every leaf is inherited, nothing is initialised (nor compiled)."""
    if (child is None) == (not changes):
        raise VariableTreeError("rewire: give either child= or field changes, exactly one of the two")
    child = variant(model, **changes) if child is None else child
    tree, report = inherit(variables, abstract_variables(child, sample_input), reinit=reinit)
    if report.new or report.mismatched or report.reinitialised:  # some leaves need fresh values
        tree, report = inherit(variables, init_variables(child, sample_input, seed=seed), reinit=reinit)
    return ModelAndVariables(child, tree, report)


def replace_classifier(model: nn.Module, variables: dict, num_classes: int, sample_input, *,
                       classifier: Patterns = r"(^|/)classifier/", seed: int = 0,
                       head_init: str = "zeros") -> ModelAndVariables:
    """``model`` for ``num_classes`` classes, everything but the classifier kept: its leaves (the ``classifier``
    patterns, e.g. ``"Dense_1"``) are re-initialised as :func:`attach_head`'s (``head_init``) even when the shape
    stays (a padded head of 104 or 100 classes is 128 wide either way)."""
    if "num_classes" not in {f.name for f in dataclasses.fields(model)}:
        raise VariableTreeError(f"replace_classifier: {type(model).__name__} has no num_classes field; "
                                "build the new model yourself and use rewire(..., child=new_model)")
    new_model, tree, report = rewire(model, variables, sample_input, reinit=classifier, seed=seed,
                                     num_classes=num_classes)
    fresh = set(report.reinitialised) | set(report.new) | {p for p, _, _ in report.mismatched}
    flat = {path: (initial_head(leaf, head_init) if path in fresh else leaf) for path, leaf in flatten(tree).items()}
    return ModelAndVariables(new_model, unflatten(flat), report)


HEAD_INITS = ("zeros", "random")


def initial_head(classifier: Any, head_init: str) -> Any:
    """A new classifier's leaves as ``head_init`` wants them: zeros, or as initialised (``"random"``)."""
    if head_init not in HEAD_INITS:
        raise VariableTreeError(f"head_init must be one of {HEAD_INITS}, got {head_init!r}")
    return jax.tree.map(jnp.zeros_like, classifier) if head_init == "zeros" else classifier


def padded_width(num_classes: int, multiple: int = 1) -> int:
    """``num_classes`` rounded up to a multiple (128: the TPU's matrix unit; 104 -> 128)."""
    if num_classes < 1 or multiple < 1:
        raise VariableTreeError(f"num_classes ({num_classes}) and the padding multiple ({multiple}) must be >= 1")
    return -(-num_classes // multiple) * multiple


class ClassifierHead(nn.Module):
    """Any backbone + global average pooling + dropout + a Dense ``classifier``.

    ``pad_to``: the Dense is ``padded_width(num_classes, pad_to)`` wide (128 on TPU); the extra logits start
    at zero and the steps read only the first ``num_classes``, so a padded model trains as an unpadded one.
    ``num_features``: the backbone's width, checked when given. ``train=`` overrides the mutable-stats rule.
    """

    backbone: nn.Module
    num_classes: int
    drop_rate: float = 0.0
    pad_to: int = 1
    num_features: int | None = None
    dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.lecun_normal()

    @property
    def num_outputs(self) -> int:
        return padded_width(self.num_classes, self.pad_to)

    def __call__(self, x, train: bool | None = None):
        explicit = train is not None
        if not explicit:
            train = self.is_mutable_collection("batch_stats") and not self.is_initializing()
        features = self.backbone(x, train=train) if explicit else self.backbone(x)
        if features.ndim == 4:  # [B, h, w, C] feature map
            features = features.astype(jnp.float32).mean(axis=(1, 2))
        elif features.ndim != 2:
            raise VariableTreeError(f"ClassifierHead: the backbone returns shape {features.shape}; "
                                    "expected [B, h, w, C] or [B, C]")
        if self.num_features is not None and features.shape[-1] != self.num_features:
            raise VariableTreeError(f"ClassifierHead: the head expects {self.num_features} features but the backbone "
                                    f"{type(self.backbone).__name__} outputs {features.shape[-1]}")
        return self.classify(features, train)

    @nn.compact
    def classify(self, features, train: bool = False):
        """Dropout and the Dense ``classifier`` on pooled features ``[B, C]`` (initialisable alone)."""
        features = nn.Dropout(self.drop_rate, deterministic=not train)(features)
        def init(key, shape, dtype=jnp.float32):  # padded logits start (and stay) 0
            return self.kernel_init(key, shape, dtype).at[..., self.num_classes:].set(0)

        logits = nn.Dense(self.num_outputs, dtype=self.dtype, kernel_init=init, name="classifier")(features)
        return logits.astype(jnp.float32)


def attach_head(backbone: nn.Module, backbone_variables: dict, num_classes: int, sample_input, *, seed: int = 0,
                head_init: str = "zeros", **head_fields) -> ModelAndVariables:
    """A fresh :class:`ClassifierHead` (``head_fields``: its fields; ``num_features`` defaults to the backbone's) on
    ``backbone``, whose ``backbone_variables`` must fit it exactly and stay unchanged. ``head_init``: ``"zeros"`` (the
    first loss is ln C, so random logits do not push pretrained features around) or ``"random"``."""
    head_fields["num_features"] = head_fields.get("num_features") or getattr(backbone, "num_features", None)
    head = ClassifierHead(backbone, num_classes, **head_fields)
    fresh = abstract_variables(head, sample_input)
    width = fresh["params"]["classifier"]["kernel"].shape[0]
    classifier = init_variables(head, jax.ShapeDtypeStruct((1, width), jnp.float32), seed=seed,
                                method=ClassifierHead.classify)["params"]["classifier"]
    classifier = initial_head(classifier, head_init)
    fresh = {**fresh, "params": {**fresh["params"], "classifier": classifier}}
    nested = {col: {"backbone": tree} for col, tree in backbone_variables.items() if col != "intermediates"}
    variables, report = inherit(nested, fresh)
    misfits = [p for p in report.new if not p.startswith("params/classifier/")]
    if misfits or report.mismatched or report.unused:
        raise VariableTreeError(f"attach_head: backbone_variables do not fit the backbone {type(backbone).__name__}:\n"
                                f"{report}")
    return ModelAndVariables(head, variables, report)


@dataclasses.dataclass(frozen=True)
class ChannelReport:
    """What :func:`adapt_input_channels` did to which kernel."""

    path: str
    old_shape: tuple[int, ...]
    new_shape: tuple[int, ...]
    rule: str

    def __str__(self) -> str:
        return f"{self.path}: {self.old_shape} -> {self.new_shape} ({self.rule})"


def _stem_kernel(flat: dict, kernel: Patterns | None) -> str:
    if kernel is not None:
        hits = sorted(select_paths(flat, kernel, "adapt_input_channels kernel"))
    else:  # the one convolution that reads RGB: a 4-D HWIO kernel with 3 input channels
        hits = [p for p, leaf in flat.items() if np.ndim(leaf) == 4 and np.shape(leaf)[2] == 3]
    if len(hits) != 1:
        raise VariableTreeError(f"adapt_input_channels: cannot tell the stem kernel: {len(hits)} candidates "
                                f"({listing(hits) or 'no 4-D kernel with 3 input channels'}); pass kernel=<pattern>")
    return hits[0]


def adapt_input_channels(variables: dict, in_chans: int, *, kernel: Patterns | None = None
                         ) -> tuple[dict, ChannelReport]:
    """The stem convolution of an RGB model changed for ``in_chans`` input channels, as timm does.

    1 channel: the kernel summed over RGB (a grey image gives what its RGB copy gave); more: the RGB kernel
    repeated, scaled by ``3 / in_chans``. ``kernel``: the stem's pattern, when it is not the only 4-D kernel
    with 3 input channels. The module needs no change (its convolutions read the width from the input).
    """
    if in_chans < 1:
        raise VariableTreeError(f"adapt_input_channels: in_chans must be >= 1, got {in_chans}")
    flat = flatten(variables)
    path = _stem_kernel(flat, kernel)
    old = flat[path]
    if np.shape(old)[2] != 3:
        raise VariableTreeError(f"adapt_input_channels: {path} has shape {np.shape(old)}: expected an HWIO kernel "
                                "with 3 input channels")
    w = jnp.asarray(old, jnp.float32)
    if in_chans == 1:
        new, rule = w.sum(axis=2, keepdims=True), "summed over RGB"
    elif in_chans == 3:
        new, rule = w, "unchanged"
    else:
        new = jnp.tile(w, (1, 1, math.ceil(in_chans / 3), 1))[:, :, :in_chans] * (3.0 / in_chans)
        rule = f"RGB repeated, scaled by 3/{in_chans}"
    new = new.astype(old.dtype)
    tree = jax.tree.map_with_path(lambda kp, leaf: new if path_name(kp) == path else leaf, variables)
    return tree, ChannelReport(path, tuple(np.shape(old)), tuple(new.shape), rule)
