import pathlib

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ROOT / "configs" / "models"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
