"""A run on disk: ``config.json``, the manifest each checkpoint carries, and a run read back from either."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from .. import checkpoint
from ..config import TrainConfig, overrides
from ..variable_trees import abstract_variables
from .build import Plan, build_model


def write_config(out_dir: str | Path, config: TrainConfig, plan: Plan, *, given: TrainConfig | None = None,
                 notes: dict | None = None) -> Path:
    """``config.json``: the resolved config (what ``--resume`` compares), the overrides as given, the plan and
    ``notes`` (e.g. ``lr_find``: how ``--lr auto`` found the lr)."""
    path = Path(out_dir) / "config.json"
    record = {"config": config.to_dict(), "given": overrides(given or config), "plan": dataclasses.asdict(plan),
              **(notes or {})}
    checkpoint.atomic_write_text(path, json.dumps(record, indent=2, default=list) + "\n")
    return path


def run_manifest(config: TrainConfig, plan: Plan) -> dict:
    """What every checkpoint of a run carries: enough for :func:`load_run` to rebuild its model."""
    return {"kind": "kaggle_utils run", "config": config.to_dict(), "plan": dataclasses.asdict(plan)}


def checkpoint_file(path: Path) -> Path:
    """The checkpoint a run folder is read from (its best, else its last); a file as itself."""
    if path.is_dir():
        for name in ("best.msgpack", "last.msgpack"):
            if (path / name).is_file():
                return path / name
        raise checkpoint.CheckpointError(f"{path} holds no best.msgpack or last.msgpack: not a run folder of the kit")
    if not path.is_file():
        raise checkpoint.CheckpointError(f"{path} does not exist")
    return path


def load_run(path: str | Path) -> tuple[nn.Module, dict, TrainConfig]:
    """``(model, variables, config)`` of a run folder (its best checkpoint) or one of its checkpoints: the evaluation
    variables (EMA weights where kept), checked leaf by leaf against the model the config builds."""
    file = checkpoint_file(Path(path))
    manifest_file = checkpoint.manifest_path(file)
    if not manifest_file.is_file():
        raise checkpoint.CheckpointError(f"{file} has no manifest {manifest_file.name} beside it: cannot tell which "
                                         "run wrote it")
    manifest = json.loads(manifest_file.read_text())
    if "config" not in manifest:
        what = manifest.get("model") if isinstance(manifest.get("model"), str) else None
        raise checkpoint.CheckpointError(
            f"{file} is not a checkpoint of a training run" + (f": it holds ported {what} weights (weights_port); "
                                                               f"fine-tune them with train --weights {file}"
                                                               if what else " (its manifest has no 'config')"))
    config = TrainConfig.from_dict(manifest["config"], where=f"{manifest_file} config")
    model = build_model(config)
    raw = checkpoint.load(file)
    if "state" in raw:  # last.msgpack / ckpt-*.msgpack: the whole training state
        state = raw["state"]
        raw = {"params": state.get("ema_params") or state["params"], "batch_stats": state.get("batch_stats", {})}
    variables = {k: raw[k] for k in ("params", "batch_stats") if k in raw}
    size = config.model.image_size
    template = abstract_variables(model, jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32))
    checkpoint.check_tree(variables, template, what=f"checkpoint {file} for {config.model.name} with "
                                                   f"{config.model.num_classes} classes")
    return model, jax.tree.map(lambda v, t: np.asarray(v, t.dtype), variables, template), config
