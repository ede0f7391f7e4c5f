"""The 104 class names of the flower competition by class id, from its tutorial's list (``flower_classes.json``,
verbatim: ids 87 and 90 end in a space, which :func:`flower_class_names` strips for display)."""

import json
from pathlib import Path

FLOWER_NUM_CLASSES = 104
_NAMES_FILE = Path(__file__).with_name("flower_classes.json")


def flower_class_names(*, strip: bool = True) -> list[str]:
    """Names by class id; ``strip=False`` returns the original strings (two end in a space)."""
    names = json.loads(_NAMES_FILE.read_text())
    if len(names) != FLOWER_NUM_CLASSES:
        raise ValueError(f"{_NAMES_FILE} lists {len(names)} names, expected {FLOWER_NUM_CLASSES}")
    return [n.strip() for n in names] if strip else names
