"""A run's checkpoint read back, and ``--init-from``: a new run from a finished run's weights, classifier included.

Unlike ``--weights`` (ported weights, a new head) and ``--resume`` (the same run continued): a second
stage at a larger size, more epochs, a lower rate, another split. The parent's model and classes must be
this run's; config.json records its path.
"""
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from .. import checkpoint
from ..config import ConfigError, TrainConfig
from ..surgery import padded_width
from ..variable_trees import abstract_variables


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


def run_config(file: Path) -> TrainConfig:
    """The config of the run that wrote checkpoint ``file`` (its manifest)."""
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
    return TrainConfig.from_dict(manifest["config"], where=f"{manifest_file} config")


def run_variables(file: Path, model: nn.Module, config: TrainConfig) -> dict:
    """The evaluation variables (EMA weights where kept) of checkpoint ``file``, checked leaf by leaf with ``model``."""
    raw = checkpoint.load(file)
    if "state" in raw:  # last.msgpack / ckpt-*.msgpack: the whole training state
        state = raw["state"]
        raw = {"params": state.get("ema_params") or state["params"], "batch_stats": state.get("batch_stats", {})}
    variables = {k: raw[k] for k in ("params", "batch_stats") if k in raw}
    if "classifier" in variables["params"]:  # cut to the classes, padded to this run's --head-multiple (a TPU's 128)
        classes = config.model.num_classes
        width = padded_width(classes, config.model.head_multiple)
        head = jax.tree.map(lambda v: np.pad(np.asarray(v)[..., :classes], [(0, 0)] * (np.ndim(v) - 1) +
                                             [(0, width - classes)]), variables["params"]["classifier"])
        variables["params"] = {**variables["params"], "classifier": head}
    size = config.model.image_size
    template = abstract_variables(model, jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32))
    checkpoint.check_tree(variables, template, what=f"checkpoint {file} for {config.model.name} with "
                                                   f"{config.model.num_classes} classes")
    return jax.tree.map(lambda v, t: np.asarray(v, t.dtype), variables, template)


def check_parent(config: TrainConfig) -> Path | None:
    """The checkpoint ``--init-from`` names, refused (naming both) unless its model and classes are this run's."""
    if config.model.init_from is None:
        return None
    try:
        file = checkpoint_file(Path(config.model.init_from))
        parent = run_config(file)
    except checkpoint.CheckpointError as err:
        raise ConfigError(f"--init-from: {err}") from None
    names = (parent.data.class_names, config.data.class_names)
    names = names if all(names) else ((), ())  # compared where both runs name their classes
    for what, theirs, ours in (("--model", parent.model.name, config.model.name), ("class names", *names),
                               ("classes", parent.model.num_classes, config.model.num_classes)):
        if theirs != ours:
            raise ConfigError(f"--init-from {file}: its run trained {what} {theirs}, this run has {ours}; the "
                              "classifier is kept, so both must match (--weights starts a new head)")
    return file
