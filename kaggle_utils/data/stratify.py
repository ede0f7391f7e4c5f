"""Iterative stratification of multi-label data (Sechidis, Tsoumakas and Vlahavas, ECML PKDD 2011), for a
conversion's validation split and CV folds: scikit-multilearn's algorithm (order 1), in numpy, seeded.

Each subset ``j`` wants ``p_j * n_c`` examples of class ``c``; the class with the fewest examples left (ties at
random) has each placed where that class is most wanted (ties: most examples wanted, then at random), lowering
that subset's wants for every class of the example; examples with no class go where most examples are wanted.
"""

from typing import Sequence

import numpy as np


def _most(wants: np.ndarray, then: np.ndarray, rng: np.random.Generator) -> int:
    """The index of the largest ``wants``; ties broken by the largest ``then``, then at random."""
    best = np.flatnonzero(wants == wants.max())
    if len(best) > 1:
        best = best[then[best] == then[best].max()]
    return int(best[0] if len(best) == 1 else rng.choice(best))


def iterative_stratification(labels: np.ndarray, proportions: Sequence[float], seed: int = 0) -> np.ndarray:
    """The subset (0..len(proportions)-1) of each example of multi-hot ``labels`` ``[N, C]``; ``proportions``: each
    subset's share (normalised), e.g. ``[1] * k`` for k folds; ``seed`` orders the examples and breaks every tie."""
    present = np.asarray(labels) > 0.5
    if present.ndim != 2:
        raise ValueError(f"labels must be multi-hot [N, C], got shape {present.shape}")
    shares = np.asarray(proportions, np.float64)
    if shares.ndim != 1 or len(shares) < 2 or np.any(shares < 0) or shares.sum() <= 0:
        raise ValueError(f"proportions must be two or more shares >= 0, not all 0; got {list(proportions)}")
    shares = shares / shares.sum()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(present))
    counts = present.sum(0).astype(np.int64)  # examples of each class not placed yet
    wanted = np.outer(shares, counts)  # [subsets, C]: examples of each class each subset still wants
    room = shares * len(present)  # examples each subset still wants
    subset = np.full(len(present), -1, np.int64)
    while np.any(counts > 0):
        rarest = np.flatnonzero(counts == counts[counts > 0].min())
        label = int(rng.choice(rarest))
        for i in order[(subset[order] < 0) & present[order, label]]:
            j = _most(wanted[:, label], room, rng)
            subset[i] = j
            wanted[j] -= present[i]
            room[j] -= 1
            counts -= present[i]
    for i in order[subset[order] < 0]:  # no class at all
        j = _most(room, room, rng)
        subset[i] = j
        room[j] -= 1
    return subset
