"""kaggle_utils.publish: Kaggle's slug rule, the metadata lint against the real kaggle client (tests/kaggle_client.py:
its validation run with the network cut), the owner and visibility, and the upload folders of ``package``."""
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
from kaggle_client import offline_client
from kaggle_utils import checkpoint, publish, runtime
from kaggle_utils.publish import metadata, rules

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


def committed_copy(tmp_path: Path, *, template: bool = False) -> Path:
    """The committed kernel-metadata.json beside a copy of its notebook: as committed (``template``), or as pushed:
    with the owner and the visibility ``package`` adds."""
    meta = json.loads(COMMITTED.read_text())
    target = tmp_path / meta["code_file"]
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / meta["code_file"], target)
    if not template:
        meta = publish.kernel_metadata(meta["code_file"], user="alice", public=False, code_file=meta["code_file"])
    (tmp_path / "kernel-metadata.json").write_text(json.dumps(meta))
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


def test_committed_kernel_metadata_is_the_flower_tpu_kernel_without_an_owner():
    meta = json.loads(COMMITTED.read_text())
    assert meta["code_file"] == "notebooks/04_flower_classification_tpu.ipynb"
    assert meta["enable_tpu"] is True and meta["enable_gpu"] is False and meta["machine_shape"] == "TpuV5E8"
    assert meta["competition_sources"] == ["tpu-getting-started"]
    assert meta["enable_internet"] is False and "docker_image" not in meta
    # no owner, no visibility, no owner's sources: package writes them; the same settings it writes for the
    # flower notebook otherwise (one source of truth)
    assert not {"id", "is_private", "dataset_sources", "kernel_sources", "model_sources"} & set(meta)
    assert meta == publish.kernel_metadata(meta["code_file"], user=None, public=None, code_file=meta["code_file"])
    pushed = publish.kernel_metadata(meta["code_file"], user="bob", public=True, code_file=meta["code_file"])
    assert {k: v for k, v in pushed.items() if k in meta} == meta


def test_the_committed_template_cannot_be_pushed_as_it_is(tmp_path):
    path = committed_copy(tmp_path, template=True)
    with offline_client(tmp_path / "kaggle-config") as client:
        verdict, message = client.push(tmp_path)
    assert verdict == "refused" and "ID or slug must be specified" in message
    problems = publish.lint([path])  # named, it is linted as what it is, a file to push
    assert [p.key for p in problems] == ["id"] and "template" in problems[0].message


def test_lint_passes_a_pushed_copy(tmp_path):
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
    (lambda m: m.update(id="alice/Flower_TPU"), "id", "lowercase"),
    (lambda m: m.update(title="Flwr", id="alice/flwr"), "title", "at least 5"),
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
    assert printed.err == (f"error: {empty}: nothing to check (no kernel-metadata.json, dataset-metadata.json, "
                           "model-metadata.json, model-instance-metadata.json or .ipynb in it): give the folder or "
                           "files to lint\n")
    assert "ok" not in printed.out
    with pytest.raises(publish.PackagingError, match="nothing to check"):
        publish.lint([committed_copy(tmp_path / "meta"), empty])
    assert "model-metadata.json" in printed.err  # the four files lint knows are named


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
                        "--weights", str(weights), "--private"]) == 0
    printed = capsys.readouterr().out
    flower_slug = publish.slugify(publish.notebook_title(publish.FLOWER_NOTEBOOK))
    surgery_slug = publish.slugify(publish.notebook_title("01_flax_model_surgery.ipynb"))
    assert sorted(p.name for p in out.iterdir()) == sorted([flower_slug, surgery_slug, "kaggle-utils",
                                                            "efficientnetv2-jax"])
    assert "random initialisation" in printed and "metadata.kaggle.dockerImageVersionId" in printed
    assert "owner      alice (from --user)" in printed and "visibility private" in printed
    first = printed.split("upload, the first time")[1].split("later, a new version")[0].splitlines()[1:]
    assert [line.strip() for line in first] == [  # the datasets before the kernels that attach them
        f"kaggle datasets create -p {out / 'kaggle-utils'} --dir-mode zip",  # no zip: no code uploaded
        f"kaggle datasets create -p {out / 'efficientnetv2-jax'}",
        f"kaggle kernels push -p {out / surgery_slug}", f"kaggle kernels push -p {out / flower_slug}"]
    assert f"kaggle datasets version -p {out / 'kaggle-utils'} --dir-mode zip -m " in printed
    assert f"kaggle datasets version -p {out / 'efficientnetv2-jax'} -m " in printed

    # notebooks: the copy without the pinned keys, its own metadata
    flower = json.loads((out / flower_slug / "kernel-metadata.json").read_text())
    assert flower["id"] == f"alice/{flower_slug}" and flower["code_file"] == publish.FLOWER_NOTEBOOK
    assert (flower["enable_tpu"], flower["machine_shape"], flower["competition_sources"]) == \
        (True, "TpuV5E8", ["tpu-getting-started"])
    assert flower["is_private"] is True
    assert set(flower["dataset_sources"]) == {"alice/kaggle-utils", "alice/efficientnetv2-jax"}
    assert flower["kernel_sources"] == [] and flower["model_sources"] == []
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
    publish.package(out, public=True, user="alice", notebooks_dir=tmp_path / "none")
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
    assert publish.main(["package", str(out), "--notebooks", str(tmp_path / "missing"), "--user", "alice",
                         "--public"]) == 0
    assert [p.name for p in out.iterdir()] == ["kaggle-utils"]
    printed = capsys.readouterr().out
    assert "no notebooks in" in printed and "no --weights" in printed and "visibility public" in printed
    assert f"kaggle datasets create -p {out / 'kaggle-utils'} --dir-mode zip --public" in printed


