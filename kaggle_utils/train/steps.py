"""Train / eval / predict steps, written once per replica, run under pmap or jit + shard_map.

Each step sees one replica's slice and reduces over the axis ``"data"`` (gradients, BatchNorm statistics,
metric sums). ``shard_map`` runs with ``check_vma=False``: with the check on, JAX sums an unvarying
parameter's gradient across replicas itself and the explicit ``psum`` would count it twice. Losses are sums
over real examples divided by the *global* real count, so padding never counts and a step on 8 devices
equals one on a device with the same global batch.

The state is a pytree of arrays only (replicated, donated, saved). Weights and optimizer state stay float32
whatever the compute dtype (bf16 moments lose small updates). ``rng`` never changes: keys come from
``(rng, step, replica)``, so a resumed run draws the uninterrupted one's keys.
"""
import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .. import variable_trees, xla_cpu
from ..config import OptimConfig
from ..parallel import AXIS, check_mode, local_devices, make_mesh, prefetch_to_device, shard_batch
from ..precision import LossScale, all_finite
from .tasks import SoftmaxClassification, Task


@struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    batch_stats: Any
    opt_state: Any
    rng: jax.Array
    ema_params: Any = None
    loss_scale: LossScale | None = None  # with fp16 compute

    def variables(self, *, ema: bool = True) -> dict:
        """Model variables for evaluation: the EMA weights when the state keeps them."""
        params = self.ema_params if ema and self.ema_params is not None else self.params
        return {"params": params, "batch_stats": self.batch_stats}


def _fp32(tree):
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else
                        jnp.asarray(x), tree)


def create_train_state(variables: dict, tx: optax.GradientTransformation, *, seed: int = 0,
                       ema: bool = False, loss_scale: bool = False) -> TrainState:
    """A fresh fp32 state from model variables; ``loss_scale``: keep fp16's dynamic scale (``precision.LossScale``)."""
    if "params" not in variables:
        raise KeyError(f"variables need a 'params' collection; got {sorted(variables)}")
    params = _fp32(variables["params"])
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        batch_stats=_fp32(variables.get("batch_stats", {})),
        opt_state=tx.init(params),
        rng=jax.random.key_data(jax.random.key(seed)),
        ema_params=jax.tree.map(jnp.copy, params) if ema else None,
        loss_scale=LossScale.create() if loss_scale else None,
    )


def inference_state(variables: dict) -> TrainState:
    """A state that only evaluates / predicts: the variables, no optimizer state."""
    return TrainState(step=jnp.zeros((), jnp.int32), params=variables["params"],
                      batch_stats=variables.get("batch_stats", {}), opt_state=(),
                      rng=jax.random.key_data(jax.random.key(0)))


def init_variables(model, image_size: int, *, seed: int = 0, channels: int = 3) -> dict:
    """Random ``params`` / ``batch_stats`` of an image model for square inputs
    (:func:`kaggle_utils.variable_trees.init_variables`: a jitted init, faster to compile on CPU)."""
    shape = jax.ShapeDtypeStruct((1, image_size, image_size, channels), jnp.float32)
    variables = variable_trees.init_variables(model, shape, seed=seed)
    return {k: v for k, v in variables.items() if k in ("params", "batch_stats")}


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """What the steps need besides model and optimizer (hashable: part of the compiled step). ``optim``: the config's
    section, of which the step reads ``ema_decay`` (> 0: the state keeps an EMA of the weights,
    :meth:`Steps.init_state`) and ``accumulate_steps``. ``augment``: ``(key, uint8 images) -> uint8 images`` before
    normalisation; ``mix``: ``(key, images, targets, mask) -> (images, targets)`` after it, leaving masked rows
    alone; each with its own key per step and replica."""

    num_classes: int
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)  # of pixel values in [0, 1]; the model's pretrained_cfg
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    task: Task = SoftmaxClassification()
    optim: OptimConfig = OptimConfig()
    tta_flip: bool = False  # predict: average with the horizontally flipped image
    augment: Callable | None = None
    mix: Callable | None = None


