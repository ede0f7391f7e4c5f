"""What a run's compiled steps need per device, and ``--batch-per-device auto``: the largest batch that fits.

Why compile instead of estimate: what a step holds at once depends on the model, size, ``--precision``,
``--remat`` and ``--accumulate-steps``, and XLA's buffer assignment knows it exactly. The run's own steps,
compiled for abstract inputs on the run's mesh (or a TPU's compile-only devices), give ``memory_analysis()``
and ``cost_analysis()["flops"]`` per device; a TPU compiler's ``RESOURCE_EXHAUSTED`` counts as "does not fit".
The budget is the allocator's ``bytes_limit``, a target's HBM or ``--memory-budget`` (a CPU reports none);
:data:`MARGIN` stays free for what the analysis does not count (prefetched batches, the eval step, fragmentation).
The search needs few compiles because the bytes grow about linearly with the batch (:func:`largest_batch`).
"""
import dataclasses
import functools
import math
import re
import time
import warnings
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from ..config import ConfigError, TrainConfig
from ..parallel import AXIS, make_mesh
from ..train import inference_state
from ..variable_trees import abstract_variables
from .build import build_model, build_training

MARGIN = 0.10  # of the budget, kept free (see the module docstring)
FIRST_STEP = 8  # the second probe: micro-batch 8, where the bytes' slope is already the batch's
GIB = 2 ** 30
# XLA's CPU code generation without LLVM's expensive passes: the same buffers, so the same memory analysis, in about
# half the compile time (jax 0.7.2 and 0.10.2). Not used on GPU and TPU, where that equality is untested.
_CPU_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
# the TPU compiler's refusal: "... HLO temporaries (98.43G) exceeds available HBM (15.75G)" (libtpu 0.0.42), "Used
# 44.77G of 15.75G hbm" (0.0.23)
_HBM_REFUSAL = re.compile(r"\(([\d.]+)([KMGT])\) exceeds available HBM|Used ([\d.]+)([KMGT]) of [\d.]+G hbm")


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """One step compiled at one per-device batch: the compiler's bytes and FLOPs per device, and its compile time."""

    step: str  # train | eval | predict
    per_device: int
    arguments: int = 0
    outputs: int = 0
    temporaries: int = 0
    code: int = 0
    aliased: int = 0  # donated arguments the outputs reuse (the train state)
    peak: int = 0  # the analysis' own peak, where the backend gives one
    flops: float = 0.0
    seconds: float = 0.0
    refused: str = ""  # the compiler's RESOURCE_EXHAUSTED line: no per-device memory holds the step

    @classmethod
    def refusal(cls, err: Exception, step: str, per_device: int, seconds: float) -> "StepMemory":
        """The compiler's RESOURCE_EXHAUSTED as a step that does not fit: the temporaries it names (or 2**62 bytes)."""
        named = _HBM_REFUSAL.search(str(err))
        value, unit = (named[1] or named[3], named[2] or named[4]) if named else (None, None)
        temporaries = int(float(value) * 1024 ** (1 + "KMGT".index(unit))) if named else 2 ** 62
        return cls(step, per_device, temporaries=temporaries, seconds=seconds, refused=str(err).strip().splitlines()[0])

    @property
    def bytes(self) -> int:
        """Device bytes while the step runs: arguments + outputs + temporaries - aliased + code (or the peak)."""
        return max(self.arguments + self.outputs + self.temporaries - self.aliased + self.code, self.peak)


@dataclasses.dataclass(frozen=True)
class BatchFit:
    """The batch ``--batch-per-device auto`` chose, and what it was measured against."""

    per_device: int
    needed: int  # bytes the compiled train step needs per device at ``per_device``
    budget: int  # bytes
    budget_source: str  # "--memory-budget 2 GiB", "bytes_limit of NVIDIA T4"
    compiles: int
    seconds: float
    data_bound: bool = False  # a larger batch might fit, but the data give no step at that global batch

    def describe(self) -> str:
        bound = "; the data's size bounds it" if self.data_bound else ""
        return (f"batch per device auto: {self.per_device}, its train step needs {gib_text(self.needed)} of "
                f"{gib_text(self.budget * (1 - MARGIN))} ({self.budget_source} less a {MARGIN:.0%} margin){bound}; "
                f"{self.compiles} compiles, {self.seconds:.1f} s")


def gib_text(n: float) -> str:
    return f"{n / GIB:.3g} GiB" if n >= GIB / 100 else f"{n / 2 ** 20:.3g} MiB"


