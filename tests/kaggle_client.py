"""The real kaggle client (kaggle 2.2.5, a test tool pinned in requirements*.txt) on a folder, with the network cut.

The client validates a folder's metadata before its first network call. Here every way out is stopped: its API
client is a stand-in that records the request the client built and raises :class:`ReachedNetwork` when it would
send it, uploads are recorded (``uploads``), the dataset-exists probe says "not found", and any socket connect
fails the test (``connects`` stays empty). A verdict is ``("sent", request)`` (every check passed) or
``("refused", message)``.
"""
import contextlib
import os
import socket
import sys
from pathlib import Path

import pytest


class ReachedNetwork(Exception):
    """The client passed its checks and called the API with ``request``; nothing was sent."""

    def __init__(self, request):
        super().__init__("the kaggle client would send its request now")
        self.request = request


class _StandInClient:
    """What ``KaggleApi.build_kaggle_client`` returns here: any attribute path ends in a call that raises."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getattr__(self, name):
        return self

    def __call__(self, request=None, *args, **kwargs):
        raise ReachedNetwork(request)


class OfflineClient:
    """``KaggleApi`` with the network cut (see the module docstring); ``uploads``: the file names it would upload."""

    def __init__(self, api, connects: list, uploads: list):
        self.api, self.connects, self.uploads = api, connects, uploads

    def verdict(self, method: str, *args, **kwargs) -> tuple[str, object]:
        try:
            getattr(self.api, method)(*args, **kwargs)
        except ReachedNetwork as sent:
            return "sent", sent.request
        except Exception as refused:  # noqa: BLE001 (ValueError mostly; KeyError for an unknown enum name)
            return "refused", f"{type(refused).__name__}: {refused}"
        raise AssertionError(f"{method} returned without reaching the network")

    def push(self, folder: Path):
        return self.verdict("kernels_push", str(folder))

    def create_dataset(self, folder: Path, *, public: bool = False, dir_mode: str = "skip"):
        return self.verdict("dataset_create_new", str(folder), public=public, quiet=True, dir_mode=dir_mode)

    def version_dataset(self, folder: Path, *, dir_mode: str = "skip"):
        return self.verdict("dataset_create_version", str(folder), "a note", quiet=True, dir_mode=dir_mode)

    def create_model(self, folder: Path):
        return self.verdict("model_create_new", str(folder))

    def create_instance(self, folder: Path, *, dir_mode: str = "skip"):
        return self.verdict("model_instance_create", str(folder), quiet=True, dir_mode=dir_mode)


@contextlib.contextmanager
def offline_client(config_dir: Path, user: str = "alice"):
    """The client as ``user`` with a fake key (its configuration folder: ``config_dir``, set before its first
    import, which authenticates and makes that folder); yields an :class:`OfflineClient`. Asserts no socket was
    opened."""
    connects, uploads = [], []

    def refuse_connect(sock, address, *args):
        connects.append(address)
        raise OSError(f"the test cut the network: connect to {address}")

    def record_upload(self, path, *args, **kwargs):
        uploads.append(os.path.basename(path))
        return f"token-{len(uploads)}"

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KAGGLE_CONFIG_DIR", str(config_dir))
        patch.setenv("KAGGLE_USERNAME", user)
        patch.setenv("KAGGLE_KEY", "not-a-key")
        patch.setattr(socket.socket, "connect", refuse_connect)
        try:  # a test tool, pinned in requirements.txt and requirements-kaggle-gpu.txt: missing is a failure
            from kaggle.api import kaggle_api_extended as kaggle_api
        except ImportError as err:
            raise AssertionError("the kaggle client is not installed: pip install kaggle==2.2.5 six (requirements.txt)"
                                 ) from err
        from requests.exceptions import HTTPError

        patch.setattr(kaggle_api.KaggleApi, "build_kaggle_client", lambda self: _StandInClient())
        patch.setattr(kaggle_api.KaggleApi, "dataset_status",
                      lambda self, *a, **k: (_ for _ in ()).throw(HTTPError("404: no such dataset (stand-in)")))
        patch.setattr(kaggle_api.KaggleApi, "_upload_blob", record_upload)
        api = kaggle_api.KaggleApi()
        api.config_values = {"username": user, "key": "not-a-key"}
        yield OfflineClient(api, connects, uploads)
    assert connects == [], f"the kaggle client tried to connect to {connects}"
    assert "kaggle" not in sys.modules or sys.modules["kaggle"].__version__ == "2.2.5"
