"""RandAugment in TensorFlow ops, per image inside the pipeline's parallel decode map, compiled with XLA.

Each of ``num_ops`` slots runs one drawn op in a ``tf.switch_case`` (Keras' layer computes them all). The ops
(:mod:`kaggle_utils.randaugment_ops`) are the device RandAugment's, on TF's primitives.
"""

from types import SimpleNamespace
from typing import Sequence

from ..randaugment_ops import MAX_MAGNITUDE, check_policy, op_table
from .tfhost import tf

# randaugment_ops' primitives as TF ops (lambdas: TensorFlow is imported on first use)
TF_PRIMITIVES = SimpleNamespace(
    float32=lambda x: tf.cast(x, tf.float32), int32=lambda x: tf.cast(x, tf.int32),
    uint8=lambda x: tf.cast(x, tf.uint8),
    round_to_uint8=lambda x: tf.saturate_cast(x + 0.5, tf.uint8),  # round half up and saturate to 0..255
    arange=lambda n, dtype="int32": tf.range(n, dtype=dtype), zeros=lambda shape: tf.zeros(shape, tf.int32),
    meshgrid=lambda *args, indexing: tf.meshgrid(*args, indexing=indexing),
    reshape=lambda x, shape: tf.reshape(x, shape), stack=lambda xs: tf.stack(xs),
    concat=lambda xs, axis: tf.concat(xs, axis), pad=lambda x, widths: tf.pad(x, widths),
    take=lambda x, index: tf.gather(x, index), take_along_rows=lambda x, index: tf.gather(x, index, batch_dims=1),
    where=lambda c, a, b: tf.where(c, a, b), clip=lambda x, lo, hi: tf.clip_by_value(x, lo, hi),
    maximum=lambda a, b: tf.maximum(a, b), round=lambda x: tf.round(x), abs=lambda x: tf.abs(x),
    cos=lambda x: tf.cos(x), sin=lambda x: tf.sin(x),
    sum=lambda x, axis, keepdims=False: tf.reduce_sum(x, axis=axis, keepdims=keepdims),
    mean=lambda x: tf.reduce_mean(x), min=lambda x, axis: tf.reduce_min(x, axis=axis),
    max=lambda x, axis: tf.reduce_max(x, axis=axis), cumsum=lambda x, axis: tf.cumsum(x, axis=axis),
    histogram=lambda values, size: tf.math.unsorted_segment_sum(tf.ones_like(values), values, size),
    last_nonzero=lambda x: x.shape[1] - 1 - tf.argmax(tf.reverse(tf.cast(x > 0, tf.int32), [1]), axis=1,
                                                      output_type=tf.int32),
    identity_product=lambda x: tf.matmul(x, tf.eye(x.shape[-1])),
    left_shift=lambda a, b: tf.bitwise.left_shift(a, b), bitwise_and=lambda a, b: tf.bitwise.bitwise_and(a, b),
)
RANDAUGMENT_OPS = op_table(TF_PRIMITIVES)


class RandAugment:
    """RandAugment(n, m): ``image uint8 [H, W, 3] (static shape), seed [2] -> uint8 [H, W, 3]``; per slot one op
    of ``ops``, a magnitude (``m``, or uniform in ``(low, high)``) on imgaug's 0..30 scale and a random sign;
    ``flip`` first mirrors half the images, as imgaug. ``jit_compile``: XLA, faster on CPU (bench/README.md).
    """

    def __init__(self, num_ops: int = 2, magnitude: float | tuple[float, float] = 15, *,
                 ops: Sequence[str] = tuple(RANDAUGMENT_OPS), flip: bool = True, jit_compile: bool = True):
        self.magnitude = check_policy("RandAugment", num_ops, magnitude, ops)
        self.num_ops, self.flip, self.ops, self.jit_compile = num_ops, flip, tuple(ops), jit_compile
        self._compiled = None

    def __repr__(self):
        return (f"RandAugment(num_ops={self.num_ops}, magnitude={self.magnitude}, ops={len(self.ops)}, "
                f"flip={self.flip}, jit_compile={self.jit_compile})")

    def __call__(self, image, seed):
        if self._compiled is None:
            self._compiled = tf.function(self._augment, jit_compile=self.jit_compile)
        # drawn outside the compiled function: XLA's stateless RNG gives other numbers than TF's
        draws = tf.random.stateless_uniform([3 * self.num_ops + 1], seed=seed)
        return self._compiled(tf.convert_to_tensor(image), draws)

    def _augment(self, image, draws):
        if not image.shape.is_fully_defined() or image.shape[-1] != 3 or image.dtype != tf.uint8:
            raise ValueError(f"RandAugment needs uint8 images of a static shape [H, W, 3], got {image.dtype} "
                             f"{image.shape}")
        if self.flip:
            image = tf.cond(draws[-1] < 0.5, lambda: tf.reverse(image, [1]), lambda: image)
        low, high = self.magnitude
        functions = [RANDAUGMENT_OPS[name] for name in self.ops]

        def apply_one_op(slot, image):  # a loop, not unrolled: the ops are traced and compiled once
            which, sign_draw, magnitude_draw = draws[3 * slot], draws[3 * slot + 1], draws[3 * slot + 2]
            index = tf.minimum(tf.cast(which * len(functions), tf.int32), len(functions) - 1)
            sign = tf.where(sign_draw < 0.5, -1.0, 1.0)
            level = sign * (low + magnitude_draw * (high - low)) / MAX_MAGNITUDE
            image = tf.switch_case(index, [lambda fn=fn: fn(image, level) for fn in functions])
            return slot + 1, tf.ensure_shape(image, shape)

        shape = image.shape
        _, image = tf.while_loop(lambda slot, _: slot < self.num_ops, apply_one_op, [tf.constant(0), image],
                                 maximum_iterations=self.num_ops)
        return image
