"""The rules of the four metadata files the kaggle client sends, each a function of one file's path.

Every rule the client applies before its first network call (kaggle 2.2.5: ``kernels_push``, ``dataset_create_new``
and ``dataset_create_version``, ``model_create_new``, ``model_instance_create``; tests/test_kaggle_packaging.py runs
the client on the same files), and the kit's own where a push the client accepts does something else: a title
whose slug is not the id's, a pinned ``docker_image`` with ``enable_tpu``, ``enable_internet`` left out or on with a
competition, ``c/`` / ``d/`` / URL source prefixes, a misspelt key. None stricter where the client is right: a
bare kernel slug (the client's user owns it), ``"true"`` for true, ``owner/slug/3`` version references pass.
"""
import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Sequence

from .metadata import (CODE_SUFFIXES, COMPETITION, DATASET_KEYS, DATASET_SLUG_LEN, DATASET_TITLE_LEN, INSTANCE_KEYS,
                       INSTANCE_METADATA, KERNEL_BOOLEANS, KERNEL_KEYS, KERNEL_METADATA, KERNEL_SLUG_MIN,
                       KERNEL_TITLE_MIN, LANGUAGES, MODEL_FRAMEWORKS, MODEL_INSTANCE_TYPES, MODEL_KEYS, MODEL_METADATA,
                       OWNER_PATTERN, OWNER_SLUG_PATTERN, PINNING_TYPES, PLACEHOLDERS, SLUG_PATTERN, SUBTITLE_LEN,
                       TPU_SHAPE, fold_ascii, slugify)


@dataclass(frozen=True)
class Problem:
    """One rule broken by one key of one file; ``fixed`` when ``lint(fix=True)`` repaired it."""

    file: str
    key: str
    message: str
    fixed: bool = False

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.message}" + (" (fixed)" if self.fixed else "")


class Found(list):
    """The problems of one file: ``found(key, message)`` adds one (and returns None: ``return found(...)``)."""

    def __init__(self, path: Path):
        super().__init__()
        self.file = str(path)

    def __call__(self, key: str, message: str, fixed: bool = False) -> None:
        self.append(Problem(self.file, key, message, fixed))


def read_json(path: Path, known: frozenset | None = None) -> tuple[Found, dict | None]:
    """The problems found so far and the parsed JSON object (None when there is none); keys outside
    ``known`` are problems."""
    found = Found(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return found, found("(file)", "does not exist")
    except (OSError, ValueError) as e:
        return found, found("(file)", f"not readable JSON: {e}")
    if not isinstance(data, dict):
        return found, found("(file)", f"holds a JSON {type(data).__name__}, not an object")
    for key in sorted(set(data) - known) if known else ():
        found(key, f"unknown key: Kaggle ignores it (misspelt?); known keys: {', '.join(sorted(known))}")
    return found, data


def _is_str_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def flag(value) -> bool | None:
    """A boolean as the client reads one (``true``/``false``, or those words in any case); None for anything else."""
    if isinstance(value, bool):
        return value
    return {"true": True, "false": False}.get(value.lower()) if isinstance(value, str) else None


def enum_name_ok(name, members: Sequence[str], prefix: str) -> bool:
    """Whether the client's ``lookup_enum`` resolves ``name`` (``Flax``, ``flax``, ``PyTorch``, ``pytorch``...)
    to one of ``members`` (kagglesdk's enum names without ``prefix``); it raises KeyError otherwise."""
    if not isinstance(name, str):
        return False
    snake = re.sub("([a-z0-9])([A-Z])", r"\1_\2", re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)).upper()
    full = {f"{prefix}{m}" for m in members}
    return snake in full or f"{prefix}{snake}" in full or \
        f"{prefix}{snake}".replace("_", "") in {m.replace("_", "") for m in full}


def _placeholder(found: Found, meta: dict, keys: Sequence[str]) -> None:
    for key in keys:
        if isinstance(meta.get(key), str) and any(p in meta[key] for p in PLACEHOLDERS):
            found(key, f"{meta[key]!r} is the template's placeholder (kaggle ... init writes it): the client "
                       "refuses it; give the real value")


def _check_values(found: Found, meta: dict, required: Sequence[str], rules: dict) -> None:
    """The ``required`` keys present, and every present key of ``rules`` passing its test."""
    for key in required:
        if key not in meta:
            found(key, "missing (the kaggle client refuses the file without it)")
    for key, (test, what) in rules.items():
        if key in meta and not test(meta[key]):
            found(key, f"must be {what}, got {meta[key]!r}")


def _length(low: int, high: int):
    return lambda v: isinstance(v, str) and low <= len(v) <= high


