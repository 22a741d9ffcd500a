"""Server addresses without their secrets: what every message, log record, page and command shows of a REDIS_URL.

Invariant: nothing this module returns contains the password of a URL it was given, nor the
value of a query parameter whose name says it is secret. It never raises: input it cannot
read comes back as `MASK`. Over-masking is the price of that (a query value holding `@` can
hide the host); showing a secret never is. Ground floor: it imports nothing from threadmill.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote

#: What a secret is replaced with.
MASK = "***"
#: A query parameter is secret when its name, lower-cased, contains one of these.
SECRET_PARAMETER_WORDS = ("password", "secret", "token")
#: A secret shorter than this is masked only inside a URL, not wherever its letters occur in a text: a
#: password "p" would otherwise garble every message, and four letters in passing name nothing.
MIN_LOOSE_SECRET_CHARS = 4
#: A URL inside free text (an exception's message): a scheme, `://`, then up to white space or a quote.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")


def redact_url(url: str) -> str:
    """Return `url` with its password and secret query parameters replaced by `MASK`; `MASK` for unreadable input."""
    try:
        return _redact(url if isinstance(url, str) else str(url))
    except Exception:  # noqa: BLE001 - whatever the input, the caller gets a printable answer without a secret
        return MASK


def url_secrets(url: str) -> list[str]:
    """Return the secrets `url` holds, as written and percent-decoded, longest first."""
    try:
        _, userinfo, rest = _split(url)
        found = [userinfo.partition(":")[2]] if ":" in userinfo else []
        found += [value for name, value in _parameters(rest) if _is_secret(name)]
    except Exception:  # noqa: BLE001 - unreadable input holds nothing we can name
        return []
    return sorted(
        {form for secret in found if secret for form in (secret, unquote(secret)) if form}, key=len, reverse=True
    )


def redact_text(text: str, urls: Iterable[str] = ()) -> str:
    """Return `text` (a driver's message, say) with every URL in it redacted and the secrets of `urls` masked.

    A secret of `urls` is masked wherever it occurs, URL or not, if at least `MIN_LOOSE_SECRET_CHARS` long.
    """
    try:
        text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), str(text))
        loose = {s for url in urls for s in url_secrets(url) if len(s) >= MIN_LOOSE_SECRET_CHARS}
        for secret in sorted(loose, key=len, reverse=True):
            text = text.replace(secret, MASK)
    except Exception:  # noqa: BLE001 - as redact_url
        return MASK
    return text


def _split(url: str) -> tuple[str, str, str]:
    """Split `url` into its scheme with `://`, its userinfo (before the last `@`), and the rest."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    else:
        scheme += separator
    # The last `@`: a password written with a raw `@`, `/` or `?` in it stays inside the userinfo.
    userinfo, at, after = rest.rpartition("@")
    return (scheme, userinfo, after) if at else (scheme, "", rest)


def _parameters(rest: str) -> list[tuple[str, str]]:
    query = rest.partition("?")[2]
    return [(name, value) for name, _, value in (pair.partition("=") for pair in re.split(r"[&;]", query)) if query]


def _is_secret(name: str) -> bool:
    lowered = unquote(name).lower()
    return any(word in lowered for word in SECRET_PARAMETER_WORDS)


def _redact(url: str) -> str:
    scheme, userinfo, rest = _split(url)
    if userinfo:
        user, colon, _ = userinfo.partition(":")
        userinfo = f"{user}{colon}{MASK if colon else ''}@"
    address, question, query = rest.partition("?")
    if question:
        pairs = (pair.partition("=") for pair in re.split(r"([&;])", query))
        query = "".join(f"{name}{eq}{MASK if eq and _is_secret(name) else value}" for name, eq, value in pairs)
    return f"{scheme}{userinfo}{address}{question}{query}"