def normalize(images: jax.Array, config: StepConfig) -> jax.Array:
    """uint8 ``[B, H, W, C]`` -> float32 ``(x / 255 - mean) / std``, on the device."""
    x = images.astype(jnp.float32) / 255.0
    return (x - jnp.asarray(config.mean, jnp.float32)) / jnp.asarray(config.std, jnp.float32)


def replica_key(rng: jax.Array, step: jax.Array) -> jax.Array:
    """Random key of this step on this replica: different per step and per device."""
    key = jax.random.fold_in(jax.random.wrap_key_data(rng), step)
    return jax.random.fold_in(key, lax.axis_index(AXIS))


def _class_logits(logits: jax.Array, config: StepConfig) -> jax.Array:
    """The real classes' logits in fp32: a head padded to a TPU-friendly width keeps its extra columns out of the
    loss, softmax and argmax, so it trains exactly as an unpadded one."""
    if logits.shape[-1] < config.num_classes:
        raise ValueError(f"the model outputs {logits.shape[-1]} logits but num_classes is {config.num_classes}")
    return logits.astype(jnp.float32)[:, :config.num_classes]


def micro_step(params, batch_stats, batch: dict, key, count, scale, *, model, config: StepConfig):
    """Gradients (of ``loss x scale``), new BatchNorm statistics and task sums of one (micro-)batch on one replica;
    the loss is divided by ``count``, the whole step's real examples, so micro-batch gradients add up exactly.
    Every field but the image and the mask goes to the task, which makes its targets of the ones it reads."""
    dropout_key, augment_key, mix_key = jax.random.split(key, 3)
    images, mask = batch["image"], batch["mask"]
    fields = {name: value for name, value in batch.items() if name not in ("image", "mask")}
    if config.augment is not None:
        images = config.augment(augment_key, images)
    images = normalize(images, config)
    targets = config.task.targets(fields, config.num_classes)
    if config.mix is not None:  # every target blended as the images are
        images, targets = config.mix(mix_key, images, targets, mask)

    def loss_fn(params):
        variables = {"params": params, "batch_stats": batch_stats}
        logits, updates = model.apply(variables, images, mutable=["batch_stats"], rngs={"dropout": dropout_key})
        logits = _class_logits(logits, config)
        losses = config.task.example_losses(logits, targets)
        loss = jnp.sum(jnp.where(mask, losses, 0.0)) / jnp.maximum(count, 1)
        return loss * scale, (logits, losses, updates.get("batch_stats", {}))

    (_, (logits, losses, new_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    # the loss trained on (mixed, smoothed targets, a teacher's); mixed rows count as their main label for accuracy
    labels = fields["label"] if config.mix is None else targets["label"]
    sums = config.task.metric_sums(logits, labels, mask, full=False, losses=losses)
    return grads, new_stats, sums


def _accumulated(state: TrainState, batch: dict, key, count, scale, *, model, config: StepConfig):
    """:func:`micro_step` over ``config.accumulate_steps`` micro-batches one after another: the memory of a batch K
    times smaller for the whole batch's gradient; BatchNorm normalises each micro-batch on its own statistics."""
    step = functools.partial(micro_step, model=model, config=config)
    k = config.optim.accumulate_steps
    if k == 1:
        return step(state.params, state.batch_stats, batch, key, count, scale)
    micro = jax.tree.map(lambda x: x.reshape(k, x.shape[0] // k, *x.shape[1:]), batch)
    first = jax.tree.map(lambda x: x[0], micro)
    grads, stats, sums = step(state.params, state.batch_stats, first, key, count, scale)

    def body(carry, xs):
        grads, stats, sums = carry
        micro_batch, index = xs
        g, stats, s = step(state.params, stats, micro_batch, jax.random.fold_in(key, index), count, scale)
        return (jax.tree.map(jnp.add, grads, g), stats, jax.tree.map(jnp.add, sums, s)), None

    rest = (jax.tree.map(lambda x: x[1:], micro), jnp.arange(1, k))
    return lax.scan(body, (grads, stats, sums), rest)[0]


def train_step(state: TrainState, batch: dict, *, model, tx: optax.GradientTransformation,
               config: StepConfig) -> tuple[TrainState, dict]:
    """One optimizer step on one replica's shard: the new state and ``{"task": summed statistics, "optim":
    grad_norm, param_norm, steps, ...}`` (the loop finishes the first with the task, averages the second over
    ``steps``). With fp16 loss scaling an overflowing step is skipped: it adds only ``optim["skipped"]``."""
    count = lax.psum(jnp.sum(batch["mask"], dtype=jnp.int32), AXIS)
    scale = 1.0 if state.loss_scale is None else state.loss_scale.scale
    key = replica_key(state.rng, state.step)
    grads, batch_stats, task_sums = _accumulated(state, batch, key, count, scale, model=model, config=config)
    grads = lax.psum(grads, AXIS)  # sum of per-replica sums / global count = global mean
    grads = jax.tree.map(lambda g: g / scale, grads) if state.loss_scale is not None else grads
    batch_stats = lax.pmean(batch_stats, AXIS)  # already equal with synchronised BN; averages otherwise
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    ema, decay = state.ema_params, config.optim.ema_decay
    if (ema is not None) != (decay > 0):
        raise ValueError(f"ema_decay is {decay} but the state {'keeps' if ema is not None else 'has no'} EMA weights: "
                         "make the state with Steps.init_state (or create_train_state(ema=ema_decay > 0))")
    if ema is not None:
        # TF's num_updates warm-up: early on the average follows the weights instead of the init
        decay = jnp.minimum(decay, (1.0 + state.step) / (10.0 + state.step))
        ema = jax.tree.map(lambda e, p: e + (1.0 - decay) * (p - e), ema, params)
    task_sums = lax.psum(task_sums, AXIS)
    optim = {"grad_norm": optax.tree.norm(grads), "param_norm": optax.tree.norm(params),  # fp32, as the state
             "steps": jnp.ones((), jnp.int32)}
    stepped = state.replace(params=params, batch_stats=batch_stats, opt_state=opt_state, ema_params=ema)
    if state.loss_scale is not None:
        finite = all_finite(grads)  # the summed gradients: the same verdict on every replica
        stepped = jax.tree.map(lambda new, old: jnp.where(finite, new, old), stepped, state)
        stepped = stepped.replace(loss_scale=state.loss_scale.update(finite))
        task_sums, optim = jax.tree.map(lambda v: jnp.where(finite, v, jnp.zeros_like(v)), (task_sums, optim))
        optim.update(loss_scale=jnp.where(finite, scale, 0.0), skipped=(~finite).astype(jnp.int32))
    return stepped.replace(step=state.step + 1), {"task": task_sums, "optim": optim}


def eval_step(state: TrainState, batch: dict, *, model, config: StepConfig) -> dict:
    """The task's summed statistics of one batch (loss, counts, confusion, ...), over all replicas."""
    logits = _class_logits(model.apply(state.variables(), normalize(batch["image"], config)), config)
    return lax.psum(config.task.metric_sums(logits, batch["label"], batch["mask"], full=True), AXIS)


def predict_step(state: TrainState, batch: dict, *, model, config: StepConfig) -> jax.Array:
    """Class probabilities of the whole global batch (gathered, in batch order) on every replica."""
    images = normalize(batch["image"], config)
    probs = config.task.probabilities(_class_logits(model.apply(state.variables(), images), config))
    if config.tta_flip:
        flipped = model.apply(state.variables(), images[:, :, ::-1])
        probs = 0.5 * (probs + config.task.probabilities(_class_logits(flipped, config)))
    return lax.all_gather(probs, AXIS, tiled=True)


def _first_shard(x, drop_device_axis: bool) -> np.ndarray:
    if not isinstance(x, jax.Array):
        return np.asarray(x)
    data = np.asarray(x.addressable_shards[0].data)
    return data[0] if drop_device_axis else data


@dataclasses.dataclass(frozen=True)
class Steps:
    """Compiled steps plus the placement rules of their mode (state, batches, outputs)."""

    mode: str
    mesh: Mesh
    train: Callable  # jitted (state, device_batch) -> (state, {"task": sums, "optim": figures}); donates the state
    evaluate: Callable  # jitted (state, device_batch) -> metrics
    predict: Callable  # jitted (state, device_batch) -> probabilities [global batch, C]
    config: StepConfig  # the task, num_classes, ...: what the loop needs to read the outputs
    tx: optax.GradientTransformation | None = None  # the train step's optimizer (None: steps that only predict)

    def init_state(self, variables: dict, *, seed: int = 0, loss_scale: bool = False) -> TrainState:
        """The state these steps train from ``variables``: their optimizer's, with EMA weights where
        ``config.optim.ema_decay`` > 0 (one value for the state and the step)."""
        return create_train_state(variables, self.tx, seed=seed, ema=self.config.optim.ema_decay > 0,
                                  loss_scale=loss_scale)

    @property
    def jitted(self) -> dict[str, Callable]:
        """The steps by name, to ``.lower()`` and compile for abstract inputs (a memory plan)."""
        return {"train": self.train, "eval": self.evaluate, "predict": self.predict}

    @property
    def device_count(self) -> int:
        return self.mesh.devices.size

    def put_state(self, tree: Any) -> Any:
        """Host tree -> replicated device tree (pmap: leading device axis; jit: replicated)."""
        if self.mode == "jit":
            return jax.device_put(jax.tree.map(np.asarray, tree), NamedSharding(self.mesh, P()))  # a copy: donated
        devices = local_devices(self.mesh)
        sharding = NamedSharding(Mesh(np.array(devices), (AXIS,)), P(AXIS))
        return jax.tree.map(lambda x: jax.device_put(np.broadcast_to(x, (len(devices), *np.shape(x))), sharding), tree)

    def get(self, tree: Any) -> Any:
        """Replicated device tree -> numpy tree, read from this process's first device."""
        return jax.tree.map(lambda x: _first_shard(x, self.mode == "pmap"), tree)

    def put_batch(self, batch: dict) -> dict:
        """A host batch on the devices, without its host-only fields (ids): what the steps take."""
        return _device_fields(shard_batch(batch, mode=self.mode, mesh=self.mesh))

    def prefetch(self, batches, size: int = 2):
        """:meth:`put_batch` of each batch, ``size`` transfers ahead of the step that reads it."""
        for batch in prefetch_to_device(batches, size, mode=self.mode, mesh=self.mesh):
            yield _device_fields(batch)


def _device_fields(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if isinstance(v, jax.Array)}


def make_steps(model, tx: optax.GradientTransformation, config: StepConfig, *, mode: str = "jit",
               mesh: Mesh | None = None) -> Steps:
    """Compiles the three steps for ``mode`` ("pmap" or "jit") over ``mesh`` (all devices by default)."""
    check_mode(mode)
    mesh = make_mesh() if mesh is None else mesh
    if mesh.devices.flat[0].platform == "cpu":  # each call's scratch memory reused, not faulted in afresh
        xla_cpu.keep_scratch_memory()

    def distribute(step, donate=(), **more):
        fn = functools.partial(step, model=model, config=config, **more)
        if mode == "pmap":
            # every replica returns replicated values (psum / all_gather), one copy per device
            return jax.pmap(fn, axis_name=AXIS, devices=list(mesh.devices.flat), donate_argnums=donate)
        mapped = jax.shard_map(fn, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=P(), check_vma=False)
        return jax.jit(mapped, donate_argnums=donate)

    return Steps(mode=mode, mesh=mesh, train=distribute(train_step, donate=(0,), tx=tx),
                 evaluate=distribute(eval_step), predict=distribute(predict_step), config=config, tx=tx)
