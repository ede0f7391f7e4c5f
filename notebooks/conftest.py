"""Notebooks 3 and 4 are executed by ``tests/test_kaggle_tree.py``, on a Kaggle file system where notebook 4 trains
from notebook 3's output as a user's would: run here on their own as well, each would run twice in every test run."""
collect_ignore = ["03_port_pytorch_weights.ipynb", "04_flower_classification_tpu.ipynb"]
