"""A run on disk: ``config.json`` and the manifest each checkpoint carries; reading a run back."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .. import checkpoint
from ..config import TrainConfig
from .build import build_model
from .init_from import checkpoint_file, run_config, run_variables
from .resolve import Plan


def write_config(out_dir: str | Path, config: TrainConfig, plan: Plan, *, given: TrainConfig | None = None,
                 notes: dict | None = None) -> Path:
    """``config.json``: the resolved config (what ``--resume`` compares), the overrides as given, the plan.

    ``notes``: more top-level records, e.g. ``lr_find`` (how ``--lr auto`` found the config's lr).
    """
    from ..config import overrides

    path = Path(out_dir) / "config.json"
    record = {"config": config.to_dict(), "given": overrides(given or config), "plan": dataclasses.asdict(plan),
              **(notes or {})}
    checkpoint.atomic_write_text(path, json.dumps(record, indent=2, default=list) + "\n")
    return path


def load_run(path: str | Path) -> tuple[object, dict, TrainConfig]:
    """``(model, variables, config)`` of a run folder (its best checkpoint) or of one of its checkpoints.

    ``variables`` are the evaluation variables (the EMA weights when the run kept them), checked
    leaf by leaf against the model the config builds.
    """
    file = checkpoint_file(Path(path))
    config = run_config(file)
    model = build_model(config)
    return model, run_variables(file, model, config), config