def package_cli(args: list[str]) -> int:
    """``package ARGS`` as alice, private (the two choices it needs)."""
    return publish.main(["package", *args, "--user", "alice", "--private"])


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
        assert package_cli([str(out), "--notebooks", str(notebooks), "--weights", str(weights)]) == 2
        assert words in capsys.readouterr().err
        assert not out.exists()
    assert publish.main(["package", str(out), "--user", "bad/user", "--public"]) == 2
    broken = notebooks / "09_broken.ipynb"
    broken.write_text("{not json")
    assert package_cli([str(out), "--notebooks", str(notebooks)]) == 2
    assert "09_broken.ipynb: not a readable notebook" in capsys.readouterr().err and not out.exists()
    broken.unlink()
    assert package_cli([str(out), "--notebooks", str(notebooks)]) == 0
    assert package_cli([str(out), "--notebooks", str(notebooks)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    (notebooks / "01_flax_model_surgery.ipynb").unlink()
    write_notebook(notebooks / "05_extra.ipynb")
    assert package_cli([str(out), "--notebooks", str(notebooks), "--overwrite"]) == 0
    assert (out / "extra" / "05_extra.ipynb").is_file()
    assert (out / "flax-model-surgery").is_dir()  # only the folders this run builds are replaced


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_package_into_a_read_only_place_or_onto_a_file_is_one_line(tmp_path, capsys):
    a_file = tmp_path / "out.txt"
    a_file.write_text("keep me")
    assert package_cli([str(a_file), "--notebooks", str(tmp_path / "none")]) == 2
    assert f"{a_file} is a file" in _one_line_error(capsys)
    assert a_file.read_text() == "keep me"

    with read_only_folder(tmp_path / "ro") as read_only:
        for out in (read_only, read_only / "out"):
            assert package_cli([str(out), "--notebooks", str(tmp_path / "none")]) == 2
            err = _one_line_error(capsys)
            assert f"cannot write into {out}: " in err and ("Read-only" in err or "Permission denied" in err), err
            assert list(read_only.iterdir()) == []

    out = tmp_path / "built"
    out.mkdir()
    (out / publish.KIT_SLUG).write_text("a file where the kit folder goes")
    assert package_cli([str(out), "--notebooks", str(tmp_path / "none"), "--overwrite"]) == 2
    assert f"{out / publish.KIT_SLUG}: a file where package writes a folder" in _one_line_error(capsys)
    assert sorted(p.name for p in out.iterdir()) == [publish.KIT_SLUG]
    assert (out / publish.KIT_SLUG).read_text() == "a file where the kit folder goes"


def test_two_notebooks_with_one_slug_are_refused(tmp_path):
    folder = tmp_path / "nb"
    write_notebook(folder / "05_my_idea.ipynb")
    write_notebook(folder / "06_my-idea.ipynb")
    with pytest.raises(publish.PackagingError, match="both get the kernel slug 'my-idea'"):
        publish.package(tmp_path / "out", public=False, user="alice", notebooks_dir=folder)


def test_kernel_metadata_of_every_planned_notebook_is_clean(tmp_path):
    for stem in publish.NOTEBOOK_TITLES:
        folder = tmp_path / stem
        write_notebook(folder / f"{stem}.ipynb")
        meta = publish.kernel_metadata(folder / f"{stem}.ipynb", user="bob", public=True)
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


# ------------------------------------------------------------------ the owner and the visibility


@pytest.fixture
def no_client_config(tmp_path, monkeypatch):
    """A home with no kaggle client configuration; returns that home."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("KAGGLE_USERNAME", "KAGGLE_CONFIG_DIR", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    return home


def test_the_owner_comes_from_user_or_the_clients_own_configuration(no_client_config, monkeypatch, capsys):
    home = no_client_config
    with pytest.raises(publish.PackagingError, match="no Kaggle owner: give --user") as refused:
        publish.kaggle_owner()
    assert str(home / ".config" / "kaggle" / "kaggle.json") in str(refused.value)  # where this client would look
    assert publish.main(["package", str(home / "out"), "--public"]) == 2 and not (home / "out").exists()
    assert "--user YOUR_KAGGLE_NAME" in capsys.readouterr().err
    (home / ".config" / "kaggle").mkdir(parents=True)  # the XDG place, when ~/.kaggle does not exist
    (home / ".config" / "kaggle" / "kaggle.json").write_text(json.dumps({"username": "carol", "key": "k"}))
    assert publish.kaggle_owner() == ("carol", str(home / ".config" / "kaggle" / "kaggle.json"))
    (home / ".kaggle").mkdir()  # ~/.kaggle, once it exists, is the client's place
    (home / ".kaggle" / "kaggle.json").write_text(json.dumps({"username": "dave", "key": "k"}))
    assert publish.kaggle_owner()[0] == "dave"
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(home / "elsewhere"))
    (home / "elsewhere").mkdir()
    (home / "elsewhere" / "kaggle.json").write_text(json.dumps({"username": "erin"}))
    assert publish.kaggle_owner()[0] == "erin"
    monkeypatch.setenv("KAGGLE_USERNAME", "frank")  # the environment wins, in the client too
    assert publish.kaggle_owner() == ("frank", "KAGGLE_USERNAME")
    assert publish.kaggle_owner("grace") == ("grace", "--user")
    for bad in ("Grace", "grace/x", "-grace"):
        with pytest.raises(publish.PackagingError, match="not a Kaggle user name"):
            publish.kaggle_owner(bad)


def test_package_needs_a_visibility_and_shows_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        publish.main(["package", str(tmp_path / "out"), "--user", "alice"])
    assert stopped.value.code == 2 and "one of the arguments --public --private is required" in capsys.readouterr().err
    with pytest.raises(publish.PackagingError, match="choose --public"):
        publish.package(tmp_path / "out", public=None, user="alice")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ the real client on what package writes


def package_for(tmp_path: Path, public: bool, weights_as: str, *, weights: bool = True):
    notebooks = tmp_path / "notebooks"
    for name in ("01_flax_model_surgery.ipynb", publish.PORT_NOTEBOOK, publish.FLOWER_NOTEBOOK):
        write_notebook(notebooks / name)
    files = [write_weights(tmp_path / "ported" / "tf_efficientnetv2_m.msgpack", "tf_efficientnetv2_m"),
             write_weights(tmp_path / "ported" / "b0.msgpack", "tf_efficientnetv2_b0")] if weights else []
    return publish.package(tmp_path / "out", public=public, user="alice", notebooks_dir=notebooks, weights=files,
                           weights_as=weights_as)


@pytest.mark.parametrize("public, weights_as", [(True, "model"), (False, "dataset")])
def test_every_file_package_writes_passes_the_real_client(tmp_path, public, weights_as):
    result = package_for(tmp_path, public, weights_as)
    assert result.problems == []
    folders = result.folders
    flower = folders[publish.slugify(publish.notebook_title(publish.FLOWER_NOTEBOOK))]
    port = folders[publish.slugify(publish.notebook_title(publish.PORT_NOTEBOOK))]
    with offline_client(tmp_path / "kaggle-config") as client:
        for folder in (flower, port, folders["flax-model-surgery"]):
            verdict, request = client.push(folder)
            assert verdict == "sent", request
            assert request.is_private is (not public) and request.dataset_data_sources[0] == "alice/kaggle-utils"
        verdict, request = client.push(flower)
        assert (request.enable_tpu, request.enable_internet, request.machine_shape) == (True, False, "TpuV5E8")
        assert client.push(port)[1].enable_internet is True  # the port downloads timm's weights
        kit = folders[publish.KIT_SLUG]
        verdict, request = client.create_dataset(kit, public=public, dir_mode="zip")
        assert verdict == "sent" and request.is_private is (not public)
        assert {"kaggle_utils.zip", "weights_port.zip", "README.md"} <= set(client.uploads)  # the code goes up
        client.uploads.clear()
        assert client.create_dataset(kit, public=public)[0] == "sent"
        assert "kaggle_utils.zip" not in client.uploads  # what --dir-mode zip is for: without it, no code at all
        assert client.version_dataset(kit, dir_mode="zip")[0] == "sent"
        if weights_as == "dataset":
            assert client.push(flower)[1].dataset_data_sources == ["alice/kaggle-utils", "alice/efficientnetv2-jax"]
            client.uploads.clear()
            assert client.create_dataset(folders[publish.WEIGHTS_SLUG])[0] == "sent"
            assert sorted(client.uploads) == ["b0.json", "b0.msgpack", "tf_efficientnetv2_m.json",
                                              "tf_efficientnetv2_m.msgpack"]
            return
        model = folders[publish.MODEL_FOLDER]
        verdict, request = client.create_model(model)
        assert verdict == "sent" and request.is_private is (not public) and request.slug == publish.WEIGHTS_SLUG
        variations = sorted(p.name for p in model.iterdir() if p.is_dir())
        assert variations == ["tf-efficientnetv2-b0", "tf-efficientnetv2-m"]
        for variation in variations:
            client.uploads.clear()
            verdict, request = client.create_instance(model / variation)
            assert verdict == "sent" and request.body.instance_slug == variation
            assert request.body.framework.name == "MODEL_FRAMEWORK_FLAX"
            shipped = sorted(p.name for p in (model / variation).iterdir() if p.name != metadata.INSTANCE_METADATA)
            assert sorted(client.uploads) == shipped and len(shipped) == 2  # the weights and their manifest
        assert client.push(flower)[1].model_data_sources == [
            f"alice/efficientnetv2-jax/flax/{v}/1" for v in variations]


def test_without_weights_the_notebooks_attach_the_port_notebooks_output(tmp_path):
    result = package_for(tmp_path, True, "model", weights=False)
    flower = json.loads((result.folders["flower-classification-on-tpu-with-jax"] / "kernel-metadata.json").read_text())
    assert flower["kernel_sources"] == ["alice/port-pytorch-weights-to-flax"] and flower["model_sources"] == []
    port_push, flower_push = (c for c in result.commands if "kernels push" in c and ("port" in c or "flower" in c))
    assert "port-pytorch" in port_push and "kaggle kernels status alice/port-pytorch-weights-to-flax" in flower_push


# ------------------------------------------------------------------ each rejection of the client is lint's


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The folders package writes (weights as a Model), once for the rules' tests, which copy what they change."""
    return package_for(tmp_path_factory.mktemp("built"), True, "model")


def folder_of(tmp_path: Path, built, kind: str) -> Path:
    """A copy of the folder holding one valid metadata file of ``kind``, with what it names."""
    source = {"kernel": built.folders["flower-classification-on-tpu-with-jax"], "dataset": built.folders[
        publish.KIT_SLUG], "model": built.folders[publish.MODEL_FOLDER],
        "instance": built.folders[publish.MODEL_FOLDER] / "tf-efficientnetv2-m"}[kind]
    folder = tmp_path / kind
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("tf-efficientnetv2-*"))
    return folder


FILES = {"kernel": metadata.KERNEL_METADATA, "dataset": metadata.DATASET_METADATA, "model": metadata.MODEL_METADATA,
         "instance": metadata.INSTANCE_METADATA}


def client_and_lint(tmp_path: Path, built, kind: str, change) -> tuple[tuple, list]:
    """The client's verdict and lint's problems on a valid ``kind`` file changed by ``change(meta)``."""
    folder = folder_of(tmp_path, built, kind)
    path = folder / FILES[kind]
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))
    with offline_client(tmp_path / "kaggle-config") as client:
        verdict = {"kernel": client.push, "dataset": client.create_dataset, "model": client.create_model,
                   "instance": client.create_instance}[kind](folder)
    return verdict, publish.lint([path])


