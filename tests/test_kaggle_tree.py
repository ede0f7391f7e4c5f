"""The Kaggle path on a Kaggle file system: port (notebook 3), attach its output, train and submit (notebook 4, and
the job in a Kaggle script), as a user would, with no edit.

A temporary root is laid out as Kaggle lays out a session (``/kaggle/input`` read-only, ``/kaggle/working``): the
competition's folder holding the embedded sample's records in the competition's layout, the kit as an attached
dataset (the folder ``publish package`` builds, where Kaggle mounts it), a Kaggle Model in its mount layout, and
notebook 3's output mounted where Kaggle mounts an attached notebook's output. ``$KAGGLE_UTILS_ROOT`` points the
notebooks at it; ``$KAGGLE_UTILS_SMOKE=1`` keeps the runs at the tiny model's size (the competition data found
would otherwise choose the CPU's full run). nbclient (nbmake's engine) executes every cell of both notebooks, in
``working/``, with the kit imported from the attached dataset, not from this checkout.

This is where CI executes notebooks 3 and 4. One module fixture walks the path once; the tests read what it left.
"""
import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbclient
import nbformat
import numpy as np
import pytest

from fs_helpers import read_only_tree
from kaggle_utils import checkpoint, publish, runtime
from kaggle_utils.data import make_sample_dataset

pytestmark = pytest.mark.slow  # executes two notebooks and a job: minutes

REPO = Path(__file__).resolve().parents[1]
OWNER = "alice"
COMPETITION = "input/tpu-getting-started/tfrecords-jpeg-192x192"  # a size of the competition's: the sample's records
KIT_MOUNT = f"input/datasets/{OWNER}/{publish.KIT_SLUG}"  # an attached dataset (newer mount)
PORT_SLUG = publish.slugify(publish.notebook_title(publish.PORT_NOTEBOOK))
PORT_MOUNT = f"input/notebooks/{OWNER}/{PORT_SLUG}"  # an attached notebook's output (newer mount)
MODEL_MOUNT = f"input/models/{OWNER}/{publish.WEIGHTS_SLUG}/flax/tf-efficientnetv2-s/1"  # an attached Kaggle Model
TF_WARNING = "WARNING:tensorflow"


def kaggle_env(root: Path) -> dict:
    """A session's environment: the root, smoke size, a Kaggle kernel's marker; no checkout on the path."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KAGGLE_") and k not in ("PYTHONPATH", "MPLBACKEND")}
    return {**env, runtime.ROOT_ENV: str(root), runtime.SMOKE_ENV: "1", "KAGGLE_KERNEL_RUN_TYPE": "Interactive"}


def execute(notebook: Path, root: Path, **extra_env) -> tuple[nbformat.NotebookNode, float]:
    """Every cell of ``notebook``, unedited, run in ``root/working``; the executed notebook and its seconds."""
    nb = nbformat.read(str(notebook), as_version=4)
    started = time.perf_counter()
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(root / "working")}})
    client.execute(env={**kaggle_env(root), **extra_env})
    return nb, time.perf_counter() - started


def output_text(nb: nbformat.NotebookNode) -> str:
    """Everything the notebook printed: streams (stdout and stderr), text results, errors."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts += [out.get("text", ""), "".join(out.get("data", {}).get("text/plain", "")),
                      "\n".join(out.get("traceback", []))]
    return "\n".join(parts)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lay_out(root: Path, tmp: Path):
    """The tree before notebook 3 runs: competition, kit dataset, Kaggle Model; an empty working folder."""
    (root / "working").mkdir(parents=True)
    sample = make_sample_dataset(tmp / "sample", image_size=192, num_examples=480)
    for split in ("train", "val", "test"):
        shutil.copytree(sample.split_dirs[split], root / COMPETITION / split)
    built = publish.package(tmp / "upload", public=True, user=OWNER, notebooks_dir=tmp / "none")
    shutil.copytree(built.folders[publish.KIT_SLUG], root / KIT_MOUNT)
    weights = tmp / "ported" / "tf_efficientnetv2_s.msgpack"  # another model's file: found, never taken
    checkpoint.save(weights, {"params": {"w": np.zeros(3, np.float32)}},
                    manifest={"model": "tf_efficientnetv2_s", "source": "a stand-in", "num_classes": 0,
                              "pretrained_cfg": {"license": "apache-2.0"}})
    model = publish.package(tmp / "model", public=True, user=OWNER, notebooks_dir=tmp / "none", weights=[weights],
                            weights_as="model", kit=False).folders[publish.MODEL_FOLDER]
    shutil.copytree(model / "tf-efficientnetv2-s", root / MODEL_MOUNT)
    return sample


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    """The path, once: notebook 3; its output mounted as an input and a new session; notebook 4; the job as a
    Kaggle script. Returns what each left, with their seconds."""
    tmp = tmp_path_factory.mktemp("kaggle_tree")
    root = tmp / "kaggle"
    sample = lay_out(root, tmp)
    seconds = {}
    with read_only_tree(root / "input"):
        port, seconds["notebook 3"] = execute(REPO / "notebooks" / publish.PORT_NOTEBOOK, root,
                                              KAGGLE_USERNAME=OWNER)
    port_output = sorted(p.relative_to(root / "working") for p in (root / "working").rglob("*") if p.is_file())
    shutil.copytree(root / "working", root / PORT_MOUNT)  # the output, attached to the next session
    shutil.rmtree(root / "working")
    (root / "working").mkdir()  # a new session starts with an empty working folder
    with read_only_tree(root / "input"):
        flowers, seconds["notebook 4"] = execute(REPO / "notebooks" / publish.FLOWER_NOTEBOOK, root)
        submission_04 = (root / "working" / "submission.csv").read_text()
        (root / "working" / "submission.csv").unlink()
        script = root / "working" / "train.py"  # a script kernel: the bootstrap, then the job with what RT found
        script.write_text(runtime.BOOTSTRAP + "from kaggle_utils import job\n"
                          "job.main(['train', '--data-dir', str(RT.data_dir), '--model', RT.config.model.name,\n"
                          "          '--image-size', str(RT.config.model.image_size), '--weights', str(RT.weights),\n"
                          "          '--epochs', '1', '--steps-per-epoch', '2', '--out', str(RT.out_dir / 'run'),\n"
                          "          '--no-progress'])\n")
        started = time.perf_counter()
        job = subprocess.run([sys.executable, str(script)], cwd=root / "working", env=kaggle_env(root),
                             capture_output=True, text=True, timeout=900)
        seconds["job script"] = time.perf_counter() - started
    print("seconds:", {k: round(v) for k, v in seconds.items()})
    return dict(root=root, sample=sample, port=port, port_output=port_output, flowers=flowers,
                submission_04=submission_04, job=job, seconds=seconds)


