"""Layers whose numerics must match PyTorch/timm: convolution padding, BatchNorm, drop path.

Not Flax's own: timm's ``tf_*`` variants pad as TensorFlow's "SAME" (asymmetric at stride 2), the
others symmetrically; PyTorch's BatchNorm keeps the *unbiased* running variance (in fp32 here); and
the lowering of a convolution is chosen per platform (:func:`conv2d`).
"""
import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax import lax

ACTIVATIONS: dict[str, Callable] = {"silu": nn.silu, "swish": nn.silu, "relu": nn.relu, "relu6": nn.relu6,
                                    "gelu": lambda x: nn.gelu(x, approximate=False), "hard_swish": nn.hard_swish}


@dataclasses.dataclass(frozen=True)
class LayerCfg:
    """What every layer of one model shares; passed down as one hashable attribute."""

    act: str = "silu"
    padding: str = "symmetric"  # "same" | "symmetric"
    bn_eps: float = 1e-5
    bn_momentum: float = 0.9  # Flax convention: decay of the running average (= 1 - torch momentum)
    dtype: Any = jnp.float32
    bn_axis_name: str | None = None  # sync BN statistics across this named axis (pmap / shard_map)
    conv_impl: str = "auto"  # "auto" | "xla" | "cpu": see conv2d

    @property
    def act_fn(self) -> Callable:
        if self.act not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.act!r}; choose one of {sorted(ACTIVATIONS)}")
        return ACTIVATIONS[self.act]


