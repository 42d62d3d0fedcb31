from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("VITKIT_FIXTURES", REPO.parent / "shared" / "fixtures" / "official"))


@pytest.fixture(scope="session")
def fixtures() -> Path:
    if not FIXTURES.is_dir():
        pytest.skip(f"official fixtures not found at {FIXTURES} (set VITKIT_FIXTURES)")
    return FIXTURES
