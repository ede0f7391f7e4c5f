"""The suite's tiers: which tests are slow (by a rule this plugin checks), and which run on the Kaggle stack too.

**Slow, by rule.** A test is marked ``@pytest.mark.slow`` when it, or a fixture it uses,

1. starts a job process (``python -m kaggle_utils`` or ``weights_port``), a worker script or a notebook kernel: each
   imports JAX and TensorFlow and compiles on its own (a ``python -c`` probe of one import or flag is not counted),
2. builds a model other than timm's tiny ``test_efficientnet`` (a full-size EfficientNet takes 10-60 s to compile
   here; building = tracing its blocks, for ``init``, ``apply`` or ``eval_shape``),
3. trains an EfficientNet, ``test_efficientnet`` included: traces its train step, as every whole run does (``run.train``,
   ``cross_validate``, the job in this process), 5-30 s of compiling each; the engine's own tests train a small CNN;
   or runs a whole training run of any model (``run.train``'s fit: data, compiles, evaluation, prediction, files),
4. trains more than :data:`MAX_QUICK_STEPS` steps of any model through ``fit``,
5. executes a notebook, or
6. tests a benchmark script (``tests/test_bench.py``: the measuring tools of ``bench/``, run on models and timed;
   not kit modules, which the quick tier covers each).

5 and 6 are applied here by location (the items are marked slow); 1-4 are checked.

Everything else is the quick tier, ``python -m pytest -m "not slow" -n 2 tests`` (minutes; README, "Tests"). The
rule is checked while the suite runs: an unmarked test that breaks it fails, naming what it did, so a new slow
test cannot slip into the quick tier. Work done while a fixture is set up counts for every test that uses the
fixture (the quick tier would pay for it whichever test came first).

**The Kaggle stack.** ``.ci/kaggle_stack`` runs the suite on the Kaggle GPU image's package versions (jax 0.7.2,
flax 0.11.2, TF 2.20, timm 1.0.26, optuna 4.5, wandb 0.22; no simplejpeg). It runs what can differ between the
stacks, the files in :data:`KAGGLE_STACK` (each with the reason), marked ``kaggle_stack``, and the notebooks; the
main stack runs everything.
"""
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

MAX_QUICK_STEPS = 50
JOB_MODULES = {"kaggle_utils", "weights_port", "ipykernel_launcher", "ipykernel"}
TINY_MODEL = "test_efficientnet"
BENCH_TESTS = "test_bench.py"

# test file -> what in it depends on a package whose version differs on Kaggle's image
KAGGLE_STACK = {
    "test_efficientnet_parity.py": "the models against timm 1.0.26, flax 0.11's module system",
    "test_efficientnet_layers.py": "the layers' lax calls (convolutions, padding) on jax 0.7",
    "test_weights_port.py": "the porter: torch state dicts of timm 1.0.26 to flax variables",
    "test_train_steps.py": "the steps under pmap and jit + shard_map, on jax 0.7's transforms",
    "test_checkpoint.py": "checkpoints: flax 0.11's serialization, msgpack",
    "test_precision.py": "bf16 / fp16 and loss scaling: jax 0.7's dtype rules",
    "test_data_tfrecords.py": "the TFRecord reader on TF 2.20, the corrupt-JPEG check without simplejpeg",
    "test_data_transforms.py": "crops and resizes in TF 2.20 ops",
    "test_data_augment.py": "RandAugment in TF 2.20 ops, imgaug on numpy 2",
    "test_data_sources.py": "class folders, CSVs and tensorflow-datasets 4.9.9 with protobuf 6",
    "test_device_mixing.py": "Mixup / CutMix against timm 1.0.26's",
    "test_tune.py": "Optuna 4.5's API",
    "test_tracking.py": "wandb 0.22 offline runs, TensorBoard writers on TF 2.20",
    "test_xla_cpu.py": "XLA:CPU options read by jaxlib 0.7",
    "test_kaggle_tree.py": "the Kaggle path end to end: notebooks 03 and 04 and the job in a Kaggle file tree",
}


class Record:
    """What one test, or one fixture's set-up, did that the slow rule counts."""

    def __init__(self):
        self.processes: list[str] = []
        self.models: set[str] = set()
        self.trained: set[str] = set()
        self.runs: set[str] = set()
        self.steps = 0

    def reasons(self) -> list[str]:
        reasons = [f"started a process: {command}" for command in self.processes[:2]]
        reasons += [f"built {name} (only {TINY_MODEL} is quick)" for name in sorted(self.models)]
        reasons += [f"trained {name} (an EfficientNet's train step)" for name in sorted(self.trained)]
        reasons += [f"ran a whole training run of {name} (run.train)" for name in sorted(self.runs)]
        if self.steps > MAX_QUICK_STEPS:
            reasons.append(f"trained {self.steps} steps (quick: at most {MAX_QUICK_STEPS})")
        return reasons

    def add(self, other: "Record") -> None:
        self.processes += other.processes
        self.models |= other.models
        self.trained |= other.trained
        self.runs |= other.runs
        self.steps += other.steps


