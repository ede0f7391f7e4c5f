"""What Kaggle reads: slugs, titles, ``kernel-metadata.json`` and ``dataset-metadata.json`` of the
notebooks, the kit and the weights, and the notebook keys that pin an image."""
import html
import json
import re
import unicodedata
from pathlib import Path

from ..checkpoint import atomic_write_text, manifest_path
from ..runtime import BOOTSTRAP

REPO = Path(__file__).resolve().parents[2]
DEFAULT_USER = "kaggle-utils"  # placeholder owner; --user replaces it everywhere
COMPETITION = "tpu-getting-started"
TPU_SHAPE = "TpuV5E8"
FLOWER_NOTEBOOK = "04_flower_classification_tpu.ipynb"
ONLINE_NOTEBOOKS = ("03_port_pytorch_weights.ipynb",)  # fetches timm's pretrained weights from the hub
KIT_SLUG, KIT_TITLE = "kaggle-utils", "Kaggle Utils"
WEIGHTS_SLUG, WEIGHTS_TITLE = "efficientnetv2-jax", "EfficientNetV2 JAX"
KIT_PACKAGES = ("kaggle_utils", "weights_port")
KIT_FILES = {"README.md": "how to use the kit", "requirements.txt": "the tested versions",  # shipped beside the code
             "pyproject.toml": "pip install --no-deps --no-build-isolation ."}
KERNEL_METADATA, DATASET_METADATA = "kernel-metadata.json", "dataset-metadata.json"
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
KERNEL_BOOLEANS = ("is_private", "enable_gpu", "enable_tpu", "enable_internet")
CODE_SUFFIXES = {"notebook": (".ipynb",), "script": (".py", ".r", ".R", ".Rmd", ".rmd")}
LANGUAGES = ("python", "r", "rmarkdown")
SLUG_PATTERN = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
OWNER_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_KAGGLE_LICENSES = {"unknown": "unknown", "apache-2.0": "apache-2.0", "cc0-1.0": "CC0-1.0",
                    "cc-by-sa-4.0": "CC-BY-SA-4.0", "cc-by-nc-sa-4.0": "CC-BY-NC-SA-4.0", "gpl-2.0": "GPL-2.0"}


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


def kernel_metadata(notebook: str | Path, *, user: str = DEFAULT_USER, code_file: str | None = None) -> dict:
    """``kernel-metadata.json`` of one notebook: TPU + competition for the flower notebook, CPU
    for the rest; offline but for :data:`ONLINE_NOTEBOOKS`, no ``docker_image``, the kit and
    weights datasets attached."""
    notebook = Path(notebook)
    title = notebook_title(notebook)
    flower = notebook.name == FLOWER_NOTEBOOK
    return {
        "id": f"{user}/{slugify(title)}", "title": title, "code_file": code_file or notebook.name,
        "language": "python", "kernel_type": "notebook", "is_private": True, "enable_gpu": False,
        "enable_tpu": flower, "enable_internet": notebook.name in ONLINE_NOTEBOOKS,
        "dataset_sources": [f"{user}/{KIT_SLUG}", f"{user}/{WEIGHTS_SLUG}"],
        "competition_sources": [COMPETITION] if flower else [], "kernel_sources": [], "model_sources": [],
        **({"machine_shape": TPU_SHAPE} if flower else {}),
    }


def dataset_metadata_for_kit(user: str = DEFAULT_USER) -> dict:
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


def dataset_metadata_for_weights(manifests: dict[str, dict], user: str = DEFAULT_USER) -> dict:
    """Metadata of the weights dataset (``manifests``: file name -> manifest). Its license is the weights' own when
    all files agree on one Kaggle knows, else ``other`` (the description lists each file's)."""
    licenses = {str(m.get("pretrained_cfg", {}).get("license") or "unknown").lower() for m in manifests.values()}
    known = {_KAGGLE_LICENSES.get(lic) for lic in licenses}
    license_name = known.pop() if len(known) == 1 and None not in known else "other"
    lines = ["EfficientNet weights converted from timm to Flax by kaggle-utils' weights_port, each checked "
             "against timm's logits before it was written. Load with "
             "kaggle_utils.efficientnet.load_weights or efficientnet_v2_pretrained.\n"]
    resources = []
    for name, m in sorted(manifests.items()):
        lines.append(f"* {name}: {m.get('model')} ({m.get('source', 'unknown source')}), "
                     f"{m.get('num_classes', '?')} classes, max |logit diff| {m.get('max_abs_logit_diff', '?')}, "
                     f"license {m.get('pretrained_cfg', {}).get('license', 'unknown')}, sha256 {m.get('sha256')}")
        resources.append({"path": name, "description": f"{m.get('model')} variables (flax msgpack)"})
        resources.append({"path": manifest_path(name).name, "description": f"manifest of {name}"})
    return {
        "title": WEIGHTS_TITLE, "subtitle": "timm EfficientNet(V2) weights ported to Flax msgpack, verified",
        "description": "\n".join(lines) + "\n", "id": f"{user}/{WEIGHTS_SLUG}",
        "licenses": [{"name": license_name}], "resources": resources, "keywords": [],
    }


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
