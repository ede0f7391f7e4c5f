"""The EfficientNet module, ``create_model`` and loading of ported weights.

As in the seed tutorial, a forward with ``batch_stats`` mutable trains (batch statistics, dropout,
drop path), anything else evaluates; ``train=`` overrides it.
"""
import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from .. import checkpoint
from ..variable_trees import abstract_variables
from .arch import ModelSpec, build_blocks, feature_stages, get_spec, resolve_name
from .blocks import BLOCKS
from .layers import BatchNorm, Conv2d, LayerCfg


class EfficientNet(nn.Module):
    """Any timm EfficientNet / EfficientNetV2 / Lite variant, from its :class:`ModelSpec`.

    Outputs: logits ``[B, num_classes]`` (fp32); pooled features (``num_classes=0``); the last feature
    map (``num_classes=0, global_pool=""``); or timm's ``features_only`` list of per-level maps. Each
    stage's output is sown into ``intermediates`` as ``stage_{i}`` (parity checks, visualisation).
    """

    spec: ModelSpec
    num_classes: int = 1000
    dtype: Any = jnp.float32
    drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    features_only: bool = False
    out_indices: Sequence[int] = (0, 1, 2, 3, 4)
    global_pool: str = "avg"
    act: str | None = None  # override the variant's activation (surgery: e.g. "gelu")
    bn_axis_name: str | None = None
    conv_impl: str = "auto"
    remat: bool = False  # recompute each block's activations in the backward pass (memory for compute)

    @property
    def layer_cfg(self) -> LayerCfg:
        return LayerCfg(act=self.act or self.spec.act, padding=self.spec.padding, bn_eps=self.spec.bn_eps,
                        dtype=self.dtype, bn_axis_name=self.bn_axis_name, conv_impl=self.conv_impl)

    @property
    def num_features(self) -> int:
        """Channels of the final feature map (the head width)."""
        return self.spec.head_chs

    @property
    def stages(self):
        return build_blocks(self.spec, self.drop_path_rate)

    def lr_parts(self) -> tuple[tuple[str, str, int], ...]:
        """The parts for per-part learning rates, input to output: (group, regex of its parameters' top-level names,
        depth). timm's per-stage grouping: the head conv shares the last stage's depth, the classifier is last."""
        n = len(self.stages)
        return (("stem", "conv_stem|bn1", 0), *((f"stage{i}", rf"blocks_{i}_\d+", i + 1) for i in range(n)),
                ("head", "conv_head|bn2", n), ("classifier", "classifier", n + 1))

    @nn.compact
    def __call__(self, x, train: bool | None = None):
        if train is None:
            train = self.is_mutable_collection("batch_stats") and not self.is_initializing()
        cfg, act = self.layer_cfg, self.layer_cfg.act_fn
        stages = self.stages
        levels = feature_stages(stages)
        try:
            wanted = {levels[i] for i in self.out_indices} if self.features_only else set()
        except IndexError:
            raise ValueError(f"out_indices {tuple(self.out_indices)} out of range: {self.spec.name} has "
                             f"{len(levels)} feature levels") from None

        x = x.astype(self.dtype)
        x = act(BatchNorm(cfg, name="bn1")(Conv2d(self.spec.stem_chs, 3, cfg, stride=2, name="conv_stem")(x), train))
        features = [x] if -1 in wanted else []
        for i, stage in enumerate(stages):
            for j, block in enumerate(stage):
                cls = BLOCKS[block.block_type]
                if self.remat:  # `train`, argument 2 counting the module, is static: it picks the code path
                    cls = nn.remat(cls, static_argnums=(2,))
                x = cls(block, cfg, name=f"blocks_{i}_{j}")(x, train)
            self.sow("intermediates", f"stage_{i}", x)
            if i in wanted:
                features.append(x)
        if self.features_only:
            return features

        x = act(BatchNorm(cfg, name="bn2")(Conv2d(self.num_features, 1, cfg, name="conv_head")(x), train))
        if not self.global_pool:
            if self.num_classes:
                raise ValueError("a classifier needs pooling: use global_pool='avg' with num_classes > 0")
            return x
        if self.global_pool != "avg":
            raise ValueError(f"global_pool {self.global_pool!r} not supported; use 'avg' or ''")
        x = x.astype(jnp.float32).mean(axis=(1, 2))
        if not self.num_classes:
            return x
        x = nn.Dropout(self.drop_rate, deterministic=not train)(x)
        init = nn.initializers.variance_scaling(1 / 3, "fan_out", "uniform")  # timm's: U(+-1/sqrt(num_classes))
        x = nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=init, name="classifier")(x)
        return x.astype(jnp.float32)


