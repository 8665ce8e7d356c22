"""The text forms every fencecheck host shares (as host/runtime/src/text.rs):
tokens, signed tokens and key sets, for configuration files, command lines,
SQL arguments and HTTP headers.

- A token: ``EPOCH.COUNTER`` (authority 0) or ``AUTHORITY:EPOCH.COUNTER``,
  each part a decimal u64 (ASCII digits only: no sign, no spaces).
- A signed token: ``TOKEN~KEY-ID~LEASE~TAG``: the key id a decimal u32, the
  lease id (UTF-8) and the tag base64url without padding, canonical (no
  ``=``, ``+`` or ``/``, no non-zero trailing bits), so each value has one
  spelling. Parsing checks the form only: whether the signature is valid, and
  whether the lease id and tag have usable lengths, is the component's
  decision (``Unauthenticated``, ``malformed-signature``).
- A key set: ``KEY-ID:SECRET-HEX`` entries separated by commas or newlines;
  blank entries and lines starting with ``#`` are skipped. Parsing also
  checks that the set is usable (``key_problem``), so a bad configuration is
  refused when it is read, not at the first write; no error names a secret.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Optional

from ._types import U32_MAX, U64_MAX, FencecheckError, GrantKey, GrantSignature, Token, _keys, key_problem


class TokenTextError(FencecheckError, ValueError):
    """Text that is not a token (or signed token) in canonical form;
    ``text`` is the refused text, cut to 64 characters."""

    def __init__(self, text: str) -> None:
        self.text = text[:64]
        super().__init__(
            f"invalid token {self.text!r}: expected EPOCH.COUNTER or AUTHORITY:EPOCH.COUNTER (decimal u64), "
            "signed: TOKEN~KEY-ID~LEASE~TAG (base64url)"
        )


class KeySetError(FencecheckError, ValueError):
    """Text that is not a usable key set, or an unusable key set; ``reason``
    is the entry that is not ``KEY-ID:SECRET-HEX`` (``entry 2 is not
    KEY-ID:SECRET-HEX``) or the set's problem (``short-secret``...).
    Never contains a secret."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"invalid key set: {reason}")


def _part(text: str, limit: int = U64_MAX) -> Optional[int]:
    # int() would accept '+', '_', spaces and non-ASCII digits; the form does not.
    if not text or not all("0" <= c <= "9" for c in text):
        return None
    value = int(text)
    return value if value <= limit else None


def parse_token(text: str) -> Token:
    """``EPOCH.COUNTER`` or ``AUTHORITY:EPOCH.COUNTER`` as a ``Token``;
    raises ``TokenTextError``."""
    if not isinstance(text, str):
        raise TypeError(f"token text must be a str, got {type(text).__name__}")
    authority_text, colon, rest = text.partition(":")
    authority = _part(authority_text) if colon else 0
    if not colon:
        rest = text
    epoch_text, dot, counter_text = rest.partition(".")
    epoch, counter = _part(epoch_text), _part(counter_text)
    if authority is None or not dot or epoch is None or counter is None:
        raise TokenTextError(text)
    return Token(authority, epoch, counter)


def format_token(token: Token) -> str:
    """A token's canonical text (the authority only when it is not 0)."""
    if not isinstance(token, Token):
        raise TypeError("token must be a Token")
    prefix = f"{token.authority}:" if token.authority else ""
    return f"{prefix}{token.epoch}.{token.counter}"


_BASE64URL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _b64decode(text: str) -> Optional[bytes]:
    """Canonical base64url without padding, else ``None`` (``base64``'s own
    decoders accept padding, other alphabets and stray bits)."""
    if len(text) % 4 == 1 or not _BASE64URL.issuperset(text):
        return None
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    return data if _b64encode(data) == text else None  # non-zero trailing bits


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