# key -> (test of a present value, what the value must be): each failed test is one problem of that key
_STRINGS = (_is_str_list, "a list of strings")
_TEXT = (lambda v: isinstance(v, str), "a string")
_BOOL = (lambda v: isinstance(v, bool), "true or false (a JSON boolean)")
_KERNEL_RULES = {
    "language": (lambda v: isinstance(v, str) and v in LANGUAGES, f"one of {', '.join(LANGUAGES)}"),
    "kernel_type": (lambda v: isinstance(v, str) and v in CODE_SUFFIXES, "'notebook' or 'script'"),
    "code_file": (lambda v: isinstance(v, str) and bool(v), "a file name"),
    "docker_image_pinning_type": (lambda v: v is None or v in PINNING_TYPES, f"one of {', '.join(PINNING_TYPES)}"),
    **{key: (lambda v: flag(v) is not None, "true or false") for key in KERNEL_BOOLEANS},
    **{key: _STRINGS for key in ("keywords", "competition_sources", "dataset_sources", "kernel_sources",
                                 "model_sources")},
}
_DATASET_RULES = {
    "title": (_length(*DATASET_TITLE_LEN), "{}-{} characters (the client's limit)".format(*DATASET_TITLE_LEN)),
    "subtitle": (lambda v: v in ("", None) or _length(*SUBTITLE_LEN)(v),
                 "{}-{} characters (the client's limit), or empty".format(*SUBTITLE_LEN)),
    "description": _TEXT,
    "licenses": (lambda v: isinstance(v, list) and len(v) == 1 and isinstance(v[0], dict)
                 and isinstance(v[0].get("name"), str) and bool(v[0]["name"]),
                 'exactly one license, e.g. [{"name": "apache-2.0"}]'),
    "resources": (lambda v: isinstance(v, list), "a list of {path, description}"),
    "keywords": _STRINGS,
}
_MODEL_RULES = {"title": (lambda v: isinstance(v, str) and bool(v.strip()), "a title"), "subtitle": _TEXT,
                "description": _TEXT, "isPrivate": _BOOL, "provenanceSources": _TEXT,
                "ownerSlug": (lambda v: isinstance(v, str) and OWNER_SLUG_PATTERN.fullmatch(v) is not None,
                              "a Kaggle user name as the client wants a Model's owner: lowercase letters and digits, "
                              "single '-' or '_' between them"),
                "slug": (lambda v: isinstance(v, str) and SLUG_PATTERN.fullmatch(v) is not None,
                         "lowercase letters and digits with single dashes between them (the client's rule)")}
_INSTANCE_RULES = {
    "framework": (lambda v: enum_name_ok(v, MODEL_FRAMEWORKS, "MODEL_FRAMEWORK_"),
                  "a framework the client knows, e.g. 'flax', 'jax', 'pyTorch', 'keras'"),
    "modelInstanceType": (lambda v: enum_name_ok(v, MODEL_INSTANCE_TYPES, "MODEL_INSTANCE_TYPE_"),
                          "Unspecified, BaseModel, KaggleVariant or ExternalVariant"),
    "licenseName": (lambda v: isinstance(v, str) and bool(v), "a license name, e.g. 'Apache 2.0'"),
    "fineTunable": _BOOL, "trainingData": (lambda v: isinstance(v, list), "a list"),
    "overview": _TEXT, "usage": _TEXT, "baseModelInstance": _TEXT, "externalBaseModelUrl": _TEXT,
    **{key: (lambda v: isinstance(v, str) and bool(v) and "/" not in v, "a slug (a non-empty name without '/')")
       for key in ("ownerSlug", "modelSlug", "instanceSlug")},
}


def _check_owner_slug(found: Found, key: str, value: str, owner: str | None, slug: str,
                      slug_len: tuple[int, int | None]) -> None:
    if owner is not None and not OWNER_PATTERN.fullmatch(owner):
        found(key, f"owner {owner!r} of {value!r} is not a Kaggle user name")
    if not SLUG_PATTERN.fullmatch(slug):
        found(key, f"slug {slug!r} of {value!r} is not lowercase letters, digits and single dashes")
    low, high = slug_len
    if len(slug) < low or high is not None and len(slug) > high:
        found(key, f"slug {slug!r} has {len(slug)} characters; the kaggle client wants "
                   + (f"{low}-{high}" if high is not None else f"at least {low}"))


