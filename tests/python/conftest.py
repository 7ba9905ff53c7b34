import os
import pathlib

import pytest

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="session")
def data_dir():
    return DATA


def torch_or_skip():
    """torch when importable; the test is reported as skipped otherwise (never silently passed)."""
    return pytest.importorskip("torch", reason="torch is not installed: the torch-input variant is skipped")
