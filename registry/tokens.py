"""API tokens of the HTTP service: created, listed and revoked on the server host, checked per request.

A token reads `nbt_<id>_<secret>`: the id (12 hex digits) finds the row, the secret (43 urlsafe
characters) proves possession. Only sha256(secret) is stored, compared with hmac.compare_digest,
so a copy of the database grants nothing. Creating and revoking a token is written to the audit
log in the same transaction as the row.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

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

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _info(row: TokenRow) -> TokenInfo:
    return TokenInfo(id=row.id, owner=row.owner, role=row.role, models=None if row.models is None else tuple(row.models),
                     note=row.note, created_at=utc(row.created_at), created_by=row.created_by,
                     revoked_at=None if row.revoked_at is None else utc(row.revoked_at))


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

    def create(self, owner: str, role: str, models: list[str] | tuple[str, ...] | None = None, note: str | None = None,
               created_by: str = "unknown") -> tuple[TokenInfo, str]:
        """A new token; returns (its info, the token string). The string is never retrievable again."""
        if role not in ROLES:
            raise RegistryError(f"role '{role}' is not known; use one of {', '.join(ROLES)}.")
        if not owner or len(owner) > 255:
            raise RegistryError(f"owner '{owner}' is not valid; pass a non-empty name of at most 255 characters.")
        scope = None if not models else sorted(set(models))
        for name in scope or ():
            if not _NAME.match(name):
                raise RegistryError(f"model scope '{name}' is not a valid model name; use letters, digits, '.', '_' or '-'.")
        token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        now = datetime.now(UTC).replace(tzinfo=None)
        with self._sessions() as session, session.begin():
            row = TokenRow(id=token_id, owner=owner, role=role, models=scope, secret_hash=_hash(secret), note=note,
                           created_at=now, created_by=created_by, revoked_at=None)
            session.add(row)
            session.flush()
            self.meta.append_audit("token_create", None, None, {"token_id": token_id, "owner": owner, "role": role, "models": scope},
                                   created_by, session=session)
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
                row.revoked_at = datetime.now(UTC).replace(tzinfo=None)
                session.flush()
                self.meta.append_audit("token_revoke", None, None, {"token_id": token_id, "owner": row.owner}, user, session=session)
            return _info(row)

    def authenticate(self, token: str) -> TokenInfo | None:
        """The active token this string proves, or None (malformed, unknown, wrong secret or revoked)."""
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
            return _info(row)


__all__ = ["PREFIX", "ROLES", "TokenInfo", "TokenStore", "parse_token"]
