"""kaggle_utils.publish: Kaggle's slug rule, the metadata lint, and the upload folders of ``package``."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from fs_helpers import read_only_folder
from kaggle_utils import checkpoint, publish, runtime

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "kernel-metadata.json"
PINNED = {"dockerImageVersionId": 30918, "accelerator": "nvidiaTeslaT4"}


def write_notebook(path: Path, *, pinned: bool = False) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A notebook"),
                                         nbformat.v4.new_code_cell("print('hello')")])
    if pinned:
        nb.metadata["kaggle"] = {**PINNED, "isInternetEnabled": False, "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def write_weights(path: Path, model: str = "tf_efficientnetv2_b0") -> Path:
    checkpoint.save(path, {"params": {"w": np.arange(3, dtype=np.float32)}},
                    manifest={"model": model, "source": "random init (seed 0); for demos and tests only",
                              "num_classes": 0, "pretrained_cfg": {"license": "apache-2.0"}})
    return path


def committed_copy(tmp_path: Path) -> Path:
    """The committed kernel-metadata.json beside its notebook (a stand-in until the real one lands)."""
    meta = json.loads(COMMITTED.read_text())
    real = REPO / meta["code_file"]
    target = tmp_path / meta["code_file"]
    if real.is_file():
        target.parent.mkdir(parents=True)
        shutil.copy(real, target)
    else:
        write_notebook(target)
    shutil.copy(COMMITTED, tmp_path / "kernel-metadata.json")
    return tmp_path / "kernel-metadata.json"


def mutated(tmp_path: Path, change) -> Path:
    path = committed_copy(tmp_path)
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))
    return path


# ------------------------------------------------------------------ slugs


@pytest.mark.parametrize("title, slug", [
    # python-slugify's documented examples (the Kaggle CLI calls its slugify with the defaults)
    ("This is a test ---", "this-is-a-test"),
    ("C'est déjà l'été.", "c-est-deja-l-ete"),
    ("Nín hǎo. Wǒ shì zhōng guó rén", "nin-hao-wo-shi-zhong-guo-ren"),
    ("jaja---lol-méméméoo--a", "jaja-lol-mememeoo-a"),
    ("1,000 reasons you are #1", "1000-reasons-you-are-1"),
    ("foo &amp; bar", "foo-bar"),
    # a push observed to land at the title's slug
    ("bit-flip e5b silent dealignment (chosen arm)", "bit-flip-e5b-silent-dealignment-chosen-arm"),
    ("  EfficientNetV2 in Flax!! ", "efficientnetv2-in-flax"),
])
def test_slugify_follows_kaggle(title, slug):
    assert publish.slugify(title) == slug


def test_notebook_titles_from_the_table_or_the_file_name():
    assert publish.notebook_title("notebooks/04_flower_classification_tpu.ipynb") == \
        publish.NOTEBOOK_TITLES["04_flower_classification_tpu"]
    assert publish.notebook_title("x/07_my_new_idea.ipynb") == "My new idea"


# ------------------------------------------------------------------ the committed metadata


def test_committed_kernel_metadata_is_the_flower_tpu_kernel():
    meta = json.loads(COMMITTED.read_text())
    assert meta["code_file"] == "notebooks/04_flower_classification_tpu.ipynb"
    assert meta["enable_tpu"] is True and meta["enable_gpu"] is False and meta["machine_shape"] == "TpuV5E8"
    assert meta["competition_sources"] == ["tpu-getting-started"]
    assert meta["enable_internet"] is False and "docker_image" not in meta
    assert {"kaggle-utils/kaggle-utils", "kaggle-utils/efficientnetv2-jax"} <= set(meta["dataset_sources"])
    assert meta["id"].split("/")[1] == publish.slugify(meta["title"])
    # the same settings package writes for the flower notebook: one source of truth
    assert meta == publish.kernel_metadata(meta["code_file"], code_file=meta["code_file"])


def test_lint_passes_the_committed_metadata(tmp_path):
    assert publish.lint([committed_copy(tmp_path)]) == []


def test_lint_defaults_pass_on_the_repository(capsys):
    assert publish.main(["lint"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("case, change, key, words", [
    ("docker image on a TPU", lambda m: m.update(docker_image="gcr.io/kaggle-images/python"), "docker_image",
     ["remove it", "enable_tpu", "CPU"]),
    ("bad slug", lambda m: m.update(title="Flowers on a TPU"), "title",
     ["'flowers-on-a-tpu'", "'flower-classification-on-tpu-with-jax'"]),
    ("missing code file", lambda m: m.update(code_file="notebooks/missing.ipynb"), "code_file",
     ["'notebooks/missing.ipynb' does not exist"]),
])
def test_lint_fails_clearly_on_broken_copies(tmp_path, capsys, case, change, key, words):
    path = mutated(tmp_path, change)
    problems = publish.lint([path])
    assert [(p.file, p.key) for p in problems] == [(str(path), key)], problems
    assert all(w in problems[0].message for w in words), problems[0].message
    assert publish.main(["lint", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: {key}: " in err and "1 problem(s)" in err


@pytest.mark.parametrize("change, key, words", [
    (lambda m: m.update(competition_sources=["c/tpu-getting-started"]), "competition_sources", "no 'c/' prefix"),
    (lambda m: m["dataset_sources"].append("https://www.kaggle.com/datasets/a/b"), "dataset_sources", "no URL"),
    (lambda m: m["dataset_sources"].append("d/someone/weights"), "dataset_sources", "'d/' prefix"),
    (lambda m: m.pop("enable_internet"), "enable_internet", "turns internet ON"),
    (lambda m: m.update(enable_internet=True), "enable_internet", "must be false"),
    (lambda m: m.update(enable_tpus=True), "enable_tpus", "unknown key"),
    (lambda m: m.update(machine_shape="NvidiaTeslaT4"), "machine_shape", "not a TPU shape"),
    (lambda m: m.pop("machine_shape"), "machine_shape", "missing with enable_tpu"),
    (lambda m: m.update(enable_tpu=False), "machine_shape", "without enable_tpu"),
    (lambda m: m.update(enable_gpu=True), "enable_tpu", "both true"),
    (lambda m: m.update(is_private="yes"), "is_private", "true or false"),
    (lambda m: m.update(id="kaggle-utils/Flower_TPU"), "id", "lowercase"),
    (lambda m: m.update(title="Flwr", id="kaggle-utils/flwr"), "title", "at least 5"),
    (lambda m: m.update(kernel_type="script"), "code_file", "not a script"),
])
def test_lint_names_each_other_trap(tmp_path, change, key, words):
    problems = publish.lint([mutated(tmp_path, change)])
    assert any(p.key == key and words in p.message for p in problems), problems


def test_lint_of_a_folder_with_nothing_to_check_is_an_error(tmp_path, capsys):
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "sub" / "notes.txt").write_text("x")
    assert publish.main(["lint", str(empty)]) == 2
    printed = capsys.readouterr()
    assert printed.err == (f"error: {empty}: nothing to check (no kernel-metadata.json, dataset-metadata.json or "
                           ".ipynb in it): give the folder or files to lint\n")
    assert "ok" not in printed.out
    with pytest.raises(publish.PackagingError, match="nothing to check"):
        publish.lint([committed_copy(tmp_path / "meta"), empty])


def test_lint_reports_and_fixes_pinned_image_keys(tmp_path, capsys):
    path = mutated(tmp_path, lambda m: None)
    notebook = tmp_path / json.loads(path.read_text())["code_file"]
    write_notebook(notebook, pinned=True)
    before = notebook.read_text()
    problems = publish.lint([path, notebook])  # the notebook is reached twice, reported once
    assert sorted(p.key for p in problems) == ["metadata.kaggle.accelerator", "metadata.kaggle.dockerImageVersionId"]
    assert all(p.file == str(notebook) and not p.fixed for p in problems)
    assert notebook.read_text() == before  # lint alone changes nothing
    assert publish.main(["lint", "--fix", str(path)]) == 0
    assert "(fixed)" in capsys.readouterr().out
    fixed = json.loads(notebook.read_text())
    assert fixed["metadata"]["kaggle"] == {"isInternetEnabled": False, "language": "python"}  # the rest kept
    reread = nbformat.read(str(notebook), as_version=4)
    nbformat.validate(reread)  # still a valid notebook, cells intact
    assert [c.source for c in reread.cells] == ["# A notebook", "print('hello')"]
    assert publish.lint([path]) == []


def test_dataset_metadata_rules(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "README.md").write_text("x")
    good = {"title": "Some weights", "subtitle": "twenty or more characters here", "id": "alice/some-weights",
            "licenses": [{"name": "CC0-1.0"}], "resources": [{"path": "README.md", "description": "x"}]}
    path = folder / "dataset-metadata.json"
    path.write_text(json.dumps(good))
    assert publish.lint([folder]) == []
    for change, key in [(dict(title="Short"), "title"), (dict(subtitle="too short"), "subtitle"),
                        (dict(licenses=[{"name": "CC0-1.0"}, {"name": "apache-2.0"}]), "licenses"),
                        (dict(licenses=[]), "licenses"), (dict(id="alice/ab"), "id"), (dict(id="some-weights"), "id"),
                        (dict(resources=[{"path": "gone.bin"}]), "resources[0]"), (dict(titel="x"), "titel")]:
        path.write_text(json.dumps({**good, **change}))
        assert [p.key for p in publish.lint([path])] == [key], change


# ------------------------------------------------------------------ package


@pytest.fixture
def notebooks(tmp_path):
    folder = tmp_path / "notebooks"
    write_notebook(folder / publish.FLOWER_NOTEBOOK, pinned=True)
    write_notebook(folder / "01_flax_model_surgery.ipynb")
    return folder


def test_package_builds_upload_ready_folders(tmp_path, notebooks, capsys):
    weights = write_weights(tmp_path / "ported" / "tf_efficientnetv2_b0.msgpack")
    out = tmp_path / "out"
    assert publish.main(["package", str(out), "--user", "alice", "--notebooks", str(notebooks),
                        "--weights", str(weights)]) == 0
    printed = capsys.readouterr().out
    flower_slug = publish.slugify(publish.notebook_title(publish.FLOWER_NOTEBOOK))
    surgery_slug = publish.slugify(publish.notebook_title("01_flax_model_surgery.ipynb"))
    assert sorted(p.name for p in out.iterdir()) == sorted([flower_slug, surgery_slug, "kaggle-utils",
                                                            "efficientnetv2-jax"])
    assert "random initialisation" in printed and "metadata.kaggle.dockerImageVersionId" in printed
    assert f"kaggle kernels push -p {out / flower_slug}" in printed
    assert f"kaggle datasets create -p {out / 'kaggle-utils'} --dir-mode zip" in printed

    # notebooks: the copy without the pinned keys, its own metadata
    flower = json.loads((out / flower_slug / "kernel-metadata.json").read_text())
    assert flower["id"] == f"alice/{flower_slug}" and flower["code_file"] == publish.FLOWER_NOTEBOOK
    assert (flower["enable_tpu"], flower["machine_shape"], flower["competition_sources"]) == \
        (True, "TpuV5E8", ["tpu-getting-started"])
    assert set(flower["dataset_sources"]) == {"alice/kaggle-utils", "alice/efficientnetv2-jax"}
    copy_meta = json.loads((out / flower_slug / publish.FLOWER_NOTEBOOK).read_text())["metadata"]["kaggle"]
    assert not set(PINNED) & set(copy_meta) and copy_meta["language"] == "python"
    assert "dockerImageVersionId" in (notebooks / publish.FLOWER_NOTEBOOK).read_text()  # the source is untouched
    surgery = json.loads((out / surgery_slug / "kernel-metadata.json").read_text())
    assert (surgery["enable_tpu"], surgery["enable_gpu"], surgery["enable_internet"]) == (False, False, False)
    assert surgery["competition_sources"] == [] and "machine_shape" not in surgery

    # the kit: both packages, whole, and nothing else of the repository
    kit = out / "kaggle-utils"
    for package in ("kaggle_utils", "weights_port"):
        shipped = {p.relative_to(kit / package) for p in (kit / package).rglob("*.py")}
        assert shipped == {p.relative_to(REPO / package) for p in (REPO / package).rglob("*.py")}
    assert not list(kit.rglob("__pycache__")) and not (kit / "tests").exists() and not (kit / ".git").exists()
    assert json.loads((kit / "dataset-metadata.json").read_text())["id"] == "alice/kaggle-utils"

    # the weights: file, manifest, metadata naming them
    shipped = out / "efficientnetv2-jax"
    assert (shipped / weights.name).read_bytes() == weights.read_bytes()
    assert json.loads((shipped / "tf_efficientnetv2_b0.json").read_text())["model"] == "tf_efficientnetv2_b0"
    meta = json.loads((shipped / "dataset-metadata.json").read_text())
    assert meta["id"] == "alice/efficientnetv2-jax" and meta["licenses"] == [{"name": "apache-2.0"}]
    assert {r["path"] for r in meta["resources"]} == {weights.name, "tf_efficientnetv2_b0.json"}

    assert publish.lint([out]) == []  # package already linted it; so does the command
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging folders left


def test_packaged_kit_is_what_the_first_cell_imports_on_kaggle(tmp_path):
    out = tmp_path / "out"
    publish.package(out, notebooks_dir=tmp_path / "none")
    root = tmp_path / "kaggle"
    (root / "working").mkdir(parents=True)
    shutil.copytree(out / "kaggle-utils", root / "input" / "kaggle-utils")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAGGLE_UTILS_") and k != "PYTHONPATH"}
    env[runtime.ROOT_ENV] = str(root)
    code = runtime.BOOTSTRAP + "print('IMPORTED', runtime.__file__, RT.smoke, RT.out_dir)\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=root / "working", env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{root / 'input' / 'kaggle-utils'} (Kaggle dataset)" in done.stdout
    assert done.stdout.splitlines()[-1].split() == [
        "IMPORTED", str(root / "input" / "kaggle-utils" / "kaggle_utils" / "runtime.py"), "True", str(root / "working")]


def test_package_works_without_notebooks_and_weights(tmp_path, capsys):
    out = tmp_path / "out"
    assert publish.main(["package", str(out), "--notebooks", str(tmp_path / "missing")]) == 0
    assert [p.name for p in out.iterdir()] == ["kaggle-utils"]
    printed = capsys.readouterr().out
    assert "no notebooks in" in printed and "no --weights" in printed


def test_package_checks_everything_before_writing(tmp_path, notebooks, capsys):
    out = tmp_path / "out"
    bare = tmp_path / "bare.msgpack"
    bare.write_bytes(b"\x80")
    tampered = write_weights(tmp_path / "t" / "m.msgpack")
    tampered.write_bytes(tampered.read_bytes() + b"\x00")
    checkpoint_like = write_weights(tmp_path / "c" / "best.msgpack")
    manifest = json.loads(checkpoint_like.with_suffix(".json").read_text())
    checkpoint_like.with_suffix(".json").write_text(json.dumps({**manifest, "model": {"name": "b0"}}))
    for weights, words in [(bare, "no manifest bare.json"), (tampered, "differs from its manifest m.json (sha256"),
                           (checkpoint_like, "names no model"), (tmp_path / "nope.msgpack", "not an existing")]:
        assert publish.main(["package", str(out), "--notebooks", str(notebooks), "--weights", str(weights)]) == 2
        assert words in capsys.readouterr().err
        assert not out.exists()
    assert publish.main(["package", str(out), "--user", "bad/user"]) == 2
    broken = notebooks / "09_broken.ipynb"
    broken.write_text("{not json")
    assert publish.main(["package", str(out), "--notebooks", str(notebooks)]) == 2
    assert "09_broken.ipynb: not a readable notebook" in capsys.readouterr().err and not out.exists()
    broken.unlink()
    assert publish.main(["package", str(out), "--notebooks", str(notebooks)]) == 0
    assert publish.main(["package", str(out), "--notebooks", str(notebooks)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    (notebooks / "01_flax_model_surgery.ipynb").unlink()
    write_notebook(notebooks / "05_extra.ipynb")
    assert publish.main(["package", str(out), "--notebooks", str(notebooks), "--overwrite"]) == 0
    assert (out / "extra" / "05_extra.ipynb").is_file()
    assert (out / "flax-model-surgery").is_dir()  # only the folders this run builds are replaced


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_package_into_a_read_only_place_or_onto_a_file_is_one_line(tmp_path, capsys):
    a_file = tmp_path / "out.txt"
    a_file.write_text("keep me")
    assert publish.main(["package", str(a_file), "--notebooks", str(tmp_path / "none")]) == 2
    assert f"{a_file} is a file" in _one_line_error(capsys)
    assert a_file.read_text() == "keep me"

    with read_only_folder(tmp_path / "ro") as read_only:
        for out in (read_only, read_only / "out"):
            assert publish.main(["package", str(out), "--notebooks", str(tmp_path / "none")]) == 2
            err = _one_line_error(capsys)
            assert f"cannot write into {out}: " in err and ("Read-only" in err or "Permission denied" in err), err
            assert list(read_only.iterdir()) == []

    out = tmp_path / "built"
    out.mkdir()
    (out / publish.KIT_SLUG).write_text("a file where the kit folder goes")
    assert publish.main(["package", str(out), "--notebooks", str(tmp_path / "none"), "--overwrite"]) == 2
    assert f"{out / publish.KIT_SLUG}: a file where package writes a folder" in _one_line_error(capsys)
    assert sorted(p.name for p in out.iterdir()) == [publish.KIT_SLUG]
    assert (out / publish.KIT_SLUG).read_text() == "a file where the kit folder goes"


def test_two_notebooks_with_one_slug_are_refused(tmp_path):
    folder = tmp_path / "nb"
    write_notebook(folder / "05_my_idea.ipynb")
    write_notebook(folder / "06_my-idea.ipynb")
    with pytest.raises(publish.PackagingError, match="both get the kernel slug 'my-idea'"):
        publish.package(tmp_path / "out", notebooks_dir=folder)


def test_kernel_metadata_of_every_planned_notebook_is_clean(tmp_path):
    for stem in publish.NOTEBOOK_TITLES:
        folder = tmp_path / stem
        write_notebook(folder / f"{stem}.ipynb")
        meta = publish.kernel_metadata(folder / f"{stem}.ipynb", user="bob")
        (folder / "kernel-metadata.json").write_text(json.dumps(meta))
        assert meta["id"].startswith("bob/")
        # online only where timm's pretrained weights are fetched; never with the competition attached
        assert meta["enable_internet"] is (stem == "03_port_pytorch_weights")
    assert publish.lint([tmp_path]) == []


def test_internet_is_refused_only_with_a_competition_attached(tmp_path):
    path = committed_copy(tmp_path)
    meta = json.loads(path.read_text())
    meta.update(enable_internet=True, competition_sources=[], enable_tpu=False)
    meta.pop("machine_shape")
    path.write_text(json.dumps(meta))
    assert publish.lint([path]) == []
