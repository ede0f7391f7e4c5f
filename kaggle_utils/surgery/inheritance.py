"""Inheritance: a changed model starts from a trained one by taking every leaf that still fits; the other
operations (rewire, heads, carrying optimizer state over) are built on it."""
import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..variable_trees import (Patterns, VariableTreeError, as_patterns, flatten, leaf_size, listing, path_name,
                              select_paths)


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
        mismatched = [f"{p} parent {ps} child {cs}" for p, ps, cs in self.mismatched]
        for label, paths in (("new (fresh init)", self.new), ("mismatched (fresh init)", mismatched),
                             ("reinitialised", self.reinitialised), ("unused from the parent", self.unused)):
            if paths:
                lines.append(f"  {label}: {listing(paths)}")
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
    """``child`` (any pytree: variables, optimizer states) with every leaf whose path and shape match taken from
    ``parent``, in the child's dtype, and a report. Other leaves keep the child's fresh init, as do those ``reinit``
    matches (a classifier for other classes of the same count); nothing to inherit is an error."""
    parent_flat = flatten(parent)
    child_flat = flatten(child)
    fresh = select_paths(child_flat, reinit, "inherit reinit") if as_patterns(reinit) else set()
    inherited, new, mismatched, reinitialised = [], [], [], []
    values = 0

    def take(keypath, leaf):
        nonlocal values
        path = path_name(keypath)
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
        values += leaf_size(leaf)
        return jnp.asarray(source, dtype=leaf.dtype)

    tree = jax.tree.map_with_path(take, child)
    if not inherited:
        reason = (f"{len(mismatched)} common paths all differ in shape (e.g. {mismatched[0]})" if mismatched
                  else "no path in common")
        hint = "" if mismatched else _nesting_hint(list(parent_flat), list(child_flat))
        raise VariableTreeError(
            f"inherit: nothing to inherit: {reason}. Parent paths look like {listing(list(parent_flat), 4)}; "
            f"child paths like {listing(list(child_flat), 4)}.{hint}")
    unused = tuple(p for p in parent_flat if p not in child_flat)
    report = InheritReport(tuple(inherited), tuple(new), tuple(mismatched), tuple(reinitialised), unused, values)
    return tree, report
