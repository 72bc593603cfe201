"""Fixtures of the cross-module suites: the serving image, built once per test session."""

from __future__ import annotations

import pytest

from tests.containers import build_image


@pytest.fixture(scope="session")
def image() -> str:
    """The image scripts/build-image.sh builds from this checkout (skips where neither podman nor docker is)."""
    tag, line = build_image()
    print(f"\n{line}")
    return tag
