"""Looking inside a model: intermediate features, parameter counts, FLOPs; and casting its variables."""
import collections
import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..variable_trees import Patterns, VariableTreeError, flatten, freeze_mask, leaf_size, select_paths


def _nbytes(leaf) -> int:
    return leaf_size(leaf) * np.dtype(leaf.dtype).itemsize


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KiB" if n < 2**20 else f"{n / 2**20:.1f} MiB"


def _intermediate_name(path: str) -> str:
    """``backbone/blocks_1_0/__call__/0`` -> ``backbone/blocks_1_0``; sown ``stage_2/0`` -> ``stage_2``
    (Flax keeps a tuple per captured or sown value, one entry per call)."""
    parts = path.split("/")
    if "__call__" in parts:
        i = parts.index("__call__")
        return "/".join(parts[:i] + parts[i + 2:])
    return "/".join(parts[:-1]) if parts[-1].isdigit() else path


def extract_features(model, variables: dict, x, patterns: Patterns) -> dict[str, jax.Array]:
    """Intermediate activations of an evaluation forward, ``{module path or sown name: array}``: ``patterns`` select
    modules' ``__call__`` outputs and values sown into ``intermediates`` (the kit's EfficientNet sows ``stage_{i}``)."""

    def forward(capture):
        def run(v, x):
            _, state = model.apply(v, x, capture_intermediates=capture, mutable=["intermediates"])
            found: dict[str, Any] = {}
            for path, value in flatten(state.get("intermediates", {})).items():
                found.setdefault(_intermediate_name(path), value)  # a module called twice: its first call
            return found

        return run

    everything = jax.eval_shape(forward(True), variables, x)
    wanted = select_paths([p for p in everything if p], patterns, "extract_features")

    def capture(module, method_name):
        return method_name == "__call__" and "/".join(module.path) in wanted

    return {k: v for k, v in jax.jit(forward(capture))(variables, x).items() if k in wanted}


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
    """Counts of ``variables["params"]`` per module (the first ``depth`` path parts), trainable vs frozen
    (``frozen``: patterns or a bool mask like the params); bytes over every collection."""
    params = variables.get("params", {})
    flat = flatten(params)
    mask = flatten(freeze_mask(params, frozen)) if frozen is not None else dict.fromkeys(flat, False)
    counts: dict[str, list[int]] = {}
    for path, leaf in flat.items():
        row = counts.setdefault("/".join(path.split("/")[:depth]), [0, 0])
        row[1 if mask[path] else 0] += leaf_size(leaf)
    bytes_by_dtype = collections.Counter()
    for leaf in jax.tree.leaves(variables):
        bytes_by_dtype[str(np.dtype(leaf.dtype))] += _nbytes(leaf)
    natural = sorted(counts, key=lambda m: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", m)])
    return ParamTable(tuple((m, *counts[m]) for m in natural), dict(bytes_by_dtype))


def count_flops(model, variables: dict, sample_input) -> float:
    """Floating-point operations of one evaluation forward on ``sample_input``, per XLA's cost analysis
    of the lowered program (nothing compiled); a multiply-add counts as two."""
    cost = jax.jit(model.apply).lower(variables, sample_input).cost_analysis()
    if not cost or "flops" not in cost:
        raise VariableTreeError(f"count_flops: XLA's cost analysis gave no FLOP count on {jax.default_backend()}")
    return float(cost["flops"])


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
