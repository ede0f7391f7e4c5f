"""The suite's tiers (tests/tiers.py): the slow rule's watchers count what the rule names and nothing else, an
unmarked test that breaks the rule fails naming what it did, and the Kaggle stack's list names real files."""
import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import quick_coverage
import tiers
from kaggle_utils.config import LoopConfig
from kaggle_utils.efficientnet import create_model
from kaggle_utils.parallel import make_mesh
from kaggle_utils.train import StepConfig, fit, init_variables, make_optimizer, make_steps
from kaggle_utils.variable_trees import abstract_variables
from train_helpers import TinyCNN, batches, digits

TESTS = Path(__file__).resolve().parent


def watched(action) -> tiers.Record:
    """What the watchers recorded while ``action()`` ran (apart from the test's own record)."""
    record = tiers.Record()
    tiers.WATCH.stack.append(record)
    try:
        action()
    finally:
        tiers.WATCH.stack.pop()
    return record


def test_a_script_or_a_job_is_a_process_and_a_probe_is_not(tmp_path):
    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    record = watched(lambda: (subprocess.run([sys.executable, "-c", "import sys"], check=True),
                              subprocess.run([sys.executable, str(script)], check=True)))
    assert record.processes == [f"{sys.executable} {script}"]
    tiers.WATCH.stack.append(job := tiers.Record())
    try:
        tiers.WATCH.process([sys.executable, "-m", "kaggle_utils", "train", "--out", "x"])  # not started: recorded only
        tiers.WATCH.process(["git", "status"])
    finally:
        tiers.WATCH.stack.pop()
    assert job.processes == [f"{sys.executable} -m kaggle_utils train --out x"]
    assert job.reasons() == [f"started a process: {sys.executable} -m kaggle_utils train --out x"]


def test_a_full_size_model_is_recorded_when_its_blocks_are_built_and_the_tiny_one_is_not():
    record = watched(lambda: (create_model("tf_efficientnetv2_b0").stages, create_model("test_efficientnet").stages,
                              create_model("efficientnet_b3")))  # constructed, never built
    assert record.models == {"tf_efficientnetv2_b0"}
    assert record.reasons() == ["built tf_efficientnetv2_b0 (only test_efficientnet is quick)"]


def test_an_efficientnets_train_step_is_recorded_when_traced_and_a_small_cnns_is_not():
    mesh = make_mesh(jax.devices()[:1])
    tx = make_optimizer(1e-3)

    def lower(model, size):  # traced for shapes only: nothing is compiled
        steps = make_steps(model, tx, StepConfig(num_classes=10), mode="jit", mesh=mesh)
        state = jax.eval_shape(steps.init_state, abstract_variables(model, jnp.zeros((1, size, size, 3))))
        batch = {"image": jax.ShapeDtypeStruct((2, size, size, 3), jnp.uint8),
                 "label": jax.ShapeDtypeStruct((2,), jnp.int32), "mask": jax.ShapeDtypeStruct((2,), bool)}
        steps.train.lower(state, batch)

    assert watched(lambda: lower(TinyCNN(), 8)).reasons() == []
    record = watched(lambda: lower(create_model("test_efficientnet", num_classes=10), 16))
    assert record.trained == {"test_efficientnet"}
    assert record.reasons() == ["trained test_efficientnet (an EfficientNet's train step)"]


def test_a_whole_run_is_recorded_with_its_model_before_anything_else_happens():
    from kaggle_utils.config import TrainConfig
    from kaggle_utils.run import trainer

    def start_a_run():  # recorded on entry; the run itself fails at once on its missing parts
        with pytest.raises(AttributeError):
            trainer.fit_run(TrainConfig().replace(model="my_resnet"), None, None, None, None)

    record = watched(start_a_run)
    assert record.runs == {"my_resnet"}
    assert record.reasons() == ["ran a whole training run of my_resnet (run.train)"]


def test_the_steps_fit_trains_are_counted_and_more_than_the_quick_limit_is_a_reason():
    model, tx = TinyCNN(), make_optimizer(1e-3)
    steps = make_steps(model, tx, StepConfig(num_classes=10), mode="jit", mesh=make_mesh(jax.devices()[:1]))
    state = jax.device_get(steps.init_state(init_variables(model, 8)))
    images, labels = digits()
    total = tiers.MAX_QUICK_STEPS + 1
    loop = LoopConfig(steps=total, steps_per_epoch=total, log_every=total, tensorboard=False)
    record = watched(lambda: fit(steps, state, lambda epoch: batches(images, labels, 8, shuffle_seed=epoch), loop,
                                 progress=False))
    assert record.steps == total
    assert record.reasons() == [f"trained {total} steps (quick: at most {tiers.MAX_QUICK_STEPS})"]


@pytest.mark.slow  # a pytest process
def test_an_unmarked_test_that_breaks_the_rule_fails_naming_it_and_a_marked_one_passes(tmp_path):
    (tmp_path / "conftest.py").write_text(f"import sys\nsys.path[:0] = [{str(TESTS)!r}, {str(TESTS.parent)!r}]\n"
                                          "pytest_plugins = ['tiers']\n")  # the kit importable, installed or not
    (tmp_path / "test_inner.py").write_text(textwrap.dedent("""\
        import subprocess, sys
        import pytest

        def run_a_script(tmp_path):
            script = tmp_path / "noop.py"
            script.write_text("pass")
            subprocess.run([sys.executable, str(script)], check=True)

        def test_unmarked(tmp_path):
            run_a_script(tmp_path)

        @pytest.mark.slow
        def test_marked(tmp_path):
            run_a_script(tmp_path)

        def test_a_probe():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        """))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert "1 failed, 2 passed" in done.stdout, done.stdout[-3000:]
    assert "test_inner.py::test_unmarked is in the quick tier but breaks its rule (tests/tiers.py): started a " \
           "process:" in done.stdout
    assert "Mark it @pytest.mark.slow, or make it quick." in done.stdout


def test_the_kaggle_stacks_files_are_test_files_here():
    assert all((TESTS / name).is_file() for name in tiers.KAGGLE_STACK), \
        sorted(name for name in tiers.KAGGLE_STACK if not (TESTS / name).is_file())


def _as_list(marks):
    return marks if isinstance(marks, list) else [marks]


def test_every_kit_module_has_a_quick_test_that_runs_its_functions():
    """tests/quick_coverage.json (written by ``python tests/quick_coverage.py``: the quick tier under coverage) names,
    for each kit module, the quick test that runs most of its functions' lines. A new module, or a module whose
    quick test was removed or marked slow, fails here until the map is written again and covers it."""
    mapping = json.loads((TESTS / "quick_coverage.json").read_text())
    uncovered = [module for module in quick_coverage.kit_modules()
                 if module not in mapping and quick_coverage.function_lines(quick_coverage.REPO / module)]
    assert not uncovered, f"no quick test is known to run these modules' functions: {uncovered}"
    for module, nodeid in mapping.items():
        file, name = nodeid.split("::")
        test_module = importlib.import_module(Path(file).stem)
        function = getattr(test_module, name, None)
        assert callable(function), f"{module}: its quick test {nodeid} no longer exists"
        marks = [mark for owner in (function, test_module) for mark in _as_list(getattr(owner, "pytestmark", []))]
        assert all(mark.name != "slow" for mark in marks), f"{module}: its quick test {nodeid} is marked slow now"
    assert all((quick_coverage.REPO / module).is_file() for module in mapping), \
        sorted(m for m in mapping if not (quick_coverage.REPO / m).is_file())
