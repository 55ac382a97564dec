"""Shared fixtures. Data: ``LAZYKERN_DATA`` if set, else ``../shared/uci`` beside the checkout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def uci_data_dir() -> Path:
    return Path(os.environ.get("LAZYKERN_DATA", ROOT.parent / "shared" / "uci"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = uci_data_dir()
    if not (path / "pol" / "data.csv.gz").exists():
        pytest.skip(f"UCI data not found at {path} (set LAZYKERN_DATA to the uci_datasets folder)")
    return path


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