def pad_amounts(size: int, kernel: int, stride: int, mode: str) -> tuple[int, int]:
    """(low, high) padding of one spatial axis under timm's rule for ``mode``."""
    if mode == "same":  # TensorFlow SAME: output ceil(size / stride), extra pixel at the end
        out = -(-size // stride)
        total = max((out - 1) * stride + kernel - size, 0)
        return total // 2, total - total // 2
    if mode == "symmetric":
        p = ((stride - 1) + (kernel - 1)) // 2
        return p, p
    raise ValueError(f"unknown padding mode {mode!r}; use 'same' or 'symmetric'")


def _taps(xp: jax.Array, k: int, stride: int, out_hw: tuple[int, int]):
    """The k*k shifted (and strided) windows of the padded input ``xp``, each ``[N, *out_hw, C]``: window
    ``(i, j)`` holds what tap ``(i, j)`` multiplies, so a depthwise conv is ``sum_ij window_ij * kernel[i, j]``."""
    n, _, _, c = xp.shape
    h, w = out_hw
    for i in range(k):
        for j in range(k):
            yield i, j, lax.slice(xp, (0, i, j, 0), (n, i + (h - 1) * stride + 1, j + (w - 1) * stride + 1, c),
                                  (1, stride, stride, 1))


_CHUNK_ELEMENTS = 1 << 19  # per-step operand size of _sum_over_batch_chunks: 2 MB in fp32


def _sum_over_batch_chunks(fn, xp: jax.Array, g: jax.Array) -> jax.Array:
    """``fn(xp, g)`` for a function that sums over the batch, computed a few samples at a time: on the
    whole batch, the operands of a kernel gradient (several MB) leave the cache and XLA's CPU kernels
    run several times slower; a ``lax.scan`` over chunks of about ``_CHUNK_ELEMENTS`` keeps them in cache."""
    n = xp.shape[0]
    per_sample = math.prod(g.shape[1:-1]) * (xp.shape[-1] + g.shape[-1])
    chunk = max(d for d in range(1, n + 1) if n % d == 0 and (d == 1 or d * per_sample <= _CHUNK_ELEMENTS))
    if chunk == n:
        return fn(xp, g)
    split = lambda a: a.reshape(n // chunk, chunk, *a.shape[1:])  # noqa: E731
    init = jnp.zeros(jax.eval_shape(fn, xp[:chunk], g[:chunk]).shape, jnp.float32)
    return lax.scan(lambda acc, xg: (acc + fn(*xg), None), init, (split(xp), split(g)))[0]


@dataclasses.dataclass(frozen=True)
class _Depthwise:
    """A depthwise convolution for XLA's CPU backend, whose grouped convolution (and its kernel gradient)
    runs on about one core: the forward is a sum of k*k shifted products, the input gradient its linear
    transpose, the kernel gradient per tap ``sum(window * grad_out)`` over batch and pixels."""

    kernel_size: int
    stride: int
    pads: tuple[tuple[int, int], tuple[int, int]]

    def forward(self, x, kernel):
        xp, out_hw = self._pad(x)
        return sum(window * kernel[i, j, 0] for i, j, window in _taps(xp, self.kernel_size, self.stride, out_hw))

    def kernel_grad(self, x, g):
        """d loss / d kernel in fp32, for the output gradient ``g``."""
        xp, out_hw = self._pad(x)
        k, f32 = self.kernel_size, jnp.float32

        def per_tap(xp, g):
            g = g.astype(f32)
            windows = _taps(xp, k, self.stride, out_hw)
            return jnp.stack([jnp.sum(w.astype(f32) * g, axis=(0, 1, 2)) for _, _, w in windows])

        return _sum_over_batch_chunks(per_tap, xp, g).reshape(k, k, 1, g.shape[-1])

    def _pad(self, x):
        xp = jnp.pad(x, ((0, 0), self.pads[0], self.pads[1], (0, 0)))
        k, s = self.kernel_size, self.stride
        return xp, ((xp.shape[1] - k) // s + 1, (xp.shape[2] - k) // s + 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _depthwise_conv(x, kernel, conv: _Depthwise):
    return conv.forward(x, kernel)


def _depthwise_conv_fwd(x, kernel, conv):
    return conv.forward(x, kernel), (x, kernel)


def _depthwise_conv_bwd(conv, residuals, g):
    x, kernel = residuals
    (dx,) = jax.linear_transpose(lambda x: conv.forward(x, kernel), x)(g)
    return dx, conv.kernel_grad(x, g).astype(kernel.dtype)


_depthwise_conv.defvjp(_depthwise_conv_fwd, _depthwise_conv_bwd)


def conv2d(x: jax.Array, kernel: jax.Array, *, stride: int = 1, groups: int = 1, padding: str = "symmetric",
           impl: str = "auto") -> jax.Array:
    """NHWC convolution with an HWIO kernel and timm's padding rule.

    ``impl``, the one place the lowering is chosen: ``"xla"`` is XLA's convolution (right on TPU/GPU);
    ``"cpu"`` writes 1x1 convs as a 2-D ``dot`` and depthwise convs as :class:`_Depthwise` (figures in
    bench/README.md, under :mod:`kaggle_utils.xla_cpu`'s option); ``"auto"`` is ``"cpu"`` on a CPU.
    """
    kh, kw, _, _ = kernel.shape
    pads = (pad_amounts(x.shape[1], kh, stride, padding), pad_amounts(x.shape[2], kw, stride, padding))
    if impl not in ("auto", "xla", "cpu"):
        raise ValueError(f"unknown conv_impl {impl!r}; use 'auto', 'xla' or 'cpu'")
    cpu = (jax.default_backend() == "cpu" if impl == "auto" else impl == "cpu") and kh == kw
    if cpu and kh == 1 and stride == 1 and groups == 1:
        # 2-D operands: the weight gradient is then one [N*H*W, Cin]^T @ [N*H*W, Cout] matmul,
        # faster on CPU than the 4-D contraction autodiff gives for jnp.dot(x, w) (bench/README.md).
        return jnp.dot(x.reshape(-1, x.shape[-1]), kernel[0, 0]).reshape(*x.shape[:-1], kernel.shape[-1])
    if cpu and groups > 1 and groups == x.shape[-1] == kernel.shape[-1]:
        return _depthwise_conv(x, kernel, _Depthwise(kh, stride, pads))
    return lax.conv_general_dilated(x, kernel, window_strides=(stride, stride), padding=pads,
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups)


class Conv2d(nn.Module):
    """A conv layer named like timm's (``kernel`` HWIO, optional ``bias``)."""

    features: int
    kernel_size: int
    cfg: LayerCfg
    stride: int = 1
    groups: int = 1
    use_bias: bool = False

    @nn.compact
    def __call__(self, x):
        k = self.kernel_size
        # timm's _init_weight_goog: N(0, 2 / fan_out), fan_out divided by groups
        init = nn.initializers.variance_scaling(2.0 * self.groups, "fan_out", "normal")
        kernel = self.param("kernel", init, (k, k, x.shape[-1] // self.groups, self.features))
        y = conv2d(x, kernel.astype(self.cfg.dtype), stride=self.stride, groups=self.groups,
                   padding=self.cfg.padding, impl=self.cfg.conv_impl)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, (self.features,)).astype(self.cfg.dtype)
        return y


class BatchNorm(nn.Module):
    """BatchNorm with PyTorch's semantics and fp32 statistics: ``train=True`` normalises with the batch
    statistics and moves the running ones towards them, the variance unbiased by ``n / (n - 1)`` as
    ``torch.nn.BatchNorm2d``. With ``cfg.bn_axis_name`` the statistics are averaged across that mapped
    axis (synchronised BN), so a step on 8 devices equals a step on one."""

    cfg: LayerCfg

    @nn.compact
    def __call__(self, x, train: bool):
        c = x.shape[-1]
        f32 = jnp.float32
        scale = self.param("scale", nn.initializers.ones, (c,), f32)
        bias = self.param("bias", nn.initializers.zeros, (c,), f32)
        ra_mean = self.variable("batch_stats", "mean", lambda: jnp.zeros((c,), f32))
        ra_var = self.variable("batch_stats", "var", lambda: jnp.ones((c,), f32))
        if train:
            mean, var, n = self._batch_stats(x.astype(f32))
            if not self.is_initializing():
                m = self.cfg.bn_momentum
                ra_mean.value = m * ra_mean.value + (1 - m) * mean
                ra_var.value = m * ra_var.value + (1 - m) * var * (n / jnp.maximum(n - 1, 1))
        else:
            mean, var = ra_mean.value, ra_var.value
        mul = scale * lax.rsqrt(var + self.cfg.bn_eps)
        shift = bias - mean * mul
        # The affine is applied in fp32 and cast once: in bf16, x * mul + shift cancels badly
        # when the two terms are large and opposite. XLA fuses it into the conv epilogue.
        return (x.astype(jnp.float32) * mul + shift).astype(self.cfg.dtype)

    def _batch_stats(self, x):
        axes = tuple(range(x.ndim - 1))
        n = math.prod(x.shape[:-1])
        mean = x.mean(axes)
        name = self.cfg.bn_axis_name
        if name is not None:
            mean = lax.pmean(mean, name)
            n = n * lax.psum(1, name)
        var = jnp.square(x - mean).mean(axes)  # two passes: exact where E[x^2]-E[x]^2 is not
        if name is not None:
            var = lax.pmean(var, name)
        return mean, var, n


def drop_path(x: jax.Array, rate: float, rng: jax.Array) -> jax.Array:
    """Stochastic depth: drops whole residual branches per sample, rescaling the survivors."""
    keep = 1.0 - rate
    mask = jax.random.bernoulli(rng, keep, (x.shape[0],) + (1,) * (x.ndim - 1))
    return jnp.where(mask, x / keep, 0).astype(x.dtype)