def create_model(name: str, **fields) -> EfficientNet:
    """Builds a registered variant by timm's name (or a short V2 name such as ``"m"``); ``fields`` are
    :class:`EfficientNet` fields (``num_classes``, ``dtype``, ``drop_path_rate``, ``features_only``, ``act``, ...)
    or :class:`ModelSpec` fields (``channel_multiplier``, ``arch_def``, ...) for variants of a registered
    architecture."""
    spec_fields = {f.name for f in dataclasses.fields(ModelSpec)}
    spec = dataclasses.replace(get_spec(name), **{k: v for k, v in fields.items() if k in spec_fields})
    unknown = set(fields) - spec_fields - {f.name for f in dataclasses.fields(EfficientNet)}
    if unknown:
        raise TypeError(f"create_model({name!r}): unknown argument(s) {sorted(unknown)}")
    module_kw = {k: v for k, v in fields.items() if k not in spec_fields}
    if "out_indices" in module_kw:  # a module field must hash
        module_kw["out_indices"] = tuple(module_kw["out_indices"])
    return EfficientNet(spec, **module_kw)


def load_weights(model: EfficientNet, path: str | Path) -> dict:
    """Ported weights in ``model``'s variable tree; the file's ``classifier`` is dropped for a backbone, any other
    difference (variant, ``num_classes``) is a :class:`~kaggle_utils.checkpoint.CheckpointError` naming the keys."""
    path = Path(path)
    manifest_file = checkpoint.manifest_path(path)
    manifest = json.loads(manifest_file.read_text()) if manifest_file.is_file() else None
    if manifest and manifest.get("model") and manifest["model"] != model.spec.name:
        raise checkpoint.CheckpointError(
            f"{path} holds weights of {manifest['model']!r} (per {manifest_file.name}), "
            f"but the model is {model.spec.name!r}")
    raw = checkpoint.load(path)
    expected = abstract_variables(model, jax.ShapeDtypeStruct((1, 64, 64, 3), jnp.float32))
    if "classifier" not in expected.get("params", {}):
        raw = {**raw, "params": {k: v for k, v in raw.get("params", {}).items() if k != "classifier"}}
    checkpoint.check_tree(raw, expected, what=f"weights file {path} for {model.spec.name}"
                          f" (num_classes={model.num_classes})")
    return jax.tree.map(lambda r, e: jnp.asarray(r, e.dtype), raw, expected)


def efficientnet_v2_pretrained(name: str, weights_path: str | Path, input_size: int | None = None,
                               verbose: bool = False, **fields) -> tuple[EfficientNet, dict]:
    """A pretrained backbone ``(module, variables)`` whose module returns the last feature map; the file's
    classifier is dropped (add a head with ``kaggle_utils.surgery``). ``name``: timm's or a short V2 name;
    ``fields``: :func:`create_model`'s (``dtype``, ...)."""
    name = resolve_name(name)
    backbone = create_model(name, num_classes=0, global_pool="", **fields)
    size = input_size or backbone.spec.input_size
    variables = load_weights(backbone, weights_path)
    if verbose:
        n = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(variables["params"]))
        print(f"{name}: {n / 1e6:.1f}M backbone parameters from {weights_path}; "
              f"input {size}x{size} -> feature map {-(-size // 32)}x{-(-size // 32)}x{backbone.num_features}")
    return backbone, variables