def _check_kernel_id(found: Found, value) -> str | None:
    """A kernel's ``id``: ``owner/slug``, or a bare slug (the client's user owns it); returns the slug or None."""
    parts = value.split("/") if isinstance(value, str) else []
    if len(parts) == 3 and all(parts[:2]):
        return found("id", f"{value!r}: the kaggle client refuses a version in a kernel's id; give \"owner/slug\"")
    if not parts or len(parts) > 2 or not all(parts):
        return found("id", f"{value!r} is not \"owner/slug\"")
    _check_owner_slug(found, "id", value, parts[0] if len(parts) == 2 else None, parts[-1], (KERNEL_SLUG_MIN, None))
    return parts[-1]


def _check_title(found: Found, title, slug: str | None) -> None:
    if not isinstance(title, str) or len(title.strip()) < KERNEL_TITLE_MIN:
        return found("title", f"{title!r}: the kaggle client wants a title of at least {KERNEL_TITLE_MIN} characters")
    if any(ch.isalnum() and not fold_ascii(ch) for ch in title):
        found("title", f"{title!r} has letters Kaggle transliterates in ways this check cannot follow: use ASCII")
    expected = slugify(title)
    if slug is not None and expected != slug:
        found("title", f"{title!r} slugifies to {expected!r} but the id's slug is {slug!r}: Kaggle would create the "
                       f"kernel at .../{expected} and the id would name nothing; make the title slugify to the id")


# sources: key -> (segments a reference may have, the least length of its slug (the second), an example)
_SOURCES = {"dataset_sources": ((2, 3), 1, "owner/slug or owner/slug/VERSION"),
            "kernel_sources": ((2, 3), KERNEL_SLUG_MIN, "owner/slug or owner/slug/VERSION"),
            "model_sources": ((5,), 1, "owner/model/framework/variation/VERSION")}


def _check_sources(found: Found, meta: dict) -> None:
    """The sources' forms (their types are :data:`_KERNEL_RULES`'): the client's (segments, a kernel slug of at
    least 5, a Model's version a number) and the kit's (no URL or ``d/`` prefix, a version a number)."""
    strings = lambda key: meta[key] if _is_str_list(meta.get(key)) else []  # noqa: E731
    for source in strings("competition_sources"):
        if "/" in source or ":" in source:
            found("competition_sources", f"{source!r}: give the bare competition slug (e.g. {COMPETITION!r}), "
                                         "no 'c/' prefix or URL")
    for key, (counts, least, example) in _SOURCES.items():
        for source in strings(key):
            parts = source.split("/")
            url = ":" in source or "kaggle.com" in source or parts[0] in ("d", "k", "m", "code", "datasets", "models")
            if url or len(parts) not in counts or not all(parts):
                found(key, f"{source!r} is not {example!r} (no URL, no 'd/' prefix)")
            elif len(parts) > 2 and not parts[-1].isdigit():
                found(key, f"{source!r}: the version {parts[-1]!r} is not a number")
            elif len(parts[1]) < least:
                found(key, f"{source!r}: the kaggle client wants a kernel slug of at least {least} characters")


def _check_machine(found: Found, meta: dict) -> None:
    tpu, gpu = flag(meta.get("enable_tpu")) is True, flag(meta.get("enable_gpu")) is True
    if "docker_image" in meta:
        found("docker_image", "remove it: " + ("with enable_tpu the kernel silently runs on that (CPU) image, not on "
                                               "a TPU" if tpu else "it pins an old image; leave it out so Kaggle "
                                               "picks the current one"))
    if tpu and gpu:
        found("enable_tpu", "enable_tpu and enable_gpu are both true: choose one")
    shape = meta.get("machine_shape")
    if shape is None:
        if tpu:
            found("machine_shape", f"missing with enable_tpu: set it (e.g. {TPU_SHAPE!r})")
    elif not isinstance(shape, str) or not shape:
        found("machine_shape", f"{shape!r} is not a machine shape name")
    elif tpu and not shape.startswith("Tpu"):
        found("machine_shape", f"{shape!r} is not a TPU shape (e.g. {TPU_SHAPE!r}) but enable_tpu is true")
    elif gpu and not shape.startswith("Nvidia"):
        found("machine_shape", f"{shape!r} is not a GPU shape (e.g. 'NvidiaTeslaT4') but enable_gpu is true")
    elif not tpu and not gpu:
        found("machine_shape", f"{shape!r} without {'enable_tpu' if shape.startswith('Tpu') else 'enable_gpu'}: true")


TEMPLATE_NOTE = ("the repository's kernel-metadata.json is a template with no owner: `python -m kaggle_utils.publish "
                 "package OUT --public|--private` writes the copy to push")


