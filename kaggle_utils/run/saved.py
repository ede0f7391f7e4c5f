"""A run on disk: ``config.json``, the manifest each checkpoint carries, and a run read back from either."""
import dataclasses
import json
from pathlib import Path

from flax import linen as nn

from .. import checkpoint
from ..config import TrainConfig, overrides
from .build import Plan, build_model
from .init_from import checkpoint_file, run_config, run_variables


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


def load_run(path: str | Path) -> tuple[nn.Module, dict, TrainConfig]:
    """``(model, variables, config)`` of a run folder (its best checkpoint) or one of its checkpoints: the evaluation
    variables (EMA weights where kept), checked leaf by leaf against the model the config builds."""
    file = checkpoint_file(Path(path))
    config = run_config(file)
    model = build_model(config)
    return model, run_variables(file, model, config), config
