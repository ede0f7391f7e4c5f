"""What Kaggle reads: slugs, titles, the owner, and the files the kaggle client sends: ``kernel-metadata.json`` of
the notebooks, ``dataset-metadata.json`` of the kit and the weights, ``model-metadata.json`` and
``model-instance-metadata.json`` of the weights as a Kaggle Model; and the notebook keys that pin an image.

The client's own limits (kaggle 2.2.5, ``kaggle/api/kaggle_api_extended.py``: ``kernels_push``,
``dataset_create_new``, ``model_create_new``, ``model_instance_create``) are the constants here, one source for
the lint and for the tests that run the real client against it.
"""
import html
import json
import os
import re
import sys
import unicodedata
from pathlib import Path

from ..checkpoint import atomic_write_text, manifest_path
from ..runtime import BOOTSTRAP

REPO = Path(__file__).resolve().parents[2]
COMPETITION = "tpu-getting-started"
TPU_SHAPE = "TpuV5E8"
FLOWER_NOTEBOOK = "04_flower_classification_tpu.ipynb"
PORT_NOTEBOOK = "03_port_pytorch_weights.ipynb"  # its output (the ported weights) is the flower notebook's input
ONLINE_NOTEBOOKS = (PORT_NOTEBOOK,)  # fetches timm's pretrained weights from the hub
KIT_SLUG, KIT_TITLE = "kaggle-utils", "Kaggle Utils"
WEIGHTS_SLUG, WEIGHTS_TITLE = "efficientnetv2-jax", "EfficientNetV2 JAX"  # the weights' dataset, or their Model
WEIGHTS_FRAMEWORK = "flax"  # the Model's framework (the client's ModelFramework.FLAX); it mounts as .../flax/VARIATION/N/
MODEL_FOLDER = f"{WEIGHTS_SLUG}-model"  # package's folder of the Model (a dataset of the same slug may sit beside it)
WEIGHTS_AS = ("dataset", "model")
KIT_PACKAGES = ("kaggle_utils", "weights_port")
KIT_FILES = {"README.md": "how to use the kit", "requirements.txt": "the tested versions",  # shipped beside the code
             "pyproject.toml": "pip install --no-deps --no-build-isolation ."}
KERNEL_METADATA, DATASET_METADATA = "kernel-metadata.json", "dataset-metadata.json"
MODEL_METADATA, INSTANCE_METADATA = "model-metadata.json", "model-instance-metadata.json"
# titles fix the slugs, hence the kernels' URLs: a notebook's heading can change without moving it
NOTEBOOK_TITLES = {
    "01_flax_model_surgery": "Flax Model Surgery",
    "02_efficientnetv2_in_flax": "EfficientNetV2 in Flax",
    "03_port_pytorch_weights": "Port PyTorch Weights to Flax",
    "04_flower_classification_tpu": "Flower Classification on TPU with JAX",
}
PINNED_NOTEBOOK_KEYS = ("dockerImageVersionId", "accelerator")  # under metadata.kaggle
KERNEL_KEYS = frozenset({
    "id", "id_no", "title", "code_file", "language", "kernel_type", "is_private", "enable_gpu", "enable_tpu",
    "enable_internet", "dataset_sources", "competition_sources", "kernel_sources", "model_sources", "keywords",
    "machine_shape", "docker_image", "docker_image_pinning_type"})
DATASET_KEYS = frozenset({"title", "subtitle", "description", "id", "id_no", "licenses", "resources", "keywords",
                          "collaborators", "isPrivate"})
MODEL_KEYS = frozenset({"ownerSlug", "slug", "title", "subtitle", "isPrivate", "description", "publishTime",
                        "provenanceSources"})
INSTANCE_KEYS = frozenset({"ownerSlug", "modelSlug", "instanceSlug", "framework", "overview", "usage", "licenseName",
                           "fineTunable", "trainingData", "modelInstanceType", "baseModelInstance",
                           "baseModelInstanceId", "externalBaseModelUrl"})
KERNEL_BOOLEANS = ("is_private", "enable_gpu", "enable_tpu", "enable_internet")
CODE_SUFFIXES = {"notebook": (".ipynb",), "script": (".py", ".r", ".R", ".Rmd", ".rmd")}
LANGUAGES = ("python", "r", "rmarkdown")
PINNING_TYPES = ("original", "latest")  # docker_image_pinning_type
KERNEL_SLUG_MIN, KERNEL_TITLE_MIN = 5, 5
DATASET_SLUG_LEN, DATASET_TITLE_LEN, SUBTITLE_LEN = (6, 50), (6, 50), (20, 80)
# kagglesdk's enums, as the client's lookup_enum resolves a name against them (a name it cannot resolve: KeyError)
MODEL_FRAMEWORKS = ("UNSPECIFIED", "TENSOR_FLOW_1", "TENSOR_FLOW_2", "TF_LITE", "TF_JS", "PY_TORCH", "JAX", "FLAX",
                    "PAX", "MAX_TEXT", "GEMMA_CPP", "GGML", "GGUF", "CORAL", "SCIKIT_LEARN", "MXNET", "ONNX", "KERAS",
                    "TRANSFORMERS", "API", "OTHER", "TENSOR_RT_LLM", "TRITON", "VLLM")
