"""`redact_url` and `redact_text`: a server address keeps its shape and loses its secrets, whatever it is given."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from threadmill.redaction import MASK, redact_text, redact_url, url_secrets

SCHEMES = ["redis", "rediss", "valkey", "valkeys", "redis+sentinel", "unix"]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:secret@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:secret@h", "redis://:***@h"),
        ("rediss://u:p4ss@cache.example.com:6380/1", "rediss://u:***@cache.example.com:6380/1"),
        ("valkey://u:p4ss@h:1/0", "valkey://u:***@h:1/0"),
        ("valkeys://:p4ss@h", "valkeys://:***@h"),
        ("unix://:pw@/run/valkey.sock?db=0", "unix://:***@/run/valkey.sock?db=0"),
        ("unix:///run/valkey.sock?password=pw&db=0", "unix:///run/valkey.sock?password=***&db=0"),
        (
            "redis+sentinel://user:pass@h1:1,h2:2/service/0",
            "redis+sentinel://user:***@h1:1,h2:2/service/0",
        ),
        (
            "rediss://h:1/0?ssl_password=x&ssl_cert_reqs=none&AUTH_TOKEN=t;client_secret=s",
            "rediss://h:1/0?ssl_password=***&ssl_cert_reqs=none&AUTH_TOKEN=***;client_secret=***",
        ),
        ("redis://u:p%40ss@h/0", "redis://u:***@h/0"),
        ("redis://u:p@ss/with?raw@h:1/0", "redis://u:***@h:1/0"),
        ("redis://user@h:1/0", "redis://user@h:1/0"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://u:@h", "redis://u:***@h"),
        ("u:secret@h:1", "u:***@h:1"),
        ("", ""),
    ],
)
def test_a_url_keeps_its_shape_and_loses_its_secrets(url, shown):
    assert redact_url(url) == shown


def test_a_query_value_holding_an_at_sign_is_masked_past_rather_than_a_password_shown():
    assert redact_url("redis://u:pw@h/0?client_name=a@b") == "redis://u:***@b"


def test_input_that_is_not_text_comes_back_without_its_secret_and_without_an_error():
    assert "pw" not in redact_url(b"redis://u:pw@h")  # type: ignore[arg-type]
    assert redact_url(None) == "None"  # type: ignore[arg-type]


_user = st.text(st.characters(codec="ascii", exclude_characters=":@/?#&;=", min_codepoint=33), max_size=8)
_password = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1)
_host = st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True)


@given(st.sampled_from(SCHEMES), _user, _password, _host, st.integers(1, 65535), st.integers(0, 15))
def test_any_password_written_raw_or_quoted_is_masked_and_the_rest_kept(scheme, user, password, host, port, db):
    for written in (password, quote(password, safe="")):
        url = f"{scheme}://{user}:{written}@{host}:{port}/{db}?db={db}"
        assert redact_url(url) == f"{scheme}://{user}:{MASK}@{host}:{port}/{db}?db={db}"


@given(
    st.sampled_from(["password", "ssl_password", "Password", "auth_token", "secret", "sentinel_password"]), _password
)
def test_a_secret_query_parameter_is_masked(name, value):
    written = quote(value, safe="")
    assert redact_url(f"rediss://h:1/0?db=1&{name}={written}&x=y") == f"rediss://h:1/0?db=1&{name}={MASK}&x=y"


@given(st.text())
def test_junk_never_raises(text):
    assert isinstance(redact_url(text), str)
    assert isinstance(redact_text(text, [text]), str)
    assert isinstance(url_secrets(text), list)


@given(_password.filter(lambda p: len(p) >= 4 and p.strip() == p and p.isprintable()))
def test_redact_text_masks_a_url_in_a_message_and_its_password_anywhere_else(password):
    url = f"redis://deploy:{quote(password, safe='')}@h:1/0"
    text = f"Cannot reach {url}: it said {password!s} and {quote(password, safe='')}."
    shown = redact_text(text, [url])
    assert password not in shown and quote(password, safe="") not in shown
    assert shown.startswith("Cannot reach redis://deploy:***@h:1/0:")


def test_redact_text_masks_a_url_it_was_not_told_of():
    assert redact_text("at rediss://:hunter2@h:1/0, refused") == "at rediss://:***@h:1/0, refused"


def test_a_short_password_is_masked_in_its_url_but_not_wherever_its_letters_occur():
    assert redact_text("port 1 of redis://:p@h:1", ["redis://:p@h:1"]) == "port 1 of redis://:***@h:1"


def test_url_secrets_names_the_password_and_secret_parameters_both_as_written_and_decoded():
    assert url_secrets("redis://u:p%40ss@h/0?ssl_password=x&db=1") == ["p%40ss", "p@ss", "x"]
