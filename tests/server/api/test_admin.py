"""app/server/api/admin.py: closed without a configured token, missing 401, wrong 403, one value only."""

from __future__ import annotations

import pytest

from app.errors import Forbidden, NormserveError, Unauthorized, status_for
from app.server.api.admin import check_token
from app.settings import Settings

TOKEN = Settings(admin_token="s3cret-token")
MISSING = "authorization: expected `Authorization: Bearer <token>` (NORMSERVE_ADMIN_TOKEN is set)"
CLOSED = "authorization: the admin routes are closed: set NORMSERVE_ADMIN_TOKEN on the server to open them"


@pytest.mark.parametrize("values", [[], [""], ["Bearer s3cret-token"], ["Basic abc"], ["a", "b"]])
def test_without_a_token_set_every_request_is_403_naming_the_setting(values: list[str]) -> None:
    with pytest.raises(Forbidden) as e:
        check_token(values, Settings())
    assert (str(e.value), status_for(e.value, v2=True)) == (CLOSED, 403)


@pytest.mark.parametrize(
    "header", ["Bearer s3cret-token", "bearer s3cret-token", "  Bearer s3cret-token  ", "Bearer \ts3cret-token\r\n"]
)
def test_the_right_bearer_token_passes(header: str) -> None:
    check_token([header], TOKEN)


@pytest.mark.parametrize("values", [[], [""], ["Bearer"], ["Bearer "], ["Basic s3cret-token"], ["s3cret-token"]])
def test_no_bearer_token_is_401(values: list[str]) -> None:
    with pytest.raises(Unauthorized) as e:
        check_token(values, TOKEN)
    assert (str(e.value), status_for(e.value, v2=True)) == (MISSING, 401)


@pytest.mark.parametrize(
    "values",
    [["Bearer s3cret-token", "Bearer s3cret-token"], ["Bearer wrong", "Bearer s3cret-token"], ["", "", ""]],
    ids=["twice-right", "wrong-then-right", "three-empty"],
)
def test_more_than_one_authorization_value_is_401_whatever_they_hold(values: list[str]) -> None:
    with pytest.raises(Unauthorized) as e:
        check_token(values, TOKEN)
    assert str(e.value) == f"authorization: {len(values)} authorization values; {MISSING.split(': ', 1)[1]}"


@pytest.mark.parametrize("token", ["wrong", "s3cret-toke", "s3cret-token2", "S3CRET-TOKEN", "s3cret-tökén"])
def test_a_wrong_token_is_403_and_not_echoed(token: str) -> None:
    with pytest.raises(Forbidden) as e:
        check_token([f"Bearer {token}"], TOKEN)
    assert str(e.value) == "authorization: wrong admin token"
    assert status_for(e.value, v2=True) == 403


WRONG = ("authorization: wrong admin token", 403)


@pytest.mark.parametrize(
    ("header", "refusal"),
    [
        ("Bearer s3cret-token\xa0", WRONG),
        ("Bearer s3cret-token\x85", WRONG),
        ("Bearer \xa0s3cret-token", WRONG),
        ("\xa0Bearer s3cret-token", (MISSING, 401)),
    ],
    ids=["nbsp-after", "nel-after", "nbsp-before", "nbsp-first"],
)
def test_only_ascii_whitespace_surrounds_the_token(header: str, refusal: tuple[str, int]) -> None:
    """A value that an exact-match filter in front of the server sees as another token is another token."""
    with pytest.raises(NormserveError) as e:
        check_token([header], TOKEN)
    assert (str(e.value), status_for(e.value, v2=True)) == refusal


def test_the_token_never_shows_in_the_settings_repr() -> None:
    assert "s3cret" not in repr(TOKEN) and "s3cret" not in str(TOKEN)
    assert isinstance(Unauthorized("x"), NormserveError)
