"""Masking the secrets a URL may carry, before it is logged, printed or put in an error message."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact_url"]

#: query parameters whose values are secrets in URLs people paste into config files
SECRET_QUERY_KEYS = ("token", "access_token", "api_key", "apikey", "key", "password", "secret", "sig", "signature")


def redact_url(value: Any) -> Any:
    """``value`` with the secrets a URL may carry masked as ``***`` (a password, a login with no
    password, which is then a token, secret-looking query parameters); other values unchanged."""
    if not isinstance(value, str) or "://" not in value:
        return value
    try:
        parts = urlsplit(value)
        login = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else None
    except ValueError:  # not a parsable URL: it may still hold a secret
        return "***"
    netloc = parts.netloc
    if login is not None:
        user, _, password = login.partition(":")
        masked = f"{user}:***" if password else "***"
        netloc = f"{masked}@{parts.netloc.rpartition('@')[2]}"
    pairs = [pair.partition("=") for pair in parts.query.split("&") if pair]
    secret = any(key.lower() in SECRET_QUERY_KEYS for key, _, _ in pairs)
    if login is None and not secret:
        return value  # rebuilding would also normalise it (sqlite:/// loses a slash)
    query = "&".join(f"{key}=***" if key.lower() in SECRET_QUERY_KEYS else key + sep + v for key, sep, v in pairs)
    return urlunsplit(parts._replace(netloc=netloc, query=query))
