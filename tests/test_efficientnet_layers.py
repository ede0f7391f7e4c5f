"""``layers.conv2d``: every implementation path against XLA's convolution, values and gradients.

``conv2d(impl=...)`` picks how a convolution is computed per platform (``"cpu"``: 1x1 as a
``dot``, depthwise as shifted multiply-adds with a custom kernel gradient). Whatever the path, the
forward and both gradients (input and kernel) must equal those of
``lax.conv_general_dilated`` up to float rounding, in fp32 at the highest matmul precision.
The reference pads independently of ``pad_amounts``: TF "SAME" is lax's ``"SAME"`` string,
symmetric is ``((s - 1) + (k - 1)) // 2`` on both sides. Inputs are 9 x 8 (odd height, even
width), so both parities of the "same" rule's asymmetric padding are exercised at stride 2.
Also: bf16 compute with fp32 parameters (gradient dtypes), and a whole model's loss and
gradients on the ``"cpu"`` path against the ``"xla"`` one.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

from kaggle_utils.efficientnet import create_model, layers
from kaggle_utils.efficientnet.layers import conv2d

FP32_TOL = 1e-5
BF16_TOL = 3e-2

# "cpu, chunked": the kernel gradients' lax.scan over batch chunks, forced to one sample a step
PATHS = ["xla", "cpu", "cpu, chunked"]
CASES = [(k, s) for k in (1, 3, 5) for s in (1, 2)]  # (kernel size, stride)
# A small EfficientNetV2 with every block type, 3x3 and 5x5 depthwise convs and stride 2 in
# each kind of conv; whole tf_efficientnetv2_b0 takes a minute to compile twice on 2 cores.
SMALL_ARCH = (
    ("cn_r1_k3_s1_e1_c16_skip",),
    ("er_r2_k3_s2_e4_c24",),
    ("ir_r1_k5_s2_e4_c32_se0.25",),
    ("ds_r1_k3_s1_e1_c32_se0.25",),
)


def reference_conv(x, kernel, stride, groups, padding):
    k = kernel.shape[0]
    if padding == "same":
        pads = "SAME"
    else:
        p = ((stride - 1) + (k - 1)) // 2
        pads = ((p, p), (p, p))
    return lax.conv_general_dilated(x, kernel, (stride, stride), pads, dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                    feature_group_count=groups)


def operands(kernel_size, depthwise, channels=6, batch=2):
    """Input and kernel from numpy (jax.random would compile a generator per shape)."""
    rng = np.random.default_rng(kernel_size + 10 * depthwise)
    x = rng.standard_normal((batch, 9, 8, channels), dtype=np.float32)
    kernel = rng.standard_normal((kernel_size, kernel_size, 1 if depthwise else channels, channels + (not depthwise)),
                                 dtype=np.float32)
    return jnp.asarray(x), jnp.asarray(kernel)


def value_and_vjp(fn, x, kernel):
    """Output and (d x, d kernel), jitted, for a fixed random cotangent."""
    out = jax.eval_shape(fn, x, kernel)
    ct = jnp.asarray(np.random.default_rng(7).standard_normal(out.shape, dtype=np.float32), out.dtype)

    def run(x, kernel, ct):
        y, vjp = jax.vjp(fn, x, kernel)
        return (y, *vjp(ct))

    return jax.jit(run)(x, kernel, ct)


def rel_diff(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def conv_results(conv, kernel_size, depthwise):
    with jax.default_matmul_precision("highest"):
        return value_and_vjp(conv, *operands(kernel_size, depthwise))


@functools.cache
def reference_results(kernel_size, stride, depthwise, padding):
    groups = 6 if depthwise else 1
    return conv_results(lambda x, k: reference_conv(x, k, stride, groups, padding), kernel_size, depthwise)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("padding", ["same", "symmetric"])
@pytest.mark.parametrize("depthwise", [False, True], ids=["dense", "depthwise"])
def test_conv2d_matches_xla_values_and_gradients(path, padding, depthwise, monkeypatch):
    impl = path.split(",")[0]
    if path.endswith("chunked"):
        monkeypatch.setattr(layers, "_CHUNK_ELEMENTS", 1)
    groups = 6 if depthwise else 1
    for k, s in CASES:
        got = conv_results(lambda x, w: conv2d(x, w, stride=s, groups=groups, padding=padding, impl=impl), k, depthwise)
        for name, a, b in zip(("output", "d input", "d kernel"), got, reference_results(k, s, depthwise, padding)):
            assert a.shape == b.shape and a.dtype == b.dtype, (name, a.shape, b.shape, a.dtype, b.dtype)
            err = rel_diff(a, b)
            assert err < FP32_TOL, f"k={k} s={s}: {name} differs by {err:.1e}"


@pytest.mark.parametrize("depthwise", [False, True], ids=["dense 1x1", "depthwise 3x3"])
def test_conv2d_auto_is_the_cpu_path_on_cpu(depthwise):
    """The two convs the CPU path rewrites; dense k x k convs are XLA's on every path."""
    k, s = (3, 2) if depthwise else (1, 1)
    x, kernel = operands(k, depthwise)

    def jaxpr(impl):
        loss = lambda x, w: conv2d(x, w, stride=s, groups=6 if depthwise else 1, impl=impl).sum()  # noqa: E731
        return str(jax.make_jaxpr(jax.grad(loss, (0, 1)))(x, kernel))

    assert jax.default_backend() == "cpu"
    assert jaxpr("auto") == jaxpr("cpu") != jaxpr("xla")


