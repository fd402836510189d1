"""Shared test setup. Fixtures from ../shared/fixtures are optional: corpus tests skip without them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OWN_FIXTURES = REPO / "tests" / "fixtures"
SHARED_FIXTURES = Path(os.environ.get("PODHEALTH_SHARED_FIXTURES", REPO.parent / "shared" / "fixtures"))
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture
def shared_fixtures() -> Path:
    """The real-capture corpus (../shared/fixtures); tests using it skip clearly when it is absent."""
    if not SHARED_FIXTURES.is_dir():
        pytest.skip(f"real-capture corpus not found at {SHARED_FIXTURES} (set PODHEALTH_SHARED_FIXTURES)")
    return SHARED_FIXTURES


@pytest.fixture
def own_fixtures() -> Path:
    return OWN_FIXTURES


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