def test_notebook_3_writes_the_weights_of_the_model_notebook_4_trains_into_working(walked):
    output = walked["port_output"]
    model = runtime.defaults("tpu", smoke=True).model.name  # smoke: the tiny model; on a TPU: the TPU row's
    assert Path(f"{model}.msgpack") in output and Path(f"{model}.json") in output
    manifest = json.loads((walked["root"] / PORT_MOUNT / f"{model}.json").read_text())
    assert manifest["model"] == model and manifest["sha256"] == sha256(walked["root"] / PORT_MOUNT / f"{model}.msgpack")
    # and the Kaggle Model folder of the same file, beside it
    variation = Path("upload") / publish.MODEL_FOLDER / publish.metadata.variation_slug(model)
    assert {variation / "model-instance-metadata.json", variation / f"{model}.msgpack"} <= set(output)
    assert publish.lint([walked["root"] / PORT_MOUNT / "upload"]) == []
    text = output_text(walked["port"])
    assert f"into {walked['root'] / 'working'}" in text and f"{walked['root'] / KIT_MOUNT} (Kaggle dataset)" in text


def test_notebook_4_trains_from_notebook_3s_output_and_says_so(walked):
    root = walked["root"]
    record = json.loads((root / "working" / "flowers_run" / "config.json").read_text())["weights"]
    ported = root / PORT_MOUNT / f"{runtime.defaults('tpu', smoke=True).model.name}.msgpack"
    assert record["file"] == str(ported) and record["sha256"] == sha256(ported)
    text = output_text(walked["flowers"])
    assert f"weights   {ported} (random init" in text  # the report names the file and what it is
    assert f"{root / KIT_MOUNT} (Kaggle dataset)" in text  # the kit came from the attached dataset
    # the Model's weights (another model) are in the tree where Kaggle mounts them, and found there
    assert runtime.find_weights("tf_efficientnetv2_s", root=root) == [root / MODEL_MOUNT / "tf_efficientnetv2_s.msgpack"]


def submission_rows(text: str) -> list[list[str]]:
    return list(csv.reader(text.splitlines()))


def test_notebook_4_writes_the_submission_where_kaggle_reads_it(walked):
    rows = submission_rows(walked["submission_04"])
    assert rows[0] == ["id", "label"]  # the competition's columns
    ids = [row[0] for row in rows[1:]]
    assert sorted(ids) == sorted(walked["sample"].test_labels) and len(set(ids)) == len(ids)  # each test id once
    assert all(0 <= int(row[1]) < 104 for row in rows[1:])
    assert f"submission: {walked['root'] / 'working' / 'submission.csv'}" in output_text(walked["flowers"])


def test_every_cell_ran_and_no_tensorflow_warning_was_printed(walked):
    for name in ("port", "flowers"):
        nb = walked[name]
        assert all(c.execution_count is not None for c in nb.cells if c.cell_type == "code"), name
        assert TF_WARNING not in output_text(nb), name
    text = output_text(walked["flowers"])
    assert "epoch 1:" in text and " s (training and evaluation)" in text  # time per epoch
    assert "plan skipped on a CPU" in text and "per_class.csv" in text


def test_the_job_as_a_kaggle_script_trains_from_the_same_weights_and_submits(walked):
    root, job = walked["root"], walked["job"]
    assert job.returncode == 0, job.stderr[-3000:]
    target = root / "working" / "submission.csv"
    assert (f"submission: {target} (a copy of {root / 'working' / 'run' / 'submission.csv'}): where Kaggle's Submit"
            in job.stdout)
    rows = submission_rows(target.read_text())
    assert rows[0] == ["id", "label"] and sorted(r[0] for r in rows[1:]) == sorted(walked["sample"].test_labels)
    record = json.loads((root / "working" / "run" / "config.json").read_text())["weights"]
    ported = root / PORT_MOUNT / f"{runtime.defaults('tpu', smoke=True).model.name}.msgpack"
    assert record["file"] == str(ported) and record["sha256"] == sha256(ported)
    assert TF_WARNING not in job.stdout + job.stderr