def kernel_problems(path: Path, *, template: bool = False) -> tuple[Found, dict | None, str | None]:
    """The problems of one ``kernel-metadata.json``, its contents and its kernel type (when valid); ``template``:
    the repository's owner-less file, where the id and the visibility are left to ``package``."""
    found, meta = read_json(path, KERNEL_KEYS)
    if meta is None:
        return found, None, None
    _check_values(found, meta, ("title", "code_file", "language", "kernel_type"), _KERNEL_RULES)
    for key in ("id", "is_private") if template else ():
        if key in meta:
            found(key, f"set in the template: {TEMPLATE_NOTE}, which sets it")
    if "id" not in meta and "id_no" not in meta and not template:
        found("id", f"missing: the kaggle client refuses a kernel without an id; {TEMPLATE_NOTE}")
    slug = _check_kernel_id(found, meta["id"]) if "id" in meta else None
    if "title" in meta:
        _check_title(found, meta["title"], slug)
    internet = flag(meta.get("enable_internet"))
    if "enable_internet" not in meta:
        found("enable_internet", "missing: the kaggle CLI then turns internet ON; set it explicitly (false for a "
                                 "competition notebook)")
    elif internet is not False and meta.get("competition_sources"):
        found("enable_internet", "must be false with competition_sources: Kaggle does not accept submissions from "
                                 "notebooks with internet on")
    _check_machine(found, meta)
    _check_sources(found, meta)
    kernel_type = meta.get("kernel_type") if _KERNEL_RULES["kernel_type"][0](meta.get("kernel_type")) else None
    return found, meta, kernel_type


def dataset_problems(path: Path) -> Found:
    """Problems of one ``dataset-metadata.json``: ``datasets create``'s rules (which include ``version``'s)."""
    found, meta = read_json(path, DATASET_KEYS)
    if meta is None:
        return found
    _check_values(found, meta, ("title", "id", "licenses"), _DATASET_RULES)
    _placeholder(found, meta, ("id", "title"))
    parts = meta["id"].split("/") if isinstance(meta.get("id"), str) else None
    if "id" in meta and (parts is None or len(parts) != 2 or not all(parts)):
        found("id", f"{meta['id']!r} is not \"owner/slug\"")
    elif parts:
        _check_owner_slug(found, "id", meta["id"], parts[0], parts[1], DATASET_SLUG_LEN)
    seen = set()
    for i, res in enumerate(meta["resources"] if isinstance(meta.get("resources"), list) else []):
        if not isinstance(res, dict) or not isinstance(res.get("path"), str):
            found(f"resources[{i}]", f"{res!r} has no \"path\"")
        elif res["path"] in seen:
            found(f"resources[{i}]", f"path {res['path']!r} is listed twice (the client refuses it)")
        elif (path.parent / res["path"]).is_dir():
            found(f"resources[{i}]", f"path {res['path']!r} is a folder: the client lists files only (a folder "
                                     "uploads zipped with --dir-mode zip, unlisted)")
        elif not (path.parent / res["path"]).is_file():
            found(f"resources[{i}]", f"path {res['path']!r} does not exist beside the metadata")
        if isinstance(res, dict):
            seen.add(res.get("path"))
    return found


def model_problems(path: Path) -> Found:
    """Problems of one ``model-metadata.json`` (``kaggle models create -p DIR``)."""
    found, meta = read_json(path, MODEL_KEYS)
    if meta is None:
        return found
    _check_values(found, meta, ("ownerSlug", "slug", "title", "isPrivate", "description"), _MODEL_RULES)
    _placeholder(found, meta, ("ownerSlug", "slug", "title"))
    publish_time = meta.get("publishTime")
    if publish_time:
        try:
            datetime.strptime(publish_time, "%Y-%m-%d")
        except (TypeError, ValueError):
            found("publishTime", f"{publish_time!r} is not a date YYYY-MM-DD (or empty)")
    return found


def instance_problems(path: Path) -> Found:
    """Problems of one ``model-instance-metadata.json`` (``kaggle models instances create -p DIR``, which uploads
    every other file of DIR: a folder with none is a variation with nothing in it)."""
    found, meta = read_json(path, INSTANCE_KEYS)
    if meta is None:
        return found
    _check_values(found, meta, ("ownerSlug", "modelSlug", "instanceSlug", "framework", "licenseName"),
                  _INSTANCE_RULES)
    _placeholder(found, meta, ("ownerSlug", "modelSlug", "instanceSlug", "framework"))
    uploads = [p for p in path.parent.iterdir() if p.name not in (INSTANCE_METADATA, MODEL_METADATA, KERNEL_METADATA)
               and p.is_file()]
    if not uploads:
        found("(folder)", f"{path.parent} holds no file beside the metadata: the variation would be empty")
    return found
