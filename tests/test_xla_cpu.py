"""``kaggle_utils.xla_cpu``: the XLA:CPU option is added when it can act, and then it acts.

The option only counts if XLA sees it when the CPU backend starts, so the end-to-end checks
run in fresh interpreters: importing ``kaggle_utils`` first (as a notebook's first cell does, with
``kaggle_utils.runtime``, which starts JAX right away) must keep XLA from
handing a convolution to YNNPACK (visible in the compiled HLO), and opting out must not.
"""
import os
import platform
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kaggle_utils import xla_cpu

REPO = Path(__file__).resolve().parent.parent

PROBE = textwrap.dedent("""
    import os
    from kaggle_utils import runtime
    import jax, jax.numpy as jnp
    runtime.current_platform()  # starts JAX's backend, before any model code is imported
    from jax import lax
    x, w = jnp.ones((8, 56, 56, 48)), jnp.ones((3, 3, 48, 192))  # a stage-1 conv of EfficientNetV2-S
    conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    hlo = jax.jit(conv).lower(x, w).compile().as_text()
    print("flags:", os.environ.get("XLA_FLAGS", ""))
    print("conv:", "ynn" if "ynn_fusion" in hlo else "xla")
""")


def run_probe(**env):
    environ = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", xla_cpu.OPT_OUT)}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**environ, **env}, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines() if line.startswith(("flags: ", "conv: ")))
    return lines["flags"], lines["conv"]


def pinned_jaxlib_release() -> str:
    pins = [line.split("==")[1] for line in (REPO / "requirements.txt").read_text().splitlines()
            if line.startswith("jaxlib==")]
    return ".".join(pins[0].split(".")[:2])


def test_import_sets_the_option_and_xla_obeys_it():
    release = xla_cpu._jaxlib_release()
    if release not in xla_cpu.MEASURED_JAXLIB:
        if release == pinned_jaxlib_release():
            pytest.fail(f"jaxlib {release} is pinned but not in MEASURED_JAXLIB: re-measure and update it")
        pytest.skip(f"jaxlib {release} (another stack than the pinned one): the option is added only on measured "
                    f"releases {xla_cpu.MEASURED_JAXLIB}; test_unmeasured_jaxlib_or_opt_out_leaves_flags_alone "
                    "checks that it is left out")
    tuned_flags, tuned = run_probe()
    plain_flags, plain = run_probe(**{xla_cpu.OPT_OUT: "0"})
    assert f"{xla_cpu.FLAG}={xla_cpu.VALUE}" in tuned_flags and xla_cpu.FLAG not in plain_flags
    assert (tuned, plain) == ("xla", "ynn")


