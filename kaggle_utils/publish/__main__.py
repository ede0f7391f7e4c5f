"""``python -m kaggle_utils.publish package|lint``."""
from . import main

raise SystemExit(main())
