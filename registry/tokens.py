"""API tokens of the HTTP service: created, listed and revoked on the server host, checked per request.

A token reads `nbt_<id>_<secret>`: the id (12 hex digits) finds the row, the secret (43 urlsafe
characters) proves possession. Only sha256(secret) is stored, compared with hmac.compare_digest,
so a copy of the database grants nothing. Creating and revoking a token is written to the audit
log in the same transaction as the row. A token expires (DEFAULT_LIFETIME after its creation unless told otherwise);
tokens created before expiry existed (migration 0011) keep none, as before.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from registry.db.models import TokenRow, utc
from registry.db.engine import READ_ONLY
from schemas.errors import NotFoundError, RegistryError

#: Roles in increasing order of power: each implies the ones before it.
ROLES = ("read", "write", "admin")
PREFIX = "nbt_"
_TOKEN = re.compile(r"^nbt_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: How long a new token lives unless its creator says otherwise (`normbridge token create --expires`; docs/service.md).
DEFAULT_LIFETIME = timedelta(days=90)
_LIFETIME = re.compile(r"^([1-9][0-9]{0,5})([dh])$")


def parse_lifetime(text: str) -> timedelta | None:
    """A token lifetime as written on the command line: `30d` (days), `12h` (hours) or `never` (None)."""
    if text.strip().lower() == "never":
        return None
    match = _LIFETIME.match(text.strip())
    if match is None:
        raise RegistryError(f"'{text}' is not a token lifetime; write days or hours, e.g. 30d or 12h, or never.")
    count, unit = int(match.group(1)), match.group(2)
    return timedelta(days=count) if unit == "d" else timedelta(hours=count)


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


@dataclass(frozen=True)
class TokenInfo:
    """A token as listed (never its secret)."""

    id: str
    owner: str
    role: str
    models: tuple[str, ...] | None  # None: every model
    note: str | None
    created_at: datetime
    created_by: str
    revoked_at: datetime | None
    expires_at: datetime | None = None  # None: never

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= datetime.now(UTC)

    @property
    def active(self) -> bool:
        return self.revoked_at is None and not self.expired

    @property
    def state(self) -> str:
        return "revoked" if self.revoked_at is not None else "expired" if self.expired else "active"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _info(row: TokenRow) -> TokenInfo:
    return TokenInfo(
        id=row.id,
        owner=row.owner,
        role=row.role,
        models=None if row.models is None else tuple(row.models),
        note=row.note,
        created_at=utc(row.created_at),
        created_by=row.created_by,
        revoked_at=None if row.revoked_at is None else utc(row.revoked_at),
        expires_at=None if row.expires_at is None else utc(row.expires_at),
    )


def parse_token(token: str) -> tuple[str, str] | None:
    """(id, secret) of a well-formed token string, else None."""
    match = _TOKEN.match(token or "")
    return (match.group(1), match.group(2)) if match else None


class TokenStore:
    """Tokens in the registry database (table api_tokens), sharing the MetadataStore's engine."""

    def __init__(self, meta):
        self.meta = meta
        self._sessions = sessionmaker(meta.engine, expire_on_commit=False)
        self._read_sessions = sessionmaker(meta.engine.execution_options(**{READ_ONLY: True}), expire_on_commit=False)

    def create(
        self,
        owner: str,
        role: str,
        models: list[str] | tuple[str, ...] | None = None,
        note: str | None = None,
        created_by: str = "unknown",
        lifetime: timedelta | None = DEFAULT_LIFETIME,
    ) -> tuple[TokenInfo, str]:
        """A new token living `lifetime` (None: until revoked); returns (its info, the token string). The string is
        never retrievable again."""
        if role not in ROLES:
            raise RegistryError(f"role '{role}' is not known; use one of {', '.join(ROLES)}.")
        if not owner or len(owner) > 255:
            raise RegistryError(f"owner '{owner}' is not valid; pass a non-empty name of at most 255 characters.")
        scope = None if not models else sorted(set(models))
        for name in scope or ():
            if not _NAME.match(name):
                raise RegistryError(
                    f"model scope '{name}' is not a valid model name; use letters, digits, '.', '_' or '-'."
                )
        token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        now = _now()
        expires = None if lifetime is None else now + lifetime
        with self._sessions() as session, session.begin():
            row = TokenRow(
                id=token_id,
                owner=owner,
                role=role,
                models=scope,
                secret_hash=_hash(secret),
                note=note,
                created_at=now,
                created_by=created_by,
                revoked_at=None,
                expires_at=expires,
            )
            session.add(row)
            session.flush()
            self.meta.append_audit(
                "token_create",
                None,
                None,
                {
                    "token_id": token_id,
                    "owner": owner,
                    "role": role,
                    "models": scope,
                    "expires_at": None if expires is None else expires.isoformat(),
                },
                created_by,
                session=session,
            )
            info = _info(row)
        return info, f"{PREFIX}{token_id}_{secret}"

    def list(self) -> list[TokenInfo]:
        """Every token, oldest first (revoked ones included, marked)."""
        with self._read_sessions() as session:
            return [_info(row) for row in session.scalars(select(TokenRow).order_by(TokenRow.created_at, TokenRow.id))]

    def revoke(self, token_id: str, user: str = "unknown") -> TokenInfo:
        """Revoke a token by id from now on (idempotent); NotFoundError for an unknown id."""
        with self._sessions() as session, session.begin():
            row = session.get(TokenRow, token_id)
            if row is None:
                raise NotFoundError(f"token '{token_id}' does not exist; `normbridge token list` shows the token ids.")
            if row.revoked_at is None:
                row.revoked_at = _now()
                session.flush()
                self.meta.append_audit(
                    "token_revoke", None, None, {"token_id": token_id, "owner": row.owner}, user, session=session
                )
            return _info(row)

    def authenticate(self, token: str) -> TokenInfo | None:
        """The active token this string proves, or None (malformed, unknown, wrong secret, revoked or expired)."""
        parsed = parse_token(token)
        if parsed is None:
            return None
        token_id, secret = parsed
        with self._read_sessions() as session:
            row = session.get(TokenRow, token_id)
            expected = row.secret_hash if row is not None else _hash("")
            # Compare even for unknown ids so the timing does not tell which ids exist.
            ok = hmac.compare_digest(_hash(secret), expected)
            if row is None or not ok or row.revoked_at is not None:
                return None
            info = _info(row)
            return info if info.active else None


__all__ = ["DEFAULT_LIFETIME", "PREFIX", "ROLES", "TokenInfo", "TokenStore", "parse_lifetime", "parse_token"]