MODEL_INSTANCE_TYPES = ("UNSPECIFIED", "BASE_MODEL", "KAGGLE_VARIANT", "EXTERNAL_VARIANT")
# the templates `kaggle datasets init` / `models init` / `models instances init` write, which the client refuses
PLACEHOLDERS = ("INSERT_SLUG_HERE", "INSERT_TITLE_HERE", "INSERT_OWNER_SLUG_HERE", "INSERT_EXISTING_MODEL_SLUG_HERE",
                "INSERT_INSTANCE_SLUG_HERE", "INSERT_FRAMEWORK_HERE")
SLUG_PATTERN = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")  # the client's for a Model's slug; Kaggle's for every slug
OWNER_SLUG_PATTERN = re.compile(r"[a-z0-9]+(?:[_-][a-z0-9]+)*")  # the client's for a Model's ownerSlug
OWNER_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # an owner in a kernel or dataset id
_KAGGLE_LICENSES = {"unknown": "unknown", "apache-2.0": "apache-2.0", "cc0-1.0": "CC0-1.0",
                    "cc-by-sa-4.0": "CC-BY-SA-4.0", "cc-by-nc-sa-4.0": "CC-BY-NC-SA-4.0", "gpl-2.0": "GPL-2.0"}
_MODEL_LICENSES = {"apache-2.0": "Apache 2.0", "mit": "MIT"}  # a weights license -> a Kaggle Model's licenseName


class PackagingError(ValueError):
    """An input to ``package`` or ``lint`` is unusable; the message names the file and the reason."""


def fold_ascii(text: str) -> str:
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def slugify(text: str) -> str:
    """The slug Kaggle derives from a title (python-slugify's defaults), but non-Latin letters are dropped, not
    transliterated: why :func:`lint` asks for titles without them."""
    text = re.sub(r"'+", "-", text)  # quotes separate words
    text = fold_ascii(html.unescape(fold_ascii(text))).lower()  # accents fold, HTML entities decode
    text = re.sub(r"'+", "", text)  # a quote an entity decoded to joins
    text = re.sub(r"(?<=\d),(?=\d)", "", text)  # 1,000 -> 1000
    text = re.sub(r"[^-a-z0-9]+", "-", text)
    return re.sub(r"-{2,}", "-", text).strip("-")


def notebook_title(path: str | Path) -> str:
    """The Kaggle title of a notebook: from :data:`NOTEBOOK_TITLES`, else its file name
    (``05_my_idea.ipynb`` -> ``My idea``)."""
    stem = Path(path).stem
    if stem in NOTEBOOK_TITLES:
        return NOTEBOOK_TITLES[stem]
    words = re.sub(r"^\d+[_-]*", "", stem).replace("_", " ").replace("-", " ").strip() or stem
    return words[:1].upper() + words[1:]


def client_config_file() -> Path:
    """The ``kaggle.json`` the kaggle client reads: in ``$KAGGLE_CONFIG_DIR``, else ``~/.kaggle`` where that folder
    exists, else (Linux) ``$XDG_CONFIG_HOME/kaggle`` or ``~/.config/kaggle``."""
    folder = os.environ.get("KAGGLE_CONFIG_DIR")
    if folder:
        return Path(folder) / "kaggle.json"
    home = Path.home() / ".kaggle"
    if sys.platform.startswith("linux") and not home.exists():
        return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "kaggle" / "kaggle.json"
    return home / "kaggle.json"


