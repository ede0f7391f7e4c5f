"""Port a timm EfficientNet to a Flax msgpack: load, convert, verify numerically, then write.

The files are written only if timm's and Flax's fp32 logits agree, so a weights file that exists has been
checked. Checkpoints are read without unpickling code (``torch.load(weights_only=True)`` or safetensors).
"""
import dataclasses
import platform
import tempfile
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch

with warnings.catch_warnings():
    # timm imports wandb where it is installed; wandb 0.22 (Kaggle's GPU image) warns about its own fields
    # under pydantic >= 2.12, which would bury the porter's one-line errors
    warnings.filterwarnings("ignore", module=r"pydantic\.")
    import timm
from safetensors.torch import load_file

from kaggle_utils import checkpoint
from kaggle_utils.efficientnet import create_model, resolve_name

from .convert import ConversionError, convert_timm, is_batchnorm_counter

DEFAULT_TOLERANCE = 1e-4  # max |logit diff| / max |logit|, fp32 with highest matmul precision


class VerificationError(RuntimeError):
    """The Flax port does not reproduce timm's outputs; nothing was written."""


class OutputError(ValueError):
    """The weights cannot be written where asked; the message names the path."""


def check_output(out: str | Path) -> Path:
    """Refuses an ``out`` that cannot be written before the minutes of loading and verifying, by writing a
    temporary file in the nearest existing folder (permission bits say nothing of read-only mounts or root)."""
    out = Path(out)
    for target in (out, checkpoint.manifest_path(out)):
        if target.is_dir():
            raise OutputError(f"--out {out}: {target} is a folder; give a file name ending in .msgpack")
    folder = out.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise OutputError(f"--out {out}: cannot write in {folder}: {e.strerror or e}") from None
    return out


@dataclasses.dataclass
class PortResult:
    name: str
    num_classes: int
    max_abs_diff: float
    max_rel_diff: float
    out: Path | None
    sha256: str | None


def load_torch_state_dict(path: str | Path) -> dict:
    """Reads ``.safetensors`` / ``.pth`` / ``.pt`` / ``.bin`` tensors only, never pickled code."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.suffix == ".safetensors":
        try:
            state = load_file(str(path))
        except Exception as e:  # safetensors raises its own error types for a truncated or damaged file
            raise ConversionError(f"cannot read {path} as a safetensors file (truncated or damaged?): {e}") from e
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ConversionError(f"cannot read {path} as a tensor-only torch checkpoint: {e}") from e
    for wrapper in ("state_dict", "model", "state_dict_ema"):  # training-script checkpoints
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
            break
    if not isinstance(state, dict) or not state:
        raise ConversionError(f"{path} holds no state_dict (got {type(state).__name__})")
    return {k.removeprefix("module."): v for k, v in state.items()}


def timm_model(name: str, *, checkpoint_path: str | Path | None = None, pretrained: bool = False,
               num_classes: int | None = None, seed: int = 0):
    """The timm model to port: from a local checkpoint, timm's pretrained weights, or random."""
    if checkpoint_path is not None:
        state = load_torch_state_dict(checkpoint_path)
        head = state.get("classifier.weight")
        n = num_classes if num_classes is not None else (int(head.shape[0]) if head is not None else 0)
        model = timm.create_model(name, pretrained=False, num_classes=n)
        shapes = lambda sd: {k: jax.ShapeDtypeStruct(np.shape(v), np.float32) for k, v in sd.items()}  # noqa: E731
        want = {k: v for k, v in model.state_dict().items() if k in state or not is_batchnorm_counter(k)}
        try:  # checked here: torch's own error is a page of "size mismatch" lines; exports may omit the counters
            checkpoint.check_tree(shapes(state), shapes(want), what=f"checkpoint {checkpoint_path} for {name}")
        except checkpoint.CheckpointError as e:
            raise ConversionError(str(e)) from None
        counters = {k: v for k, v in model.state_dict().items() if is_batchnorm_counter(k) and k not in state}
        model.load_state_dict({**state, **counters})  # strict: only the counters may come from the fresh model
        return model.eval()
    if pretrained:
        try:
            model = timm.create_model(name, pretrained=True, **({} if num_classes is None else
                                                                  {"num_classes": num_classes}))
        except Exception as e:
            raise ConnectionError(
                f"timm could not fetch pretrained weights for {name} ({type(e).__name__}: {e}). "
                "This needs internet (e.g. a Kaggle notebook with internet on); offline, pass "
                "--checkpoint FILE with a downloaded .safetensors/.pth, or --random for a demo.") from e
        return model.eval()
    torch.manual_seed(seed)
    return timm.create_model(name, pretrained=False, num_classes=1000 if num_classes is None else num_classes).eval()


