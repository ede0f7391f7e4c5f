"""Process-wide test set-up, applied before any test module is imported.

Two things must happen before jax or tensorflow are first imported anywhere:

* Import order: on this stack, importing ``tensorflow`` before ``torch``/``torchvision``
  (pulled in by ``timm``) in one process segfaults, while the reverse order works. Tests
  mix both (parity tests use timm, data tests use tensorflow), so torch is imported here,
  first, whenever it is installed. Library code never imports both: ``kaggle_utils.efficientnet``
  and ``weights_port`` avoid tensorflow, ``kaggle_utils.data`` avoids torch.
* Virtual devices: multi-device tests (pmap / shard_map) need several devices on a CPU-only
  machine. JAX exposes N host devices when told before the backend starts. It is told through
  its config, not ``XLA_FLAGS``: an environment variable would be inherited by the notebook
  kernels nbmake starts, and the notebooks should run as on a user's CPU (one device). Tests that
  start processes give them their own ``XLA_FLAGS``.

One more, for time: a persistent JAX compilation cache shared by the whole session (both
xdist workers, the jobs tests start, the notebook kernels). Compiling is most of the suite's
time, and many files compile the same programs (a model's init, the job's steps on the
sample). It is an environment variable so that every process inherits it; the first process
to load this file (pytest's controller) picks the folder, and removes it at the end. A cache
size is set because that is what makes JAX lock the folder across processes, and every program is kept, however
quickly it compiled (the default keeps those over a second: most of the quick tier's are under).

And for time too: XLA:CPU's backend optimisation level 1 instead of the default, through ``XLA_FLAGS`` so that
the same processes inherit it (the notebook kernels too: it sets the compiler's effort, not the devices they see).
The suite's programs run a few dozen times each on 16-32 px images, where LLVM's full optimisation of the machine
code costs more than it saves: level 1 cuts a model's compiles by a fifth to a half and runs its steps as fast
(bench/README.md, "Test suite"). Tests that start processes with their own ``XLA_FLAGS`` add theirs to it
(``job_helpers.cpu_process_env``).

And one fixture several files share: ``sample``, the job tests' data, made once per process.
"""
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _SESSION_CACHE = tempfile.mkdtemp(prefix="kaggle_utils_tests_jax_")
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))
else:
    _SESSION_CACHE = None
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # every program shared, not only slow ones
TEST_XLA_FLAG = "--xla_backend_optimization_level=1"
QUICK_XLA_FLAG = "--xla_backend_optimization_level=0"  # the quick tier's, see pytest_configure
if TEST_XLA_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAG}".strip()

try:  # torch before tensorflow, see the module docstring
    import torch  # noqa: F401
    import torchvision  # noqa: F401
except ImportError:  # the porter tests will fail on their own imports, with a clear message
    pass

import jax  # noqa: E402  (after torch, see above)
import pytest  # noqa: E402

from kaggle_utils.run.target_plan import quiet_libtpu  # noqa: E402

pytest_plugins = ["tiers"]  # the quick tier's rule, checked while the suite runs; the Kaggle stack's selection

# libtpu is installed for the TPU plan tests (requirements.txt); on a machine without TPU chips every process that
# inherits this environment (xdist workers, notebook kernels, jobs) is told so before its backend starts, and prints
# nothing of libtpu's search for TPU hosts
quiet_libtpu()

jax.config.update("jax_num_cpu_devices", 8)


@pytest.fixture(scope="session")
def sample(tmp_path_factory):
    """The embedded digits sample at 16 px, for the job tests: their compiles and steps stay cheap."""
    from kaggle_utils.data import make_sample_dataset

    return make_sample_dataset(tmp_path_factory.mktemp("sample"), image_size=16)


@pytest.fixture(scope="session")
def tiny_tfds(tmp_path_factory):
    """A tensorflow-datasets dataset prepared here (no download): digits 0..29 train, 30..39 test, 8x8 RGB PNGs.

    Session-wide because tfds registers a builder class by name once per process."""
    import numpy as np
    import tensorflow_datasets as tfds
    from sklearn.datasets import load_digits

    digits = load_digits()

    class TinyDigits(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(8, 8, 3), encoding_format="png"),
                "label": tfds.features.ClassLabel(names=[f"d{i}" for i in range(10)])}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(0, 30), "test": self._generate_examples(30, 40)}

        def _generate_examples(self, start, stop):
            for i in range(start, stop):
                gray = np.round(digits.images[i] * 255 / 16).astype(np.uint8)
                yield i, {"image": np.repeat(gray[..., None], 3, axis=-1), "label": int(digits.target[i])}

    data_dir = str(tmp_path_factory.mktemp("tfds"))
    TinyDigits(data_dir=data_dir).download_and_prepare()
    return data_dir


def pytest_configure(config):
    """The quick tier (``-m "not slow"``) compiles at XLA:CPU's level 0: its programs run a handful of steps each, where
    compiling is nearly all of their time (bench/README.md, "Test suite"); the full suite's learning runs keep level 1.
    Set before any backend starts, so the xdist workers this process spawns inherit it."""
    if "not slow" in (config.option.markexpr or ""):
        os.environ["XLA_FLAGS"] = os.environ["XLA_FLAGS"].replace(TEST_XLA_FLAG, QUICK_XLA_FLAG)


def pytest_unconfigure(config):
    if _SESSION_CACHE is not None:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)