def kaggle_owner(user: str | None = None) -> tuple[str, str]:
    """``(owner, where it came from)`` of everything ``package`` writes: ``user`` (``--user``), else the kaggle
    client's own configuration, which the uploads will run under: ``KAGGLE_USERNAME`` (which wins in the client
    too), else ``username`` in :func:`client_config_file`. No placeholder: an owner nobody named is an error."""
    if user is not None:
        found = user, "--user"
    elif os.environ.get("KAGGLE_USERNAME"):
        found = os.environ["KAGGLE_USERNAME"], "KAGGLE_USERNAME"
    else:
        path = client_config_file()
        try:
            name = json.loads(path.read_text(encoding="utf-8")).get("username")
        except FileNotFoundError:
            name = None
        except (OSError, ValueError, AttributeError) as e:
            raise PackagingError(f"{path}: the kaggle client's configuration is not readable JSON ({e}); fix it or "
                                 "give --user") from None
        if not isinstance(name, str) or not name:
            raise PackagingError(f"no Kaggle owner: give --user YOUR_KAGGLE_NAME, or set up the kaggle client "
                                 f"(KAGGLE_USERNAME, or {path} from kaggle.com/settings, API, 'Create New Token'), "
                                 "whose user name is then the owner")
        found = name, str(path)
    if not OWNER_SLUG_PATTERN.fullmatch(found[0]):
        raise PackagingError(f"{found[1]}: {found[0]!r} is not a Kaggle user name as ids spell it (lowercase "
                             "letters, digits, single '-' or '_', as in kaggle.com/NAME)")
    return found


def variation_slug(model: str) -> str:
    """The Model variation (instance) of one ported model's weights: ``tf_efficientnetv2_m`` -> ``tf-efficientnetv2-m``."""
    return slugify(model)


def weights_sources(user: str, weights_as: str | None = None, variations=()) -> dict[str, list[str]]:
    """Where a notebook finds ported weights: the port notebook's output when none are published (``weights_as``
    None), else the weights dataset, or version 1 (what ``models instances create`` makes) of each variation of the
    weights Model."""
    port = f"{user}/{slugify(notebook_title(PORT_NOTEBOOK))}"
    return {"dataset_sources": [f"{user}/{KIT_SLUG}"] + ([f"{user}/{WEIGHTS_SLUG}"] if weights_as == "dataset" else []),
            "kernel_sources": [] if weights_as else [port],
            "model_sources": [f"{user}/{WEIGHTS_SLUG}/{WEIGHTS_FRAMEWORK}/{v}/1" for v in variations]
            if weights_as == "model" else []}


def kernel_metadata(notebook: str | Path, *, user: str | None, public: bool | None, code_file: str | None = None,
                    weights_as: str | None = None, variations=()) -> dict:
    """``kernel-metadata.json`` of one notebook: TPU + competition for the flower notebook, CPU for the rest; offline
    but for :data:`ONLINE_NOTEBOOKS`, no ``docker_image``; the kit attached, and the weights (:func:`weights_sources`)
    to every notebook but the port's, which makes them. ``user`` and ``public`` None: the template (the repository's
    top-level file), with no owner and no visibility, which the client refuses to push (no ``id``)."""
    notebook = Path(notebook)
    title = notebook_title(notebook)
    flower, port = notebook.name == FLOWER_NOTEBOOK, notebook.name == PORT_NOTEBOOK
    sources = {} if user is None else (
        {"dataset_sources": [f"{user}/{KIT_SLUG}"], "kernel_sources": [], "model_sources": []} if port
        else weights_sources(user, weights_as, variations))
    return {
        **({} if user is None else {"id": f"{user}/{slugify(title)}"}), "title": title,
        "code_file": code_file or notebook.name, "language": "python", "kernel_type": "notebook",
        **({} if public is None else {"is_private": not public}), "enable_gpu": False, "enable_tpu": flower,
        "enable_internet": notebook.name in ONLINE_NOTEBOOKS, "competition_sources": [COMPETITION] if flower else [],
        **sources, **({"machine_shape": TPU_SHAPE} if flower else {}),
    }


def dataset_metadata_for_kit(user: str) -> dict:
    description = (
        "The kaggle-utils kit: EfficientNet / EfficientNetV2 in JAX/Flax matching timm, the timm -> Flax "
        "weight porter, TFRecord input pipelines and multi-device training for Kaggle TPUs and GPUs.\n\n"
        "Attach this dataset to a notebook and start it with:\n\n```python\n" + BOOTSTRAP + "```\n")
    return {
        "title": KIT_TITLE, "subtitle": "EfficientNet(V2) in JAX/Flax, TFRecord input, TPU/GPU training",
        "description": description, "id": f"{user}/{KIT_SLUG}", "licenses": [{"name": "apache-2.0"}],
        "resources": [{"path": name, "description": desc} for name, desc in KIT_FILES.items()],
        "keywords": [],
    }


def _license(manifest: dict) -> str:
    return str(manifest.get("pretrained_cfg", {}).get("license") or "unknown").lower()


