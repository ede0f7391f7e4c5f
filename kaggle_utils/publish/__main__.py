"""``python -m kaggle_utils.publish package|lint``."""
from .cli import main

raise SystemExit(main())