@pytest.mark.parametrize("impl", ["xla", "cpu"])
@pytest.mark.parametrize("depthwise", [False, True], ids=["dense", "depthwise"])
def test_conv2d_bf16_compute_with_fp32_params(impl, depthwise):
    """bf16 activations and a bf16 copy of an fp32 kernel, as ``Conv2d`` does with ``dtype=bf16``:
    each gradient has its primal's dtype and is the fp32 gradient up to bf16 rounding."""
    x32, kernel32 = operands(3, depthwise)
    groups = x32.shape[-1] if depthwise else 1

    def conv(x, kernel, dtype, impl):
        return conv2d(x.astype(dtype), kernel.astype(dtype), stride=2, groups=groups, padding="same", impl=impl)

    x16 = x32.astype(jnp.bfloat16)
    y, dx, dk = value_and_vjp(lambda x, k: conv(x, k, jnp.bfloat16, impl), x16, kernel32)
    assert (y.dtype, dx.dtype, dk.dtype) == (jnp.bfloat16, jnp.bfloat16, jnp.float32)
    with jax.default_matmul_precision("highest"):
        want = value_and_vjp(lambda x, k: conv(x, k, jnp.float32, "xla"), x16.astype(jnp.float32), kernel32)
    for name, a, b in zip(("output", "d input", "d kernel"), (y, dx, dk), want):
        assert rel_diff(a, b) < BF16_TOL, f"{name} differs by {rel_diff(a, b):.1e}"


def test_conv2d_rejects_unknown_impl():
    x, kernel = operands(3, False)
    with pytest.raises(ValueError, match="conv_impl"):
        conv2d(x, kernel, impl="fast")


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_whole_model_loss_and_gradients_agree_across_conv_impls():
    """A training forward + backward of a small EfficientNetV2 (BN in train mode, SE, every
    block type) gives the same loss and parameter gradients on either conv path."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 32, 32, 3), dtype=np.float32))
    labels = jnp.array([3, 7])
    models = {impl: create_model("tf_efficientnetv2_b0", num_classes=10, conv_impl=impl, arch_def=SMALL_ARCH,
                                 num_features=64) for impl in ("xla", "cpu")}
    # an rbg key: threefry initialisers take ~20 s to compile here
    variables = jax.jit(models["xla"].init)(jax.random.key(1, impl="rbg"), x)

    def loss_fn(params, model):
        logits, _ = model.apply({**variables, "params": params}, x, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    with jax.default_matmul_precision("highest"):
        results = {impl: jax.jit(jax.value_and_grad(loss_fn), static_argnums=1)(variables["params"], model)
                   for impl, model in models.items()}
    (loss_xla, grads_xla), (loss_cpu, grads_cpu) = results["xla"], results["cpu"]
    np.testing.assert_allclose(loss_cpu, loss_xla, rtol=1e-5)
    # Some gradients are analytically zero (a BN bias feeding a train-mode BN through a conv),
    # so differences are measured against the largest gradient of the model.
    scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(grads_xla))
    errors = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))) / scale, grads_cpu, grads_xla)
    path, worst = max(jax.tree.leaves_with_path(errors), key=lambda kv: kv[1])
    assert worst < 1e-5, f"{jax.tree_util.keystr(path)}: gradient differs by {worst:.1e} of the largest gradient"


@pytest.mark.parametrize("drop_path_rate", [0.0, 0.3])
def test_remat_blocks_give_the_plain_model_s_gradients(drop_path_rate):
    """``remat=True`` recomputes each block in the backward pass: the same gradients, dropped paths included.

    The difference seen earlier under remat was in gradients that are zero in exact arithmetic: the
    bias of a BatchNorm whose output reaches another train-mode BatchNorm through a convolution (the
    batch mean cancels a constant shift). Both models give rounding noise there (~1e-5 against a
    largest gradient ~500), whose *relative* difference is large and meaningless; so, as above,
    differences are measured against the model's largest gradient. The recomputed forward is fused
    differently from the kept one, so the stem's kernel gradient (the end of the whole backward pass)
    differs by fp32 rounding: 2.5e-6 of the largest gradient on jax 0.10.2, 1.2e-5 on 0.7.2 (measured
    2026-11-25); a remat that drew other dropout keys, or lost a block's statistics, is off by far more.
    """
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 32, 32, 3), dtype=np.float32))
    models = {remat: create_model("test_efficientnet", num_classes=10, drop_path_rate=drop_path_rate, remat=remat)
              for remat in (False, True)}
    variables = jax.jit(models[False].init)(jax.random.key(1, impl="rbg"), x)

    def loss_fn(params, model):
        logits, _ = model.apply({**variables, "params": params}, x, mutable=["batch_stats"],
                                rngs={"dropout": jax.random.key(3)})
        return jnp.sum(jnp.square(logits))

    grads = {remat: jax.jit(jax.grad(loss_fn), static_argnums=1)(variables["params"], model)
             for remat, model in models.items()}
    scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(grads[False]))
    errors = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))) / scale, grads[True], grads[False])
    path, worst = max(jax.tree.leaves_with_path(errors), key=lambda kv: kv[1])
    assert worst < 5e-5, f"{jax.tree_util.keystr(path)}: gradient differs by {worst:.1e} of the largest gradient"
