"""Model surgery for Flax: reshape a pretrained network without losing what it learned.

Flax keeps a model's definition (a ``Module``) apart from its variables (nested dicts of
arrays), so every PyTorch habit -- swap the head, load what fits, freeze the backbone --
becomes two moves here: change the module, then carry over the variables that still fit.
Everything below works on variable trees and module fields, never on a particular model's
internals, so it applies to the kit's EfficientNets and to any small Flax model alike.

* Paths: ``flatten`` / ``unflatten`` / ``shapes`` with ``/``-joined paths
  (``params/blocks_0_0/conv/kernel``); patterns are regular expressions searched in them.
* Inheritance: :func:`inherit` copies every leaf whose path and shape match; building on it,
  :func:`rewire` (a variant of a model), :func:`replace_classifier`, :func:`attach_head`
  (a :class:`ClassifierHead` on a backbone, optionally padded to a multiple of 128 outputs).
* Freezing: :func:`freeze_mask`, :func:`freeze_optimizer` (frozen leaves get no update and no
  optimizer state), :func:`freeze_batchnorm` (BatchNorm layers whose parameters are frozen run
  in inference mode), :func:`freeze` (all three, with a report), :func:`carry_optimizer_state`
  (unfreezing keeps the optimizer state of what already trains).
* :func:`adapt_input_channels`, :func:`extract_features`, :func:`param_table`,
  :func:`count_flops`, :func:`cast`.

Every operation returns a report of what it did (``print`` it), and bad input -- a pattern
that matches nothing, trees with nothing in common, a head that does not fit the backbone --
is a :class:`SurgeryError` naming what and where, never a silent no-op.
Imports only jax, flax, optax and numpy (plus the kit's BatchNorm layer, which does the same).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import math
import re
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from .efficientnet.layers import BatchNorm as KitBatchNorm

__all__ = [
    "CastReport",
    "ChannelReport",
    "ClassifierHead",
    "FreezeReport",
    "Frozen",
    "FrozenBatchNorm",
    "InheritReport",
    "ParamTable",
    "Surgery",
    "SurgeryError",
    "adapt_input_channels",
    "attach_head",
    "carry_optimizer_state",
    "cast",
    "count_flops",
    "extract_features",
    "flatten",
    "freeze",
    "freeze_batchnorm",
    "freeze_mask",
    "freeze_optimizer",
    "init_variables",
    "inherit",
    "padded_width",
    "param_table",
    "replace_classifier",
    "rewire",
    "shapes",
    "unflatten",
    "variant",
]

Patterns = str | Sequence[str]


class SurgeryError(ValueError):
    """A surgery request that cannot be carried out as asked; the message says what and where."""


# --------------------------------------------------------------------------- paths


def _key_name(key) -> str:
    for attr in ("key", "name", "idx"):  # DictKey / GetAttrKey / SequenceKey (and FlattenedIndexKey)
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _path(keypath) -> str:
    return "/".join(_key_name(k) for k in keypath)


def flatten(tree: Any) -> dict[str, Any]:
    """``{"params/conv/kernel": leaf, ...}`` for any pytree (dicts, optax states, lists)."""
    return {_path(kp): leaf for kp, leaf in jax.tree.flatten_with_path(tree)[0]}


def unflatten(flat: dict[str, Any]) -> dict:
    """The nested dicts of a ``flatten``-ed variable tree (dict trees only)."""
    tree: dict = {}
    for path, leaf in flat.items():
        *parents, name = path.split("/")
        node = tree
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SurgeryError(f"unflatten: {'/'.join(parents[:i + 1])!r} is both a leaf and a prefix of {path!r}")
        if name in node:
            raise SurgeryError(f"unflatten: {path!r} is both a leaf and a prefix of other paths")
        node[name] = leaf
    return tree


def shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """The flat ``path -> shape`` view of a tree: what a model holds, at a glance."""
    return {path: tuple(np.shape(leaf)) for path, leaf in flatten(tree).items()}


def _as_patterns(patterns: Patterns) -> tuple[str, ...]:
    return (patterns,) if isinstance(patterns, str) else tuple(patterns)


def _nearby(paths: Sequence[str], pattern: str, n: int = 6) -> str:
    """A few paths to show beside a pattern that matched nothing: the closest, then the first."""
    shown = difflib.get_close_matches(pattern, paths, n=n // 2, cutoff=0.0)
    shown += [p for p in paths if p not in shown][:n - len(shown)]
    return ", ".join(shown) + (f", ... ({len(paths)} in all)" if len(paths) > len(shown) else "")


def _select(paths: Iterable[str], patterns: Patterns, what: str) -> set[str]:
    """The paths that any pattern matches (``re.search``); a pattern matching none is an error."""
    paths = list(paths)
    selected: set[str] = set()
    for pattern in _as_patterns(patterns):
        try:
            regex = re.compile(pattern)
        except re.error as err:
            raise SurgeryError(f"{what}: {pattern!r} is not a regular expression ({err})") from None
        hits = {p for p in paths if regex.search(p)}
        if not hits:
            raise SurgeryError(f"{what}: pattern {pattern!r} matches no path; "
                               f"paths look like: {_nearby(paths, pattern)}")
        selected |= hits
    return selected


def _size(leaf) -> int:
    return int(np.prod(np.shape(leaf), dtype=np.int64))


def _nbytes(leaf) -> int:
    return _size(leaf) * np.dtype(leaf.dtype).itemsize


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KiB" if n < 2**20 else f"{n / 2**20:.1f} MiB"


def _listing(items: Sequence[str], limit: int = 8) -> str:
    return ", ".join(items[:limit]) + (f", ... ({len(items)} in all)" if len(items) > limit else "")


# --------------------------------------------------------------------------- inheritance


@dataclasses.dataclass(frozen=True)
class InheritReport:
    """What :func:`inherit` did, leaf by leaf (paths are ``flatten``'s)."""

    inherited: tuple[str, ...]  # copied from the parent
    new: tuple[str, ...]  # only in the child: kept at the child's fresh init
    mismatched: tuple[tuple[str, tuple, tuple], ...]  # (path, parent shape, child shape): kept fresh
    reinitialised: tuple[str, ...]  # in both with one shape, kept fresh on request (``reinit``)
    unused: tuple[str, ...]  # only in the parent: dropped
    inherited_values: int = 0

    def __str__(self) -> str:
        lines = [f"inherited {len(self.inherited)} leaves ({self.inherited_values:,} values); "
                 f"new {len(self.new)}; mismatched {len(self.mismatched)}; reinitialised {len(self.reinitialised)}; "
                 f"parent leaves unused {len(self.unused)}"]
        if self.new:
            lines.append(f"  new (fresh init): {_listing(self.new)}")
        if self.mismatched:
            lines.append("  mismatched (fresh init): " + _listing(
                [f"{p} parent {ps} child {cs}" for p, ps, cs in self.mismatched]))
        if self.reinitialised:
            lines.append(f"  reinitialised: {_listing(self.reinitialised)}")
        if self.unused:
            lines.append(f"  unused from the parent: {_listing(self.unused)}")
        return "\n".join(lines)


def _nesting_hint(parent: Sequence[str], child: Sequence[str]) -> str:
    """When two trees share nothing, one is often the other nested under a prefix: show a pair."""
    for a, b in ((parent, child), (child, parent)):
        for path in a[:20]:
            parts = path.split("/")
            for k in range(len(parts) - 1):  # suffixes of two or more parts, longest first
                tail = "/" + "/".join(parts[k:])
                hit = next((q for q in b if q.endswith(tail)), None)
                if hit is not None:
                    pair = (path, hit) if a is parent else (hit, path)
                    return f" Parent {pair[0]!r} looks like child {pair[1]!r}: is one tree nested under a prefix?"
    return ""


def inherit(parent: Any, child: Any, *, reinit: Patterns = ()) -> tuple[Any, InheritReport]:
    """``child`` with every leaf whose path and shape match taken from ``parent``; and a report.

    This is what lets a changed architecture start from a trained one: build the child, init
    it, inherit. Leaves only in the child, or with another shape, keep the child's fresh init;
    ``reinit`` patterns keep matching child leaves fresh even when they fit (a classifier for
    other classes of the same count). Values take the child's dtype. Works on any pair of
    pytrees with matching paths: variables, params, optimizer states.

    Raises :class:`SurgeryError` when nothing at all would be inherited.
    """
    parent_flat = flatten(parent)
    child_flat = flatten(child)
    fresh = _select(child_flat, reinit, "inherit reinit") if _as_patterns(reinit) else set()
    inherited, new, mismatched, reinitialised = [], [], [], []
    values = 0

    def take(keypath, leaf):
        nonlocal values
        path = _path(keypath)
        if path not in parent_flat:
            new.append(path)
            return leaf
        source = parent_flat[path]
        if np.shape(source) != np.shape(leaf):
            mismatched.append((path, tuple(np.shape(source)), tuple(np.shape(leaf))))
            return leaf
        if path in fresh:
            reinitialised.append(path)
            return leaf
        inherited.append(path)
        values += _size(leaf)
        return jnp.asarray(source, dtype=leaf.dtype)

    tree = jax.tree.map_with_path(take, child)
    if not inherited:
        reason = (f"{len(mismatched)} common paths all differ in shape (e.g. {mismatched[0]})" if mismatched
                  else "no path in common")
        hint = "" if mismatched else _nesting_hint(list(parent_flat), list(child_flat))
        raise SurgeryError(
            f"inherit: nothing to inherit: {reason}. Parent paths look like {_listing(list(parent_flat), 4)}; "
            f"child paths like {_listing(list(child_flat), 4)}.{hint}")
    unused = tuple(p for p in parent_flat if p not in child_flat)
    report = InheritReport(tuple(inherited), tuple(new), tuple(mismatched), tuple(reinitialised), unused, values)
    return tree, report


# --------------------------------------------------------------------------- model variants


class Surgery(NamedTuple):
    """A changed model, its variables, and the report of how they were obtained."""

    model: Any
    variables: dict
    report: Any


def _init_rngs(seed: int) -> dict:
    # an rbg key: each initialiser lowers to one random-bits op, which compiles much faster on CPU
    params_key, dropout_key = jax.random.split(jax.random.key(seed, impl="rbg"))
    return {"params": params_key, "dropout": dropout_key}


def _without_sown(variables: dict) -> dict:
    return {k: v for k, v in variables.items() if k != "intermediates"}


def init_variables(model, sample_input, *, seed: int = 0, method: Callable | None = None) -> dict:
    """Fresh variables of ``model`` for an input shaped like ``sample_input`` (sown values dropped).

    ``sample_input``: an array or a ``jax.ShapeDtypeStruct``; only its shape and dtype matter.
    """
    x = jnp.zeros(np.shape(sample_input), sample_input.dtype)
    return _without_sown(jax.jit(functools.partial(model.init, method=method))(_init_rngs(seed), x))


def _abstract_variables(model, sample_input) -> dict:
    """The shapes and dtypes ``init_variables`` would give, traced without compiling anything."""
    x = jax.ShapeDtypeStruct(np.shape(sample_input), sample_input.dtype)
    return _without_sown(jax.eval_shape(model.init, _init_rngs(0), x))


def variant(model: nn.Module, **changes) -> nn.Module:
    """``model`` with some fields changed, e.g. ``act="gelu"`` or ``num_classes=104``.

    A name that is not a field of the module may be a field of one of its dataclass-valued
    fields (a config such as the EfficientNet's ``spec``: ``arch_def``, ``channel_multiplier``),
    so one call changes either. Unknown or ambiguous names are errors.
    """
    own = {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name not in ("parent", "name")}
    direct = {k: v for k, v in changes.items() if k in own}
    configs = {f: v for f, v in own.items() if dataclasses.is_dataclass(v) and not isinstance(v, (type, nn.Module))}
    nested: dict[str, dict] = {}
    for key, value in changes.items():
        if key in direct:
            continue
        holders = [f for f, cfg in configs.items() if key in {g.name for g in dataclasses.fields(cfg)}]
        if len(holders) != 1:
            problem = "is ambiguous" if holders else "is not a field"
            raise SurgeryError(f"variant: {key!r} {problem} of {type(model).__name__} (fields: {sorted(own)}"
                               + "".join(f"; {f}: {sorted(g.name for g in dataclasses.fields(c))}"
                                         for f, c in configs.items()) + ")")
        nested.setdefault(holders[0], {})[key] = value
    updates = {**direct, **{f: dataclasses.replace(configs[f], **kv) for f, kv in nested.items()}}
    return model.clone(**updates)


def rewire(model: nn.Module, variables: dict, sample_input, *, child: nn.Module | None = None,
           reinit: Patterns = (), seed: int = 0, **changes) -> Surgery:
    """A variant of ``model`` (``child``, or ``model`` with ``changes``) that inherits all that fits.

    E.g. ``rewire(model, variables, x, act="gelu")``, or a stage with another block type / width /
    depth via ``arch_def=...``, or any module built by hand as ``child``. The child is initialised
    for ``sample_input`` and takes every parent leaf whose path and shape still match; the report
    lists what was inherited, what is new and what no longer fits. When every leaf is inherited
    (another activation), nothing is initialised, so nothing is compiled.
    """
    if (child is None) == (not changes):
        raise SurgeryError("rewire: give either child= or field changes, exactly one of the two")
    child = variant(model, **changes) if child is None else child
    tree, report = inherit(variables, _abstract_variables(child, sample_input), reinit=reinit)
    if report.new or report.mismatched or report.reinitialised:  # some leaves need fresh values
        tree, report = inherit(variables, init_variables(child, sample_input, seed=seed), reinit=reinit)
    return Surgery(child, tree, report)


def replace_classifier(model: nn.Module, variables: dict, num_classes: int, sample_input, *,
                       classifier: Patterns = r"(^|/)classifier/", seed: int = 0) -> Surgery:
    """``model`` for ``num_classes`` classes: a fresh classifier, everything else kept.

    ``model`` needs a ``num_classes`` field; ``classifier`` are the patterns of the classifier's
    leaves (the kit's models and :class:`ClassifierHead` name it ``classifier``; pass e.g.
    ``"Dense_1"`` for others). They are re-initialised even when the shape stays the same (a
    padded head of 104 or 100 classes is 128 wide either way).
    """
    if "num_classes" not in {f.name for f in dataclasses.fields(model)}:
        raise SurgeryError(f"replace_classifier: {type(model).__name__} has no num_classes field; "
                           "build the new model yourself and use rewire(..., child=new_model)")
    return rewire(model, variables, sample_input, reinit=classifier, seed=seed, num_classes=num_classes)


# --------------------------------------------------------------------------- a head on a backbone


def padded_width(num_classes: int, multiple: int = 1) -> int:
    """``num_classes`` rounded up to a multiple (128: the TPU's matrix unit; 104 -> 128)."""
    if num_classes < 1 or multiple < 1:
        raise SurgeryError(f"num_classes ({num_classes}) and the padding multiple ({multiple}) must be >= 1")
    return -(-num_classes // multiple) * multiple


def _zero_columns_from(init: Callable, first: int) -> Callable:
    """An initialiser whose output columns ``first:`` are zero: padded logits start (and stay) 0."""

    def padded_init(key, shape, dtype=jnp.float32):
        return init(key, shape, dtype).at[..., first:].set(0)

    return padded_init


class ClassifierHead(nn.Module):
    """Any backbone + global average pooling + dropout + a Dense ``classifier``.

    ``pad_to``: the Dense is ``padded_width(num_classes, pad_to)`` wide (128 on TPU); the extra
    logits start at zero and the training steps use only the first ``num_classes`` columns for
    loss, softmax and argmax, so a padded model trains exactly as an unpadded one.
    ``num_features``: the backbone's feature width, when known; a backbone that outputs another
    width is an error. Training mode follows the kit: a forward with ``batch_stats`` mutable is a
    training forward (dropout on); ``train=`` overrides it and is passed on to the backbone.
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
            raise SurgeryError(f"ClassifierHead: the backbone returns shape {features.shape}; "
                               "expected [B, h, w, C] or [B, C]")
        if self.num_features is not None and features.shape[-1] != self.num_features:
            raise SurgeryError(f"ClassifierHead: the head expects {self.num_features} features but the backbone "
                               f"{type(self.backbone).__name__} outputs {features.shape[-1]}")
        return self.classify(features, train)

    @nn.compact
    def classify(self, features, train: bool = False):
        """Dropout and the Dense ``classifier`` on pooled features ``[B, C]`` (initialisable alone)."""
        features = nn.Dropout(self.drop_rate, deterministic=not train)(features)
        init = _zero_columns_from(self.kernel_init, self.num_classes)
        logits = nn.Dense(self.num_outputs, dtype=self.dtype, kernel_init=init, name="classifier")(features)
        return logits.astype(jnp.float32)


def attach_head(backbone: nn.Module, backbone_variables: dict, num_classes: int, sample_input, *,
                drop_rate: float = 0.0, pad_to: int = 1, num_features: int | None = None,
                dtype: Any = jnp.float32, seed: int = 0) -> Surgery:
    """A :class:`ClassifierHead` on ``backbone``: a fresh head, the backbone's variables unchanged.

    ``backbone`` is e.g. the module of ``efficientnet_v2_pretrained`` (its ``num_features`` is
    checked against what it outputs); ``backbone_variables`` must fit it exactly -- any leaf of
    the backbone left at its random init would be a silent accident. Only the classifier is
    initialised (the backbone's shapes are traced), so a large backbone costs no init.
    """
    num_features = num_features or getattr(backbone, "num_features", None)
    head = ClassifierHead(backbone, num_classes, drop_rate=drop_rate, pad_to=pad_to, num_features=num_features,
                          dtype=dtype)
    fresh = _abstract_variables(head, sample_input)
    width = fresh["params"]["classifier"]["kernel"].shape[0]
    classifier = init_variables(head, jax.ShapeDtypeStruct((1, width), jnp.float32), seed=seed,
                                method=ClassifierHead.classify)["params"]["classifier"]
    fresh = {**fresh, "params": {**fresh["params"], "classifier": classifier}}
    nested = {col: {"backbone": tree} for col, tree in backbone_variables.items() if col != "intermediates"}
    variables, report = inherit(nested, fresh)
    misfits = [p for p in report.new if not p.startswith("params/classifier/")]
    if misfits or report.mismatched or report.unused:
        raise SurgeryError(f"attach_head: backbone_variables do not fit the backbone {type(backbone).__name__}:\n"
                           f"{report}")
    return Surgery(head, variables, report)


# --------------------------------------------------------------------------- freezing


def freeze_mask(params: Any, patterns: Patterns) -> Any:
    """A tree of bools like ``params``: True where a pattern matches the leaf's path (frozen).

    Paths are relative to ``params`` (``backbone/blocks_0_0/conv/kernel``); a pattern that
    matches nothing is an error that lists paths, since a typo would otherwise freeze nothing.
    """
    if not _as_patterns(patterns):
        raise SurgeryError("freeze: no patterns given")
    frozen = _select(flatten(params), patterns, "freeze")
    return jax.tree.map_with_path(lambda kp, _: _path(kp) in frozen, params)


def _resolve_mask(params: Any, frozen: Patterns | Any | Callable) -> Any:
    if isinstance(frozen, str) or (isinstance(frozen, Sequence) and all(isinstance(p, str) for p in frozen)):
        return freeze_mask(params, frozen)
    return frozen(params) if callable(frozen) else frozen


def freeze_optimizer(tx: optax.GradientTransformation, frozen: Patterns | Any | Callable
                     ) -> optax.GradientTransformation:
    """``tx`` for the trainable leaves; frozen leaves get a zero update and no optimizer state.

    ``frozen``: patterns, a bool mask like the params, or a function of the params returning one.
    The same ``multi_transform({"train", "frozen"})`` layout as ``train.make_optimizer(frozen=)``,
    so states of either fit :func:`carry_optimizer_state`.
    """

    def labels(params):
        return jax.tree.map(lambda f: "frozen" if f else "train", _resolve_mask(params, frozen))

    return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


def carry_optimizer_state(opt_state: Any, tx: optax.GradientTransformation, params: Any
                          ) -> tuple[Any, InheritReport]:
    """The state of ``tx`` (e.g. with fewer leaves frozen) taking over all that fits from ``opt_state``.

    Optimizer state is per leaf (Adam's moments are trees like the params), so moving leaves from
    frozen to training only initialises *their* state: the moments of the parts already training
    and shared scalars (the step count) carry over. The report's ``new`` lists the fresh leaves.
    """
    return inherit(opt_state, tx.init(params))


def _module_paths(flat_params: dict) -> dict[str, list[str]]:
    modules: dict[str, list[str]] = {}
    for path in flat_params:
        modules.setdefault(path.rpartition("/")[0], []).append(path)
    return modules


def _frozen_modules(params: Any, patterns: Patterns) -> frozenset[str]:
    """Modules (paths) all of whose own parameters are frozen."""
    flat = flatten(params)
    frozen = _select(flat, patterns, "freeze")
    return frozenset(m for m, leaves in _module_paths(flat).items() if all(p in frozen for p in leaves))


def _flax_batchnorm_inference(module, next_fun, arguments):
    """Calls a copy of Flax's BatchNorm with ``use_running_average=True``, bound to the same variables.

    The flag may be fixed in the constructor, and passing it again at call time is an error.
    """
    if module.use_running_average is True:  # already in inference mode (the copy, too)
        return next_fun(**arguments)
    arguments.pop("use_running_average", None)
    return module.clone(parent=module.scope, use_running_average=True)(**arguments)


def _kit_batchnorm_inference(module, next_fun, arguments):
    return next_fun(**{**arguments, "train": False})


# BatchNorm layers and how to call each in inference mode (running statistics, no update).
BATCHNORM_INFERENCE: dict[type, Callable] = {
    nn.BatchNorm: _flax_batchnorm_inference,
    KitBatchNorm: _kit_batchnorm_inference,
}


def _batchnorm_interceptor(frozen_modules: frozenset[str]):
    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        rule = BATCHNORM_INFERENCE.get(type(module))
        if rule is None or context.method_name != "__call__" or "/".join(module.path) not in frozen_modules:
            return next_fun(*args, **kwargs)
        bound = inspect.signature(context.orig_method).bind(*args, **kwargs)
        return rule(module, next_fun, dict(bound.arguments))

    return interceptor


@dataclasses.dataclass(frozen=True)
class FrozenBatchNorm:
    """``model`` whose BatchNorm layers with frozen parameters always run in inference mode.

    In a training forward those layers normalise with their running statistics and do not
    update them, as ``module.eval()`` on a frozen part does in PyTorch: a frozen backbone's
    ``batch_stats`` stay bit-identical. Same ``init`` / ``apply`` as ``model`` (what the training
    steps call); other attributes are ``model``'s. Implemented with ``nn.intercept_methods`` on
    the BatchNorm types in ``BATCHNORM_INFERENCE``, so no model code changes.
    """

    model: Any
    patterns: tuple[str, ...]

    def init(self, *args, **kwargs):
        return self.model.init(*args, **kwargs)

    def apply(self, variables, *args, **kwargs):
        frozen = _frozen_modules(variables.get("params", {}), self.patterns)
        with nn.intercept_methods(_batchnorm_interceptor(frozen)):
            return self.model.apply(variables, *args, **kwargs)

    def __getattr__(self, name):
        if name == "model":  # not yet set (copy / unpickling): avoid recursing
            raise AttributeError(name)
        return getattr(self.model, name)


def freeze_batchnorm(model, patterns: Patterns) -> FrozenBatchNorm:
    """``model`` with the BatchNorm layers whose parameters ``patterns`` freeze kept in inference mode."""
    return FrozenBatchNorm(model, _as_patterns(patterns))


@dataclasses.dataclass(frozen=True)
class FreezeReport:
    """What :func:`freeze` froze: parameter leaves and values, and the BatchNorm layers in inference mode."""

    frozen_leaves: int
    frozen_values: int
    trainable_leaves: int
    trainable_values: int
    inference_batchnorms: tuple[str, ...]  # module paths of BatchNorm layers kept in inference mode

    def __str__(self) -> str:
        return (f"frozen {self.frozen_leaves} leaves ({self.frozen_values:,} values); training "
                f"{self.trainable_leaves} leaves ({self.trainable_values:,} values); "
                f"{len(self.inference_batchnorms)} BatchNorm layers kept in inference mode")


class Frozen(NamedTuple):
    """The model and optimizer that :func:`freeze` returns, and its report."""

    model: FrozenBatchNorm
    tx: optax.GradientTransformation
    report: FreezeReport


def freeze(model, tx: optax.GradientTransformation, variables: dict, patterns: Patterns) -> Frozen:
    """Freezes the parameters ``patterns`` match: the model (BatchNorm) and the optimizer, with a report.

    Unfreeze later by calling it again with fewer patterns and moving the optimizer state over
    with :func:`carry_optimizer_state`.
    """
    params = variables["params"]
    mask = flatten(freeze_mask(params, patterns))
    flat = flatten(params)
    frozen_modules = _frozen_modules(params, patterns)
    stats_modules = sorted(_module_paths(flatten(variables.get("batch_stats", {}))))
    report = FreezeReport(
        frozen_leaves=sum(mask.values()), frozen_values=sum(_size(flat[p]) for p, f in mask.items() if f),
        trainable_leaves=sum(not f for f in mask.values()),
        trainable_values=sum(_size(flat[p]) for p, f in mask.items() if not f),
        inference_batchnorms=tuple(m for m in stats_modules if m in frozen_modules))
    return Frozen(freeze_batchnorm(model, patterns), freeze_optimizer(tx, patterns), report)


# --------------------------------------------------------------------------- input channels


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
        hits = sorted(_select(flat, kernel, "adapt_input_channels kernel"))
    else:  # the one convolution that reads RGB: a 4-D HWIO kernel with 3 input channels
        hits = [p for p, leaf in flat.items() if np.ndim(leaf) == 4 and np.shape(leaf)[2] == 3]
    if len(hits) != 1:
        raise SurgeryError(f"adapt_input_channels: cannot tell the stem kernel: {len(hits)} candidates "
                           f"({_listing(hits) or 'no 4-D kernel with 3 input channels'}); pass kernel=<pattern>")
    return hits[0]


def adapt_input_channels(variables: dict, in_chans: int, *, kernel: Patterns | None = None
                         ) -> tuple[dict, ChannelReport]:
    """The stem convolution of an RGB model changed for ``in_chans`` input channels, as timm does.

    1 channel: the kernel summed over RGB (a grey image gives what its RGB copy gave). More:
    the RGB kernel repeated and scaled by ``3 / in_chans``, so an input of repeated RGB copies
    gives the RGB output. The model itself needs no change when its convolutions take the
    input width from the input (Flax's and the kit's do). ``kernel``: pattern of the stem kernel
    when the only 4-D kernel with 3 input channels is not it.
    """
    if in_chans < 1:
        raise SurgeryError(f"adapt_input_channels: in_chans must be >= 1, got {in_chans}")
    flat = flatten(variables)
    path = _stem_kernel(flat, kernel)
    old = flat[path]
    if np.shape(old)[2] != 3:
        raise SurgeryError(f"adapt_input_channels: {path} has shape {np.shape(old)}: expected an HWIO kernel "
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
    tree = jax.tree.map_with_path(lambda kp, leaf: new if _path(kp) == path else leaf, variables)
    return tree, ChannelReport(path, tuple(np.shape(old)), tuple(new.shape), rule)


# --------------------------------------------------------------------------- features


def _intermediate_name(path: str) -> str:
    """``backbone/blocks_1_0/__call__/0`` -> ``backbone/blocks_1_0``; sown ``stage_2/0`` -> ``stage_2``.

    Flax stores each captured or sown value in a tuple, one entry per call.
    """
    parts = path.split("/")
    if "__call__" in parts:
        i = parts.index("__call__")
        return "/".join(parts[:i] + parts[i + 2:])
    return "/".join(parts[:-1]) if parts[-1].isdigit() else path


def extract_features(model, variables: dict, x, patterns: Patterns) -> dict[str, jax.Array]:
    """Intermediate activations of an evaluation forward: ``{module path or sown name: array}``.

    ``patterns`` select module paths (the output of each matching module's ``__call__``, via
    Flax's ``capture_intermediates``) and values the model sows into ``intermediates`` (the kit's
    EfficientNet sows ``stage_{i}``). For visualising, or as the input of a new head.
    """

    def forward(capture):
        def run(v, x):
            _, state = model.apply(v, x, capture_intermediates=capture, mutable=["intermediates"])
            found: dict[str, Any] = {}
            for path, value in flatten(state.get("intermediates", {})).items():
                found.setdefault(_intermediate_name(path), value)  # a module called twice: its first call
            return found

        return run

    everything = jax.eval_shape(forward(True), variables, x)
    wanted = _select([p for p in everything if p], patterns, "extract_features")

    def capture(module, method_name):
        return method_name == "__call__" and "/".join(module.path) in wanted

    return {k: v for k, v in jax.jit(forward(capture))(variables, x).items() if k in wanted}


# --------------------------------------------------------------------------- inspection


@dataclasses.dataclass(frozen=True)
class ParamTable:
    """Parameter counts per module (trainable / frozen) and bytes per dtype of all variables."""

    rows: tuple[tuple[str, int, int], ...]  # (module, trainable, frozen)
    bytes_by_dtype: dict[str, int]

    @property
    def trainable(self) -> int:
        return sum(r[1] for r in self.rows)

    @property
    def frozen(self) -> int:
        return sum(r[2] for r in self.rows)

    @property
    def total(self) -> int:
        return self.trainable + self.frozen

    def __str__(self) -> str:
        width = max([len(r[0]) for r in self.rows] + [6])
        lines = [f"{'module':<{width}} {'params':>12} {'trainable':>12} {'frozen':>12}"]
        lines += [f"{m:<{width}} {t + f:>12,} {t:>12,} {f:>12,}" for m, t, f in self.rows]
        lines.append(f"{'total':<{width}} {self.total:>12,} {self.trainable:>12,} {self.frozen:>12,}")
        lines.append("bytes: " + ", ".join(f"{d} {_bytes(n)}" for d, n in sorted(self.bytes_by_dtype.items())))
        return "\n".join(lines)


def param_table(variables: dict, *, frozen: Patterns | Any | None = None, depth: int = 1) -> ParamTable:
    """Counts of ``variables["params"]`` per module (the first ``depth`` path parts), trainable vs frozen.

    ``frozen``: patterns or a bool mask like the params. Bytes are over every collection.
    """
    params = variables.get("params", {})
    flat = flatten(params)
    mask = flatten(_resolve_mask(params, frozen)) if frozen is not None else dict.fromkeys(flat, False)
    counts: dict[str, list[int]] = {}
    for path, leaf in flat.items():
        row = counts.setdefault("/".join(path.split("/")[:depth]), [0, 0])
        row[1 if mask[path] else 0] += _size(leaf)
    bytes_by_dtype: dict[str, int] = {}
    for leaf in jax.tree.leaves(variables):
        name = str(np.dtype(leaf.dtype))
        bytes_by_dtype[name] = bytes_by_dtype.get(name, 0) + _nbytes(leaf)
    natural = sorted(counts, key=lambda m: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", m)])
    return ParamTable(tuple((m, *counts[m]) for m in natural), bytes_by_dtype)


def count_flops(model, variables: dict, sample_input) -> float:
    """Floating-point operations of one evaluation forward on ``sample_input``, per XLA's cost analysis.

    Counted on the lowered program (no compilation); a multiply-add counts as two.
    """
    cost = jax.jit(model.apply).lower(variables, sample_input).cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per program
        cost = cost[0]
    if not cost or "flops" not in cost:
        raise SurgeryError(f"count_flops: XLA's cost analysis gave no FLOP count on {jax.default_backend()}")
    return float(cost["flops"])


# --------------------------------------------------------------------------- casting


@dataclasses.dataclass(frozen=True)
class CastReport:
    """What :func:`cast` did: how many leaves changed dtype and the bytes before and after."""

    dtype: str
    cast_leaves: int
    kept_leaves: int  # integer / bool leaves, never cast
    bytes_before: int
    bytes_after: int

    def __str__(self) -> str:
        return (f"cast {self.cast_leaves} floating leaves to {self.dtype} ({_bytes(self.bytes_before)} -> "
                f"{_bytes(self.bytes_after)}); {self.kept_leaves} non-floating leaves kept")


def cast(tree: Any, dtype: Any) -> tuple[Any, CastReport]:
    """Every floating leaf cast to ``dtype`` (bf16/fp16 to store, fp32 to train); others untouched."""
    dtype = jnp.dtype(dtype)
    out = jax.tree.map(lambda x: jnp.asarray(x, dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)
    leaves = jax.tree.leaves(tree)
    floating = sum(bool(jnp.issubdtype(x.dtype, jnp.floating)) for x in leaves)
    return out, CastReport(str(dtype), floating, len(leaves) - floating, sum(map(_nbytes, leaves)),
                           sum(map(_nbytes, jax.tree.leaves(out))))