def device_budget(memory_budget_gib: float | None, device=None, *, needed_by: str = "--batch-per-device auto",
                  alternatives: tuple[str, ...] = ("--batch-per-device N",)) -> tuple[int, str]:
    """``(bytes, where they come from)``: ``--memory-budget`` GiB, else the device's own ``bytes_limit``; where it
    has none (a CPU), the error names ``needed_by`` and the flags that would do instead of a budget."""
    if memory_budget_gib is not None:
        if not (memory_budget_gib > 0 and math.isfinite(memory_budget_gib)):
            raise ConfigError(f"--memory-budget {memory_budget_gib}: must be a finite number of GiB > 0")
        return int(memory_budget_gib * GIB), f"--memory-budget {memory_budget_gib:g} GiB"
    device = jax.local_devices()[0] if device is None else device
    limit = (device.memory_stats() or {}).get("bytes_limit")
    if not limit:
        raise ConfigError(f"{needed_by} needs a memory budget: the {device.platform} device ({device.device_kind}) "
                          "reports none (no bytes_limit in memory_stats()); give --memory-budget GiB"
                          + "".join(f", or {flag}" for flag in alternatives))
    return int(limit), f"bytes_limit of {device.device_kind}"


def largest_batch(bytes_at: Callable[[int], int], usable: float, *, limit: int) -> tuple[int, dict[int, int]]:
    """The largest batch ``m`` in ``[1, limit]`` with ``bytes_at(m) <= usable`` (0 if not even 1 fits), and
    ``{m: bytes_at(m)}`` of every batch it measured (one compile each)."""
    measured: dict[int, int] = {}

    def fits(m: int) -> bool:
        measured[m] = bytes_at(m)
        return measured[m] <= usable

    if limit < 1 or not fits(1):
        return 0, measured
    lo, hi = 1, limit + 1  # lo fits; hi does not (limit + 1: beyond what the data allow)
    sides: list[bool] = []
    confirming = False  # the last probe was lo + 1 taken against the rule below: the next may not be
    while hi - lo > 1:
        probe, fallback = _line_estimate(measured, lo, hi, usable)
        if len(sides) >= 2 and sides[-1] == sides[-2] and (probe > lo + 1 or confirming):
            probe, confirming = fallback, False  # two on one side: the line misleads here
        else:
            confirming = len(sides) >= 2 and sides[-1] == sides[-2]
        sides.append(fits(probe))
        lo, hi = (probe, hi) if sides[-1] else (lo, probe)
    return lo, measured


def _line_estimate(measured: dict[int, int], lo: int, hi: int, usable: float) -> tuple[int, int]:
    """``(where the line through the two measured batches nearest the edge reaches usable, the midpoint or
    double lo)``, both strictly inside ``(lo, hi)``."""
    if hi in measured:
        a, b, fallback = lo, hi, (lo + hi) // 2
    else:
        below = [m for m in measured if m < lo]
        a, b = (max(below), lo) if below else (None, lo)
        fallback = 2 * lo if below else FIRST_STEP
    slope = (measured[b] - measured[a]) / (b - a) if a is not None else 0.0
    # a flat line (a TPU's bytes can be equal at 1 and 8 images) never reaches usable: the largest batch allowed
    estimate = math.floor(lo + (usable - measured[lo]) / slope) if slope > 0 else hi - 1 if a is not None else fallback
    return max(lo + 1, min(hi - 1, estimate)), max(lo + 1, min(hi - 1, fallback))


def _abstract_inputs(config: TrainConfig, training, variables, step: str, per_device: int) -> tuple:
    """The state and batch ``step`` receives, as shapes placed on the steps' mesh: pmap's leading device axis, or
    jit's global batch split over the mesh and a replicated state. Prediction gets the variables alone."""
    mesh, pmap = training.steps.mesh, training.steps.mode == "pmap"
    n = mesh.devices.size
    size = config.model.image_size if step == "train" else config.data.eval_image_size or config.model.image_size
    fields = {"image": ((size, size, 3), jnp.uint8), "mask": ((), jnp.bool_)}
    if step != "predict":  # the fields a training read carries (a teacher's probabilities, pseudo-labels' rows)
        rows = config.task.task == "multilabel" or (step == "train" and config.distill.pseudo_labels is not None)
        fields["label"] = ((config.model.num_classes,), jnp.float32) if rows else ((), jnp.int32)
        if step == "train" and "teacher" in training.steps.config.task.fields():
            fields["teacher"] = ((config.model.num_classes,), jnp.float32)
    lead, split = ((n, per_device) if pmap else (n * per_device,)), NamedSharding(mesh, PartitionSpec(AXIS))
    batch = {k: jax.ShapeDtypeStruct(lead + shape, dtype, sharding=split) for k, (shape, dtype) in fields.items()}
    state = training.state if step != "predict" else jax.eval_shape(inference_state, variables)
    devices_axis, whole = ((n,), split) if pmap else ((), NamedSharding(mesh, PartitionSpec()))
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(devices_axis + x.shape, x.dtype, sharding=whole), state)
    return state, batch


