"""Fixtures of the cross-module suites: the serving image, built once per test session."""

from __future__ import annotations

import pytest

from tests.containers import build_image


@pytest.fixture(scope="session")
def built() -> tuple[str, str]:
    """scripts/build-image.sh run on this checkout (skips where neither podman nor docker is): the image's tag and
    the script's last line."""
    tag, line = build_image()
    print(f"\n{line}")
    return tag, line


@pytest.fixture(scope="session")
def image(built: tuple[str, str]) -> str:
    return built[0]