REJECTED = [  # (kind, change, what the client says, lint's key, lint's words): the six first
    ("dataset", lambda m: m.update(id="alice/utils"), "slug must be between 6 and 50", "id", "6-50"),
    ("dataset", lambda m: m["resources"].append({"path": "kaggle_utils", "description": "the code"}),
     "does not exist", "resources[3]", "is a folder"),
    ("dataset", lambda m: m["resources"].append(dict(m["resources"][0])), "specified more than once",
     "resources[3]", "listed twice"),
    ("kernel", lambda m: m.update(id="alice/flwr"), "at least five characters", "id", "at least 5"),
    ("kernel", lambda m: m.update(kernel_sources=["alice/port"]), "at least five characters", "kernel_sources",
     "at least 5"),
    ("kernel", lambda m: m.update(docker_image_pinning_type="pinned"), "docker_image_pinning_type must be",
     "docker_image_pinning_type", "original, latest"),
    ("kernel", lambda m: m.update(model_sources=["alice/efficientnetv2-jax/flax/tf-efficientnetv2-m"]),
     "must be specified in the form", "model_sources", "owner/model/framework/variation/VERSION"),
    ("kernel", lambda m: m.update(model_sources=["alice/efficientnetv2-jax/flax/tf-efficientnetv2-m/latest"]),
     "version-number must be an integer", "model_sources", "not a number"),
    ("kernel", lambda m: m.update(model_sources=["alice//flax/tf-efficientnetv2-m/1"]),
     "Invalid model instance version", "model_sources", "owner/model/framework/variation/VERSION"),
    # the rest of the client's rules
    ("kernel", lambda m: m.update(id="alice/flower-classification-on-tpu-with-jax/3"), "cannot contain a version",
     "id", "version"),
    ("kernel", lambda m: m.pop("id"), "ID or slug must be specified", "id", "missing"),
    ("kernel", lambda m: m.update(title="Flwr"), "Title must be at least five", "title", "at least 5"),
    ("kernel", lambda m: m.update(language="julia"), "valid language", "language", "one of python"),
    ("kernel", lambda m: m.update(kernel_type="dashboard"), "valid kernel type", "kernel_type", "'notebook'"),
    ("kernel", lambda m: m.update(code_file="missing.ipynb"), "Source file not found", "code_file", "does not exist"),
    ("kernel", lambda m: m.update(dataset_sources=["alice/kaggle-utils/3/4"]), "Invalid dataset specification",
     "dataset_sources", "owner/slug or owner/slug/VERSION"),
    ("kernel", lambda m: m.update(dataset_sources=["kaggle-utils"]), "must be specified in the form",
     "dataset_sources", "owner/slug"),
    ("kernel", lambda m: m.update(kernel_sources=["alice/port-pytorch/2/x"]), "must be specified in the form",
     "kernel_sources", "owner/slug"),
    ("kernel", lambda m: m.update(is_private="yes"), "Invalid boolean value", "is_private", "true or false"),
    ("dataset", lambda m: m.pop("licenses"), "Key licenses not found", "licenses", "missing"),
    ("dataset", lambda m: m.update(licenses=[{"name": "CC0-1.0"}, {"name": "apache-2.0"}]), "exactly one license",
     "licenses", "exactly one"),
    ("dataset", lambda m: m.update(title="Utils"), "title must be between 6 and 50", "title", "6-50"),
    ("dataset", lambda m: m.update(subtitle="too short"), "Subtitle length", "subtitle", "20-80"),
    ("dataset", lambda m: m["resources"].append({"path": "gone.bin"}), "does not exist", "resources[3]",
     "does not exist"),
    ("dataset", lambda m: m.update(id="alice/INSERT_SLUG_HERE"), "Default slug detected", "id", "placeholder"),
    ("model", lambda m: m.update(ownerSlug="Alice"), "Invalid owner slug", "ownerSlug", "lowercase"),
    ("model", lambda m: m.update(slug="efficientnetv2_jax"), "Invalid slug", "slug", "lowercase"),
    ("model", lambda m: m.update(isPrivate="true"), "isPrivate must be a boolean", "isPrivate", "true or false"),
    ("model", lambda m: m.update(publishTime="2026/11/30"), "does not match format", "publishTime", "YYYY-MM-DD"),
    ("model", lambda m: m.pop("description"), "Key description not found", "description", "missing"),
    ("model", lambda m: m.update(title="INSERT_TITLE_HERE"), "Default title detected", "title", "placeholder"),
    ("instance", lambda m: m.update(framework="flux"), "MODEL_FRAMEWORK_FLUX", "framework", "a framework"),
    ("instance", lambda m: m.update(licenseName=""), "specify a license", "licenseName", "a license name"),
    ("instance", lambda m: m.update(fineTunable="yes"), "fineTunable must be a boolean", "fineTunable",
     "true or false"),
    ("instance", lambda m: m.update(trainingData="flowers"), "trainingData must be a list", "trainingData", "a list"),
    ("instance", lambda m: m.update(modelInstanceType="Variant"), "MODEL_INSTANCE_TYPE_VARIANT", "modelInstanceType",
     "Unspecified"),
    ("instance", lambda m: m.update(instanceSlug="INSERT_INSTANCE_SLUG_HERE"), "Default instanceSlug",
     "instanceSlug", "placeholder"),
    ("instance", lambda m: m.pop("framework"), "Key framework not found", "framework", "missing"),
]


