"""A classifier head on any backbone, optionally padded to a TPU-friendly width."""
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import linen as nn

from ..variable_trees import VariableTreeError, abstract_variables, init_variables
from .inheritance import inherit
from .variants import ModelAndVariables, initial_head


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
    """A :class:`ClassifierHead` on ``backbone`` (``head_fields``: its ``drop_rate``, ``pad_to``, ``num_features``
    (default: the backbone's), ``dtype``): a fresh head, the backbone's variables unchanged.

    ``backbone_variables`` must fit ``backbone`` exactly; only the classifier is initialised. ``head_init``:
    ``"zeros"`` (the first loss is ln C, so random logits do not push pretrained features around) or ``"random"``.
    """
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