def test_a_users_own_setting_wins():
    environ = {"XLA_FLAGS": f"--xla_force_host_platform_device_count=2 {xla_cpu.FLAG}=dot"}
    assert not xla_cpu.apply(environ)
    assert environ["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=2 {xla_cpu.FLAG}=dot"


def test_added_after_existing_flags_and_only_once(monkeypatch):
    """The flag logic, on any installed jaxlib: the release check is patched to a measured one."""
    monkeypatch.setattr(xla_cpu, "_backends_started", lambda: False)
    monkeypatch.setattr(xla_cpu, "_jaxlib_release", lambda: xla_cpu.MEASURED_JAXLIB[0])
    environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert xla_cpu.apply(environ) and not xla_cpu.apply(environ)
    assert environ["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=2 {xla_cpu.FLAG}={xla_cpu.VALUE}"


def test_unmeasured_jaxlib_or_opt_out_leaves_flags_alone(monkeypatch):
    """XLA aborts on a flag it does not know, so other jaxlib releases get nothing."""
    monkeypatch.setattr(xla_cpu, "_backends_started", lambda: False)
    monkeypatch.setattr(xla_cpu, "_jaxlib_release", lambda: "0.4")
    environ = {}
    assert not xla_cpu.apply(environ) and environ == {}
    monkeypatch.setattr(xla_cpu, "_jaxlib_release", lambda: xla_cpu.MEASURED_JAXLIB[0])
    environ = {xla_cpu.OPT_OUT: "0"}
    assert not xla_cpu.apply(environ) and "XLA_FLAGS" not in environ


def test_too_late_warns_instead_of_pretending(monkeypatch):
    """In this test process JAX's CPU backend has long started: the option cannot act."""
    import jax

    jax.devices()
    monkeypatch.setattr(xla_cpu, "_jaxlib_release", lambda: xla_cpu.MEASURED_JAXLIB[0])
    environ = {}
    with pytest.warns(UserWarning, match="before kaggle_utils was imported"):
        assert not xla_cpu.apply(environ)
    assert "XLA_FLAGS" not in environ


SCRATCH_PROBE = textwrap.dedent("""
    import resource
    import kaggle_utils
    import jax, jax.numpy as jnp
    from jax import lax
    from kaggle_utils.efficientnet import create_model
    from kaggle_utils.train.steps import StepConfig, make_steps

    make_steps(create_model("test_efficientnet", num_classes=2), None, StepConfig(num_classes=2))  # on CPU devices

    @jax.jit
    def f(x):  # 64 MB intermediates kept apart: 64-128 MB of scratch by jaxlib, far above glibc's mmap threshold
        y = lax.optimization_barrier(x * 2.0)
        return (lax.optimization_barrier(jnp.flip(y, 0) + 1.0) * y).sum()

    x = jnp.ones((4096, 4096))
    f(x).block_until_ready()
    faults = []
    for _ in range(12):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        f(x).block_until_ready()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print("async:", jax.config.values["jax_cpu_enable_async_dispatch"])
    print("faults:", " ".join(map(str, faults)))
    print("pages:", f.lower(x).compile().memory_analysis().temp_size_in_bytes // resource.getpagesize())
""")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's; elsewhere the setting is a no-op")
def test_cpu_steps_reuse_a_programs_scratch_memory_instead_of_faulting_it_in_on_every_call():
    """A program's scratch memory is faulted in page by page on every call as JAX dispatches by default; with the
    kit's settings (inline dispatch at import, glibc told to keep freed memory once steps are built for CPU devices)
    the pages are reused."""
    def probe(**env):
        environ = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", xla_cpu.OPT_OUT)}
        out = subprocess.run([sys.executable, "-c", SCRATCH_PROBE], env={**environ, **env}, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        lines = dict(line.split(": ", 1) for line in out.stdout.splitlines()
                     if line.startswith(("async", "faults", "pages")))
        return lines["async"], [int(n) for n in lines["faults"].split()], int(lines["pages"])

    tuned_async, tuned, pages = probe()
    plain_async, plain, _ = probe(**{xla_cpu.OPT_OUT: "0"})
    assert (tuned_async, plain_async) == ("False", "True")
    assert pages >= 16_000 and min(plain) > 0.9 * pages, (plain, pages)  # the probe sees the faulting it should
    # glibc's heap may grow a few times before one free block holds the scratch; from then on it is reused
    assert statistics.median(tuned[-6:]) < 0.01 * pages, (tuned, pages)


def test_dispatch_inline_leaves_a_started_backend_and_an_opt_out_alone(monkeypatch):
    import jax

    jax.devices()  # in this process the backend has long started: its dispatch cannot change any more
    assert not xla_cpu.dispatch_inline({})
    monkeypatch.setattr(xla_cpu, "_backends_started", lambda: False)
    assert not xla_cpu.dispatch_inline({xla_cpu.OPT_OUT: "0"})


def test_keep_scratch_memory_obeys_the_opt_out_and_is_set_once(monkeypatch):
    calls = []
    monkeypatch.setattr(xla_cpu, "_scratch_kept", [False])
    monkeypatch.setattr(xla_cpu.ctypes, "CDLL", lambda _: type("Libc", (), {
        "mallopt": staticmethod(lambda param, value: calls.append((param, value)) or 1)}))
    assert not xla_cpu.keep_scratch_memory({xla_cpu.OPT_OUT: "0"}) and calls == []
    if platform.libc_ver()[0] != "glibc":
        assert not xla_cpu.keep_scratch_memory({})
        return
    assert xla_cpu.keep_scratch_memory({}) and xla_cpu.keep_scratch_memory({})
    assert calls == [(xla_cpu.M_MMAP_MAX, 0), (xla_cpu.M_TRIM_THRESHOLD, -1)]