@pytest.mark.parametrize("kind, change, client_words, key, lint_words", REJECTED)
def test_each_rejection_of_the_client_is_a_lint_problem(tmp_path, built, kind, change, client_words, key, lint_words):
    (verdict, message), problems = client_and_lint(tmp_path, built, kind, change)
    assert verdict == "refused" and client_words in message, message
    assert any(p.key == key and lint_words in p.message for p in problems), problems


ACCEPTED = [  # what the client accepts, lint too: no rule stricter where the client is right
    ("kernel", lambda m: m.update(dataset_sources=["alice/kaggle-utils/3"])),
    ("kernel", lambda m: m.update(kernel_sources=["alice/port-pytorch-weights-to-flax/2"])),
    ("kernel", lambda m: m.update(model_sources=["alice/efficientnetv2-jax/flax/tf-efficientnetv2-m/12"])),
    ("kernel", lambda m: m.update(id="flower-classification-on-tpu-with-jax")),  # the client's user owns it
    ("kernel", lambda m: m.update(is_private="true", enable_tpu="TRUE")),
    ("kernel", lambda m: m.update(docker_image_pinning_type="latest")),
    ("dataset", lambda m: m.update(subtitle="")),
    ("dataset", lambda m: m.update(title="A" * 50, id="alice/" + "a" * 50)),
    ("model", lambda m: m.update(ownerSlug="alice_b", publishTime="2026-11-30")),
    ("instance", lambda m: m.update(framework="JAX")),
    ("instance", lambda m: m.update(framework="pyTorch", modelInstanceType="KaggleVariant")),
    ("instance", lambda m: m.update(framework="tensorFlow2", instanceSlug="b0_imagenet")),
]


