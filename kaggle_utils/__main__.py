"""``python -m kaggle_utils train|predict ...``: see :mod:`kaggle_utils.job`."""
import os

# Before anything imports TensorFlow: its C++ start-up INFO lines (CPU features, oneDNN) are noise in the job's log.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from .job import main  # noqa: E402

raise SystemExit(main())