def _weights_lines(manifests: dict[str, dict]) -> list[str]:
    """The description of ported weights files: what each holds, its check against timm, license and digest."""
    lines = ["EfficientNet weights converted from timm to Flax by kaggle-utils' weights_port, each checked "
             "against timm's logits before it was written. Load with "
             "kaggle_utils.efficientnet.load_weights or efficientnet_v2_pretrained; kaggle_utils.runtime.setup() "
             "finds them where Kaggle mounts them.\n"]
    for name, m in sorted(manifests.items()):
        lines.append(f"* {name}: {m.get('model')} ({m.get('source', 'unknown source')}), "
                     f"{m.get('num_classes', '?')} classes, max |logit diff| {m.get('max_abs_logit_diff', '?')}, "
                     f"license {_license(m)}, sha256 {m.get('sha256')}")
    return lines


def dataset_metadata_for_weights(manifests: dict[str, dict], user: str) -> dict:
    """Metadata of the weights dataset (``manifests``: file name -> manifest). Its license is the weights' own when
    all files agree on one Kaggle knows, else ``other`` (the description lists each file's)."""
    known = {_KAGGLE_LICENSES.get(_license(m)) for m in manifests.values()}
    license_name = known.pop() if len(known) == 1 and None not in known else "other"
    resources = []
    for name, m in sorted(manifests.items()):
        resources.append({"path": name, "description": f"{m.get('model')} variables (flax msgpack)"})
        resources.append({"path": manifest_path(name).name, "description": f"manifest of {name}"})
    return {
        "title": WEIGHTS_TITLE, "subtitle": "timm EfficientNet(V2) weights ported to Flax msgpack, verified",
        "description": "\n".join(_weights_lines(manifests)) + "\n", "id": f"{user}/{WEIGHTS_SLUG}",
        "licenses": [{"name": license_name}], "resources": resources, "keywords": [],
    }


def model_metadata(user: str, public: bool) -> dict:
    """``model-metadata.json`` of the weights Model (``kaggle models create -p DIR``); its variations carry the files."""
    return {"ownerSlug": user, "slug": WEIGHTS_SLUG, "title": WEIGHTS_TITLE,
            "subtitle": "timm EfficientNet(V2) weights ported to Flax msgpack, verified", "isPrivate": not public,
            "description": "EfficientNet and EfficientNetV2 weights converted from timm (PyTorch) to Flax variables by "
                           "kaggle-utils' weights_port, one variation per model, each checked against timm's logits "
                           "before it was written.\n", "publishTime": "", "provenanceSources": ""}


def instance_metadata(user: str, variation: str, manifests: dict[str, dict]) -> dict:
    """``model-instance-metadata.json`` of one variation (``kaggle models instances create -p DIR``: every other
    file in DIR is uploaded). Its license is the weights' own, which must be one a Kaggle Model names."""
    licenses = {_license(m) for m in manifests.values()}
    if len(licenses) != 1 or next(iter(licenses)) not in _MODEL_LICENSES:
        raise PackagingError(f"the weights of variation {variation!r} carry the license(s) {', '.join(sorted(licenses))}"
                             f"; a Kaggle Model here names one of {', '.join(sorted(_MODEL_LICENSES))}: publish them "
                             "as a dataset (--weights-as dataset), whose description lists each file's license")
    mount = f"/kaggle/input/{WEIGHTS_SLUG}/{WEIGHTS_FRAMEWORK}/{variation}/VERSION"
    usage = (f"Attach the variation to a notebook: Kaggle mounts it at {mount}/ (or under /kaggle/input/models/OWNER/"
             f"...), where kaggle_utils.runtime.setup() finds the weights by their manifest.\n\n"
             + "\n".join(_weights_lines(manifests)) + "\n")
    return {"ownerSlug": user, "modelSlug": WEIGHTS_SLUG, "instanceSlug": variation, "framework": WEIGHTS_FRAMEWORK,
            "overview": f"{variation}: Flax msgpack variables and their manifest", "usage": usage,
            "licenseName": _MODEL_LICENSES[licenses.pop()], "fineTunable": True, "trainingData": [],
            "modelInstanceType": "Unspecified", "baseModelInstance": "", "externalBaseModelUrl": ""}


def strip_pinned_image(notebook: dict) -> list[str]:
    """Removes ``metadata.kaggle.{dockerImageVersionId,accelerator}`` in place (pushed with them, the kernel keeps
    the image it last ran on, even with ``enable_tpu``); returns what it removed."""
    kaggle_meta = notebook.get("metadata", {}).get("kaggle")
    if not isinstance(kaggle_meta, dict):
        return []
    removed = [k for k in PINNED_NOTEBOOK_KEYS if k in kaggle_meta]
    for k in removed:
        del kaggle_meta[k]
    return [f"metadata.kaggle.{k}" for k in removed]


def write_json(path: Path, data: dict, *, indent: int = 2) -> None:
    atomic_write_text(path, json.dumps(data, indent=indent, ensure_ascii=False) + "\n")
