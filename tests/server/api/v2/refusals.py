"""The whole message a V2 rule refuses its arguments with."""

from __future__ import annotations

from typing import Any

import pytest

from app.errors import InvalidInput


def refused(fn: Any, *args: Any) -> str:
    with pytest.raises(InvalidInput) as e:
        fn(*args)
    return e.value.message