def verify(model, variables: dict, name: str, *, input_size: int = 128, batch: int = 2, seed: int = 0,
           tolerance: float = DEFAULT_TOLERANCE) -> tuple[float, float]:
    """Runs timm and Flax on one random batch in full fp32; returns (max abs, max relative) diff."""
    x = np.random.default_rng(seed).standard_normal((batch, input_size, input_size, 3), dtype=np.float32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        ref = model(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))).float().numpy()
    flax_model = create_model(name, num_classes=ref.shape[-1] if ref.ndim == 2 else 0)
    with jax.default_matmul_precision("highest"):
        out = np.asarray(jax.jit(flax_model.apply)(variables, jnp.asarray(x)))
    abs_diff = float(np.max(np.abs(out - ref)))
    rel_diff = abs_diff / max(float(np.max(np.abs(ref))), 1e-12)
    if not rel_diff <= tolerance:  # also catches NaN
        raise VerificationError(f"{name}: Flax logits differ from timm's by {abs_diff:.3g} "
                                f"({rel_diff:.3g} of the logit scale > {tolerance:g}); nothing written")
    return abs_diff, rel_diff


def port(name: str, out: str | Path | None, *, checkpoint_path: str | Path | None = None, pretrained: bool = True,
         num_classes: int | None = None, verify_size: int = 128, seed: int = 0,
         tolerance: float = DEFAULT_TOLERANCE) -> PortResult:
    """Loads, converts, verifies and (if ``out``) writes ``out`` + its JSON manifest atomically."""
    name = resolve_name(name)
    if out is not None:
        out = check_output(out)
    model = timm_model(name, checkpoint_path=checkpoint_path, pretrained=pretrained and checkpoint_path is None,
                       num_classes=num_classes, seed=seed)
    variables = convert_timm(model, name, num_classes=num_classes)
    n_cls = int(variables["params"]["classifier"]["bias"].shape[0]) if "classifier" in variables["params"] else 0
    abs_diff, rel_diff = verify(model, variables, name, input_size=verify_size, seed=seed, tolerance=tolerance)
    sha = None
    if out is not None:
        if checkpoint_path is not None:
            source = f"checkpoint {Path(checkpoint_path).name}"
        elif pretrained:
            source = f"timm pretrained {getattr(model, 'pretrained_cfg', {}).get('hf_hub_id') or name}"
        else:
            source = f"random init (seed {seed}); for demos and tests only"
        cfg = {k: v for k, v in dict(getattr(model, "pretrained_cfg", {}) or {}).items()
               if k in ("mean", "std", "input_size", "test_input_size", "crop_pct", "interpolation", "tag",
                        "hf_hub_id", "license")}
        manifest = dict(model=name, source=source, num_classes=n_cls, pretrained_cfg=cfg,
                        max_abs_logit_diff=abs_diff, max_rel_logit_diff=rel_diff,
                        verify_input=[2, verify_size, verify_size, 3], timm_version=timm.__version__,
                        jax_version=jax.__version__, python=platform.python_version(),
                        format="flax.serialization msgpack of {params, batch_stats}")
        try:
            sha = checkpoint.save(out, variables, manifest=manifest)
        except OSError as e:
            raise OutputError(f"--out {out}: cannot write {e.filename or out}: {e.strerror or e}") from None
    return PortResult(name, n_cls, abs_diff, rel_diff, Path(out) if out else None, sha)