def step_compiler(config: TrainConfig, plan, *, mesh=None, mode: str | None = None,
                  task=None) -> Callable[[str, int], StepMemory]:
    """``(step, per-device batch) -> StepMemory`` of the run's train, eval or predict step on ``mesh`` (default every
    device) in ``mode`` (default ``--mode``), compiled for abstract inputs, each once; ``config`` and ``plan``
    resolved with any batch (the shapes are replaced)."""
    size = config.model.image_size
    model = build_model(config)
    variables = abstract_variables(model, jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32))
    training = build_training(config, plan, model, variables, task=task, mode=mode or config.loop.mode,
                              mesh=make_mesh() if mesh is None else mesh)
    device = training.steps.mesh.devices.flat[0]
    on_cpu, compile_only = device.platform == "cpu", device not in jax.devices()  # compile_only: a TPU target's
    executables = {}  # (step, per_device) -> the compiled executable, for its program (as_text()) and shapes

    @functools.cache
    def compiled(step: str, per_device: int) -> StepMemory:
        start = time.perf_counter()
        lowered = training.steps.jitted[step].lower(*_abstract_inputs(config, training, variables, step, per_device))
        try:
            with warnings.catch_warnings():  # a compile-only executable has no client to be cached or loaded from
                if compile_only:
                    warnings.filterwarnings("ignore", "Error (reading|writing) persistent compilation cache entry")
                executable = lowered.compile(_CPU_FAST_COMPILE) if on_cpu else lowered.compile()
        except jax.errors.JaxRuntimeError as err:
            if "RESOURCE_EXHAUSTED" not in str(err):
                raise
            return StepMemory.refusal(err, step, per_device, time.perf_counter() - start)
        stats, executables[step, per_device] = executable.memory_analysis(), executable
        if stats is None:
            raise ConfigError(f"the {jax.default_backend()} backend gives no memory analysis of a compiled step; "
                              "give --batch-per-device N or --batch-size")
        cost = executable.cost_analysis()
        cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}  # jax 0.7.2: a list of one dict
        return StepMemory(step, per_device, stats.argument_size_in_bytes, stats.output_size_in_bytes,
                          stats.temp_size_in_bytes, stats.generated_code_size_in_bytes, stats.alias_size_in_bytes,
                          getattr(stats, "peak_memory_in_bytes", 0) or 0, float(cost.get("flops", 0.0)),
                          time.perf_counter() - start)

    compiled.executables = executables
    return compiled


def fit_batch(config: TrainConfig, plan, *, task=None, per_device_limit: int, budget: tuple[int, str] | None = None,
              compile_step: Callable[[str, int], StepMemory] | None = None) -> BatchFit:
    """The largest per-device batch (a multiple of ``--accumulate-steps``, at most ``per_device_limit``) whose
    train step fits ``budget`` (default :func:`device_budget`), compiled by ``compile_step`` (default the run's
    :func:`step_compiler`); ``config`` and ``plan`` resolved with any per-device batch (it is replaced)."""
    budget, source = budget or device_budget(config.data.memory_budget)
    start = time.perf_counter()
    k = config.optim.accumulate_steps
    compile_step = compile_step or step_compiler(config, plan, task=task)
    usable = budget * (1 - MARGIN)
    limit = max(1, per_device_limit // k)  # a batch of k per device is allowed where --steps-per-epoch says so
    micro, measured = largest_batch(lambda m: compile_step("train", m * k).bytes, usable, limit=limit)
    if micro == 0:
        smallest = f"{k} micro-batches of 1 image" if k > 1 else "1 image"
        raise ConfigError(f"--batch-per-device auto: the smallest batch per device ({smallest}) needs "
                          f"{gib_text(measured[1])}, more than the {gib_text(usable)} of the budget ({source} less a "
                          f"{MARGIN:.0%} margin) for {config.model.name} at {config.model.image_size}px in "
                          f"{config.model.precision}; give a larger --memory-budget, or try --remat blocks, a half "
                          "--precision, a smaller --image-size")
    return BatchFit(per_device=micro * k, needed=measured[micro], budget=budget, budget_source=source,
                    compiles=len(measured), seconds=time.perf_counter() - start,
                    data_bound=micro == limit)

