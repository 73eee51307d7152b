"""A PostgreSQL ledger's URL: which ledger it names, how it is shown, and the secrets that are never shown.

``postgresql://USER@HOST:PORT/DB?ledger=NAME`` names the ledger ``NAME`` (default ``ledger``) in database ``DB``:
its shareable schema ``NAME`` and its confidential schema ``NAME_confidential``.  Only the URL, libpq's ``PG*``
environment variables and its service and password files say how to connect.  The ``ledger`` query parameter
is removed before connecting; the password (in the URL's user part or a ``password`` parameter) appears in no
error message, no shown location, no ``repr`` and nothing stored in the ledger (:func:`parse_url`,
:func:`scrub_secrets`).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from pate_accountant._ledger.errors import LedgerError

#: URL schemes routed to the PostgreSQL store by :meth:`Ledger.open`.
URL_SCHEMES = ("postgresql://", "postgres://")
#: The ledger name when the URL has no ``ledger`` parameter.
DEFAULT_LEDGER_NAME = "ledger"
#: A ledger name: a lower-case SQL identifier short enough for ``NAME_confidential`` (PostgreSQL: 63 bytes).
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,49}")
#: The suffix of every ledger's confidential schema: ``NAME_confidential``.
_CONF_SUFFIX = "_confidential"


def is_postgres_url(location) -> bool:
    return isinstance(location, str) and location.startswith(URL_SCHEMES)


def url_secrets(url: str) -> tuple:
    """What of ``url`` must never be shown: its password (the user part's, raw and decoded, and a ``password``
    parameter's), longest first."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL (an unbalanced IPv6 bracket): whatever follows "//" up to "@" may be a password
        userinfo = url.split("://", 1)[-1].rpartition("@")[0]
        password = userinfo.partition(":")[2]
        return tuple(sorted({p for p in (password, unquote(password)) if p}, key=len, reverse=True))
    secrets = [value for key, value in parse_qsl(parts.query, keep_blank_values=True) if key == "password"]
    if "@" in parts.netloc:
        _user, colon, password = parts.netloc.rsplit("@", 1)[0].partition(":")
        if colon:
            secrets += [password, unquote(password)]
    return tuple(sorted({s for s in secrets if s}, key=len, reverse=True))


def scrub_secrets(text, secrets) -> str:
    """``text`` with each of ``secrets`` replaced by ``***``."""
    text = str(text)
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def parse_url(url: str) -> tuple[str, str, str, tuple]:
    """``(conninfo, ledger name, shown location, secrets)``: the URL to connect with (the ``ledger`` parameter
    removed), the ledger's name, the URL as messages show it (no password anywhere) and the secrets that must
    never be shown (the password, raw and decoded)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unbalanced IPv6 bracket
        raise LedgerError(f"not a valid PostgreSQL ledger URL ({exc}; an IPv6 host goes in brackets: "
                          "postgresql://USER@[::1]:5432/DB)") from None
    query = parse_qsl(parts.query, keep_blank_values=True)
    names = [value for key, value in query if key == "ledger"]
    netloc = parts.netloc
    shown_netloc = netloc
    if "@" in netloc:
        userinfo, hosts = netloc.rsplit("@", 1)
        shown_netloc = f"{userinfo.partition(':')[0]}@{hosts}"
    secrets = url_secrets(url)
    if len(names) > 1:
        raise LedgerError("a PostgreSQL ledger URL names one ledger: give the ledger parameter once")
    name = names[0] if names else DEFAULT_LEDGER_NAME
    if not _NAME.fullmatch(name) or name.startswith("pg_") or name.endswith(_CONF_SUFFIX):
        raise LedgerError(f"invalid ledger name {name!r} in a PostgreSQL ledger URL: use 1 to 50 lower-case letters, "
                          "digits and underscores, starting with a letter or underscore (and not with 'pg_'; not "
                          f"ending with '{_CONF_SUFFIX}', the suffix of every ledger's confidential schema)")
    rest = [(key, value) for key, value in query if key != "ledger"]
    conninfo = _join(parts.scheme, netloc, parts.path, urlencode(rest))
    shown_query = urlencode([(key, value) for key, value in rest if key != "password"] + [("ledger", name)])
    shown = _join(parts.scheme, shown_netloc, parts.path, shown_query)
    return conninfo, name, shown, secrets


def _join(scheme: str, netloc: str, path: str, query: str) -> str:
    """A URL from its parts, keeping the ``//`` of an empty host (``postgresql:///?service=NAME``: libpq's service
    file names the server), which :func:`urllib.parse.urlunsplit` drops and libpq then cannot read."""
    return f"{scheme}://{netloc}{path}" + (f"?{query}" if query else "")
