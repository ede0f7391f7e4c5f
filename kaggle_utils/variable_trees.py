"""Variable trees: what the training engine and model surgery both need, and nothing of either.

A leaf is named by its ``/``-joined path (``params/blocks_0_0/conv/kernel``) and selected by regular
expressions; one matching nothing is an error (a typo would otherwise select nothing unnoticed).
"""
import difflib
import functools
import re
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:
    import optax

Patterns = str | Sequence[str]


class VariableTreeError(ValueError):
    """A request on a variable tree that cannot be carried out as asked (``surgery.SurgeryError`` too)."""


def path_name(keypath) -> str:
    """The ``/``-joined name of a jax key path (``params/conv/kernel``), as :func:`flatten` names leaves."""
    return jax.tree_util.keystr(keypath, simple=True, separator="/")


def flatten(tree: Any) -> dict[str, Any]:
    """``{"params/conv/kernel": leaf, ...}`` for any pytree (dicts, optax states, lists)."""
    return {path_name(kp): leaf for kp, leaf in jax.tree.flatten_with_path(tree)[0]}


def unflatten(flat: dict[str, Any]) -> dict:
    """The nested dicts of a ``flatten``-ed variable tree (dict trees only)."""
    tree: dict = {}
    for path, leaf in flat.items():
        *parents, name = path.split("/")
        node = tree
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise VariableTreeError(
                    f"unflatten: {'/'.join(parents[:i + 1])!r} is both a leaf and a prefix of {path!r}")
        if name in node:
            raise VariableTreeError(f"unflatten: {path!r} is both a leaf and a prefix of other paths")
        node[name] = leaf
    return tree


def shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """The flat ``path -> shape`` view of a tree: what a model holds, at a glance."""
    return {path: tuple(np.shape(leaf)) for path, leaf in flatten(tree).items()}


def leaf_size(leaf) -> int:
    """The number of values in a leaf (an array or a ``ShapeDtypeStruct``)."""
    return int(np.prod(np.shape(leaf), dtype=np.int64))


def listing(items: Sequence[str], limit: int = 8) -> str:
    """The first ``limit`` items, comma-separated, and how many there are in all when some are left out."""
    return ", ".join(items[:limit]) + (f", ... ({len(items)} in all)" if len(items) > limit else "")


def as_patterns(patterns: Patterns) -> tuple[str, ...]:
    return (patterns,) if isinstance(patterns, str) else tuple(patterns)


def _nearby(paths: Sequence[str], pattern: str, n: int = 6) -> str:
    """A few paths to show beside a pattern that matched nothing: the closest, then the first."""
    close = difflib.get_close_matches(pattern, paths, n=n // 2, cutoff=0.0)
    return listing(close + [p for p in paths if p not in close], n)


def select_paths(paths: Iterable[str], patterns: Patterns, what: str) -> set[str]:
    """The paths that any pattern matches (``re.search``); a pattern matching none is an error naming ``what``."""
    paths = list(paths)
    selected: set[str] = set()
    for pattern in as_patterns(patterns):
        try:
            regex = re.compile(pattern)
        except re.error as err:
            raise VariableTreeError(f"{what}: {pattern!r} is not a regular expression ({err})") from None
        hits = {p for p in paths if regex.search(p)}
        if not hits:
            raise VariableTreeError(f"{what}: pattern {pattern!r} matches no path; "
                                    f"paths look like: {_nearby(paths, pattern)}")
        selected |= hits
    return selected


def _init_rngs(seed: int) -> dict:  # rbg: each initialiser lowers to one random-bits op, much faster to compile
    params_key, dropout_key = jax.random.split(jax.random.key(seed, impl="rbg"))
    return {"params": params_key, "dropout": dropout_key}


def _without_sown(variables: dict) -> dict:
    return {k: v for k, v in variables.items() if k != "intermediates"}


def init_variables(model, sample_input, *, seed: int = 0, method: Callable | None = None) -> dict:
    """Fresh variables of ``model`` for an input shaped like ``sample_input`` (an array or a
    ``jax.ShapeDtypeStruct``: only its shape and dtype matter); sown values dropped."""
    x = jnp.zeros(np.shape(sample_input), sample_input.dtype)
    return _without_sown(jax.jit(functools.partial(model.init, method=method))(_init_rngs(seed), x))


def abstract_variables(model, sample_input) -> dict:
    """The shapes and dtypes (``ShapeDtypeStruct`` leaves) :func:`init_variables` would give, traced
    without compiling anything: a large model costs no init."""
    x = jax.ShapeDtypeStruct(np.shape(sample_input), sample_input.dtype)
    return _without_sown(jax.eval_shape(model.init, _init_rngs(0), x))


def freeze_mask(params: Any, frozen: Patterns | Any | Callable) -> Any:
    """A tree of bools like ``params``, True where frozen: ``frozen`` is patterns of the leaves' paths (relative to
    ``params``: ``backbone/blocks_0_0/conv/kernel``), a function of the params giving the mask, or the mask."""
    if not (isinstance(frozen, str) or (isinstance(frozen, Sequence) and all(isinstance(p, str) for p in frozen))):
        return frozen(params) if callable(frozen) else frozen
    if not as_patterns(frozen):
        raise VariableTreeError("freeze: no patterns given")
    paths = select_paths(flatten(params), frozen, "freeze")
    return jax.tree.map_with_path(lambda kp, _: path_name(kp) in paths, params)


def freeze_optimizer(tx: "optax.GradientTransformation", frozen: Patterns | Any | Callable
                     ) -> "optax.GradientTransformation":
    """``tx`` for the trainable leaves; the leaves :func:`freeze_mask` reads ``frozen`` as get a zero update and no
    state. One layout for the engine and ``surgery.freeze``, so either state carries over."""
    import optax  # here: the model and checkpoint code import this module and no optimizer library

    def labels(params):
        return jax.tree.map(lambda f: "frozen" if f else "train", freeze_mask(params, frozen))

    return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