@pytest.mark.parametrize("kind, change", ACCEPTED)
def test_what_the_client_accepts_lint_accepts(tmp_path, built, kind, change):
    (verdict, request), problems = client_and_lint(tmp_path, built, kind, change)
    assert verdict == "sent", request
    assert problems == []


def test_the_frameworks_are_the_clients(tmp_path):
    from kagglesdk.models.types.model_enums import ModelFramework, ModelInstanceType

    prefix = "MODEL_FRAMEWORK_"
    assert metadata.MODEL_FRAMEWORKS == tuple(m.removeprefix(prefix) for m in ModelFramework.__members__)
    assert metadata.MODEL_INSTANCE_TYPES == tuple(m.removeprefix("MODEL_INSTANCE_TYPE_")
                                                  for m in ModelInstanceType.__members__)
    with offline_client(tmp_path / "kaggle-config") as client:
        for name in ("flax", "Flax", "FLAX", "jax", "PyTorch", "pytorch", "py_torch", "TensorFlow2", "tensorflow2",
                     "tfLite", "MODEL_FRAMEWORK_ONNX", "scikitLearn", "flux", "Py Torch", "", "jax2"):
            try:
                client.api.lookup_enum(ModelFramework, None, name)
                accepted = True
            except KeyError:
                accepted = False
            assert rules.enum_name_ok(name, metadata.MODEL_FRAMEWORKS, prefix) is accepted, name