@dataclass(frozen=True, slots=True)
class SignedToken:
    """A token with its signature, if any, in text form: ``TOKEN`` or
    ``TOKEN~KEY-ID~LEASE~TAG``. ``str()`` writes it; ``SignedToken.parse``
    reads it back.

    >>> st = SignedToken.parse("7:2.41")
    >>> st.token, st.signature
    (Token(authority=7, epoch=2, counter=41), None)
    """

    token: Token
    signature: Optional[GrantSignature] = None

    def __post_init__(self) -> None:
        if not isinstance(self.token, Token):
            raise TypeError("token must be a Token")
        if self.signature is not None and not isinstance(self.signature, GrantSignature):
            raise TypeError("signature must be a GrantSignature or None")

    @classmethod
    def parse(cls, text: str) -> "SignedToken":
        """Read ``TOKEN`` or ``TOKEN~KEY-ID~LEASE~TAG``; raises
        ``TokenTextError`` for anything off the form (the whole text is
        named)."""
        if not isinstance(text, str):
            raise TypeError(f"token text must be a str, got {type(text).__name__}")
        token_text, tilde, rest = text.partition("~")
        if not tilde:
            return cls(parse_token(text))
        try:
            token = parse_token(token_text)
        except TokenTextError:
            raise TokenTextError(text) from None
        parts = rest.split("~")
        key_id = _part(parts[0], U32_MAX) if len(parts) == 3 else None
        lease = _b64decode(parts[1]) if key_id is not None else None
        tag = _b64decode(parts[2]) if lease is not None else None
        if tag is None:
            raise TokenTextError(text)
        try:
            lease_id = lease.decode("utf-8")
        except UnicodeDecodeError:
            raise TokenTextError(text) from None
        return cls(token, GrantSignature(key_id, lease_id, tag))

    def __str__(self) -> str:
        text = format_token(self.token)
        s = self.signature
        if s is None:
            return text
        return f"{text}~{s.key_id}~{_b64encode(s.lease_id.encode('utf-8'))}~{_b64encode(s.tag)}"


# Rust's `str::trim` (Unicode White_Space); str.strip() would also take U+001C..U+001F.
_WHITESPACE = "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
_HEX = frozenset("0123456789abcdefABCDEF")


def parse_keys(text: str) -> list[GrantKey]:
    """A key set from ``KEY-ID:SECRET-HEX`` entries (commas or lines, ``#``
    comment lines), which must be usable (1 to 16 keys, secrets of 16 to 64
    bytes, no id twice); raises ``KeySetError``.

    >>> [k.key_id for k in parse_keys("# rotation\\n3:" + "00" * 16 + ", 4:" + "ff" * 16)]
    [3, 4]
    """
    if not isinstance(text, str):
        raise TypeError(f"key set text must be a str, got {type(text).__name__}")
    keys: list[GrantKey] = []
    lines = (line[:-1] if line.endswith("\r") else line for line in text.split("\n"))
    entries = (
        entry.strip(_WHITESPACE)
        for line in lines
        if not line.lstrip(_WHITESPACE).startswith("#")
        for entry in line.split(",")
    )
    for n, entry in enumerate(e for e in entries if e):
        id_text, colon, secret = entry.partition(":")
        key_id = _part(id_text, U32_MAX) if colon else None
        if key_id is None or len(secret) % 2 or not _HEX.issuperset(secret):
            raise KeySetError(f"entry {n + 1} is not KEY-ID:SECRET-HEX")
        keys.append(GrantKey(key_id, bytes.fromhex(secret)))
    problem = key_problem(keys)
    if problem is not None:
        raise KeySetError(problem)
    return keys


def format_keys(keys: Iterable[GrantKey]) -> str:
    """A usable key set as text (``3:00ff…,4:…``): it contains the secrets,
    for key files. Raises ``KeySetError`` for an unusable set."""
    keys = _keys(keys)
    problem = key_problem(keys)
    if problem is not None:
        raise KeySetError(problem)
    return ",".join(f"{k.key_id}:{k.secret.hex()}" for k in keys)


def signing_key(keys: Iterable[GrantKey]) -> GrantKey:
    """The one key of a signing key set (``parse_keys`` of an authority's key
    file): an authority signs with exactly one key, resources may trust
    several. Raises ``KeySetError`` for any other count."""
    keys = _keys(keys)
    if len(keys) != 1:
        raise KeySetError(f"{len(keys)} keys; an authority signs with one")
    return keys[0]