class _Watch:
    """Records into the test or fixture under way; fixtures' records are kept for the tests that use them."""

    def __init__(self):
        self.stack: list[Record] = []
        self.by_fixture: dict[int, Record] = defaultdict(Record)

    @property
    def now(self) -> Record | None:
        return self.stack[-1] if self.stack else None

    def process(self, args) -> None:
        """A job (``python -m kaggle_utils`` / ``weights_port``), a script (a worker, a kernel): not a ``-c`` probe."""
        argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
        if self.now is None or not argv or not (Path(argv[0]).name.startswith("python") or argv[0] == sys.executable):
            return
        module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
        script = next((a for a in argv[1:] if not a.startswith("-")), "") if "-c" not in argv else ""
        if module.split(".")[0] in JOB_MODULES or script.endswith(".py"):
            self.now.processes.append(" ".join(argv)[:120])

    def model(self, name: str) -> None:
        if self.now is not None and name != TINY_MODEL:
            self.now.models.add(name)

    def train(self, model) -> None:
        if self.now is not None and hasattr(model, "spec"):  # an EfficientNet (surgery's heads wrap one: "backbone")
            self.now.trained.add(model.spec.name)
        elif self.now is not None and hasattr(getattr(model, "backbone", None), "spec"):
            self.now.trained.add(model.backbone.spec.name)

    def run(self, config) -> None:
        if self.now is not None:
            self.now.runs.add(config.model.name)

    def steps(self, count: int) -> None:
        if self.now is not None:
            self.now.steps += count


WATCH = _Watch()


def _install_watchers() -> None:
    """Wraps the places the rule counts: process starts, EfficientNet block building, train steps traced, whole runs,
    the fit loop's epochs."""
    popen_init = subprocess.Popen.__init__

    def counted_popen(self, args, *rest, **kwargs):
        WATCH.process(args)
        popen_init(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = counted_popen

    from kaggle_utils.efficientnet import model as model_module
    from kaggle_utils.run import trainer as trainer_module
    from kaggle_utils.train import loop as loop_module
    from kaggle_utils.train import steps as steps_module

    build_blocks = model_module.build_blocks

    def counted_build_blocks(spec, *args, **kwargs):
        WATCH.model(spec.name)
        return build_blocks(spec, *args, **kwargs)

    model_module.build_blocks = counted_build_blocks

    train_step = steps_module.train_step  # make_steps reads the module's name when it builds the steps

    def counted_train_step(*args, **kwargs):
        WATCH.train(kwargs.get("model"))
        return train_step(*args, **kwargs)

    steps_module.train_step = counted_train_step

    fit_run = trainer_module.fit_run  # run.train (the job, CV, tune) calls the module's name

    def counted_fit_run(config, *args, **kwargs):
        WATCH.run(config)
        return fit_run(config, *args, **kwargs)

    trainer_module.fit_run = counted_fit_run

    run_epoch = loop_module._Loop._run_epoch

    def counted_run_epoch(self, dev_state, host_state, step):
        out = run_epoch(self, dev_state, host_state, step)
        WATCH.steps(out[2] - step)
        return out

    loop_module._Loop._run_epoch = counted_run_epoch


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: breaks the quick tier's rule (tests/tiers.py); still in the default run")
    config.addinivalue_line("markers", "kaggle_stack: also run on the Kaggle GPU image's stack (tests/tiers.py)")
    config.addinivalue_line("markers", "variant_sweep: a registered variant beyond one per block family and padding "
                                       "rule (the Kaggle stack runs one per family, the main stack all)")
    _install_watchers()


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these marks
def pytest_collection_modifyitems(items):
    for item in items:
        if type(item).__name__ == "NotebookItem":  # nbmake: a notebook runs in a kernel process
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.kaggle_stack)
            continue
        if Path(str(item.fspath)).name == BENCH_TESTS:
            item.add_marker(pytest.mark.slow)
        if Path(str(item.fspath)).name in KAGGLE_STACK:
            item.add_marker(pytest.mark.kaggle_stack)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.scope == "function" or id(fixturedef) in WATCH.by_fixture:
        yield
        return
    record = WATCH.by_fixture[id(fixturedef)]
    WATCH.stack.append(record)
    try:
        yield
    finally:
        WATCH.stack.pop()


def _fixture_records(item) -> Record:
    total = Record()
    for defs in getattr(item, "_fixtureinfo", None).name2fixturedefs.values() if hasattr(item, "_fixtureinfo") else ():
        for fixturedef in defs:
            if id(fixturedef) in WATCH.by_fixture:
                total.add(WATCH.by_fixture[id(fixturedef)])
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    WATCH.stack.append(Record())
    try:
        yield
    finally:
        WATCH.stack.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or report.outcome != "passed" or item.get_closest_marker("slow") is not None:
        return
    record = Record()
    record.add(WATCH.stack[0] if WATCH.stack else Record())
    record.add(_fixture_records(item))
    reasons = record.reasons()
    if reasons and os.environ.get("TIERS_REPORT"):
        with open(os.environ["TIERS_REPORT"], "a") as f:
            f.write(json.dumps({"test": item.nodeid, "reasons": reasons, "seconds": report.duration}) + "\n")
        return
    if reasons:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} is in the quick tier but breaks its rule (tests/tiers.py): "
                           f"{'; '.join(reasons)}. Mark it @pytest.mark.slow, or make it quick.")
