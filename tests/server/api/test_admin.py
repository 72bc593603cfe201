"""app/server/api/admin.py: the admin token, missing 401, wrong 403, right (or none set) passes."""

from __future__ import annotations

import pytest

from app.errors import Forbidden, NormserveError, Unauthorized, status_for
from app.server.api.admin import check_token
from app.settings import Settings

TOKEN = Settings(admin_token="s3cret-token")


@pytest.mark.parametrize("header", [None, "", "Bearer s3cret-token", "Basic abc", "anything"])
def test_without_a_token_set_every_request_passes(header: str | None) -> None:
    check_token(header, Settings())


@pytest.mark.parametrize("header", ["Bearer s3cret-token", "bearer s3cret-token", "  Bearer s3cret-token  "])
def test_the_right_bearer_token_passes(header: str) -> None:
    check_token(header, TOKEN)


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Basic s3cret-token", "s3cret-token"])
def test_no_bearer_token_is_401(header: str | None) -> None:
    with pytest.raises(Unauthorized) as e:
        check_token(header, TOKEN)
    assert str(e.value) == "authorization: expected `Authorization: Bearer <token>` (NORMSERVE_ADMIN_TOKEN is set)"
    assert status_for(e.value, v2=True) == 401


@pytest.mark.parametrize("token", ["wrong", "s3cret-toke", "s3cret-token2", "S3CRET-TOKEN", "s3cret-tökén"])
def test_a_wrong_token_is_403_and_not_echoed(token: str) -> None:
    with pytest.raises(Forbidden) as e:
        check_token(f"Bearer {token}", TOKEN)
    assert str(e.value) == "authorization: wrong admin token"
    assert status_for(e.value, v2=True) == 403


def test_the_token_never_shows_in_the_settings_repr() -> None:
    assert "s3cret" not in repr(TOKEN) and "s3cret" not in str(TOKEN)
    assert isinstance(Unauthorized("x"), NormserveError)
