"""A finished run read back: the checkpoint a run folder is read from, the config that wrote it, where its model's
builder lives, its evaluation variables, each checked against what the folder says (``predict``, ``--init-from``,
ensembles, a teacher's provenance).
"""
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from .. import checkpoint, models, surgery
from ..config import ConfigError, TrainConfig
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
    """The config of the run that wrote checkpoint ``file`` (its manifest), refused where the run folder's
    ``config.json`` records another model or other classes (the checkpoint and manifest of another run copied in)."""
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
    import_recorded_model(config, manifest, manifest_file)
    folder_config = file.parent / "config.json"
    try:
        recorded = TrainConfig.from_dict(json.loads(folder_config.read_text())["config"]).model
    except (OSError, ValueError, KeyError, TypeError):
        return config  # a checkpoint outside a run folder, or a folder without a readable config.json
    for what, theirs, ours in (("--model", config.model.name, recorded.name),
                               ("classes", config.model.num_classes, recorded.num_classes)):
        if theirs != ours:
            raise checkpoint.CheckpointError(f"{file}: its manifest {manifest_file.name} records {what} {theirs} but "
                                             f"{folder_config} records {ours}: it is another run's checkpoint")
    return config


def import_recorded_model(config: TrainConfig, record: dict, where: Path) -> None:
    """``config``'s model registered from where ``record`` (a run's config.json or a checkpoint's manifest) says its
    builder lives, when this process has not registered it (:func:`kaggle_utils.models.import_model`)."""
    plan = record.get("plan") if isinstance(record.get("plan"), dict) else {}
    preprocessing = {key: tuple(plan[key]) for key in ("mean", "std") if isinstance(plan.get(key), list)}
    models.import_model(config.model.name, record.get("builder"), where=str(where), **preprocessing)


def run_variables(file: Path, model: nn.Module, config: TrainConfig, *, accept_changed: bool = False) -> dict:
    """The evaluation variables (EMA weights where kept) of checkpoint ``file``, checked leaf by leaf with ``model``
    (``config``: the run predicting, or starting from them). A file changed since its manifest was written is refused
    unless ``accept_changed``; a classifier of another width than its run's classes, always."""
    written_by = run_config(file)
    raw = checkpoint.load(file, accept_changed=accept_changed)
    if "state" in raw:  # last.msgpack / ckpt-*.msgpack: the whole training state
        state = raw["state"]
        raw = {"params": state.get("ema_params") or state["params"], "batch_stats": state.get("batch_stats", {})}
    variables = {k: raw[k] for k in ("params", "batch_stats") if k in raw}
    if "classifier" in variables["params"]:  # cut to the classes, padded to this run's --head-multiple (a TPU's 128)
        found = {np.shape(v)[-1] for v in jax.tree.leaves(variables["params"]["classifier"])}
        written = surgery.padded_width(written_by.model.num_classes, written_by.model.head_multiple)
        if found != {written}:  # a wider head would otherwise be cut as if padded: predicted as this run
            raise checkpoint.CheckpointError(
                f"{file}: its classifier has {'/'.join(map(str, sorted(found)))} outputs, but its run has "
                f"{written_by.model.num_classes} classes (a head {written} wide, per "
                f"{checkpoint.manifest_path(file).name}): it is another run's checkpoint")
        classes = config.model.num_classes
        width = surgery.padded_width(classes, config.model.head_multiple)
        head = jax.tree.map(lambda v: np.pad(np.asarray(v)[..., :classes], [(0, 0)] * (np.ndim(v) - 1) +
                                             [(0, width - classes)]), variables["params"]["classifier"])
        variables["params"] = {**variables["params"], "classifier": head}
    size = config.model.image_size
    template = abstract_variables(model, jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32))
    checkpoint.check_tree(variables, template, what=f"checkpoint {file} for {config.model.name} with "
                                                   f"{config.model.num_classes} classes")
    return jax.tree.map(lambda v, t: np.asarray(v, t.dtype), variables, template)


def check_parent(config: TrainConfig) -> Path | None:
    """The checkpoint ``--init-from`` names, refused (naming both) unless its model and classes are this run's.

    Unlike ``--weights`` (ported weights, a new head) and ``--resume`` (the same run continued): a second stage
    at a larger size, more epochs, a lower rate, another split, the classifier kept."""
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
