"""``python -m kaggle_utils train|predict ...``: see :mod:`kaggle_utils.job`."""
from .job import main

raise SystemExit(main())
