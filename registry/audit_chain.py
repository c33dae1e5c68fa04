"""The audit log's hash chain: each entry's hash covers the previous hash and the entry itself.

hash = sha256(prev_hash + canonical JSON of the entry), so editing, deleting or reordering any
entry breaks every hash after it; the first entry chains to GENESIS.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Protocol

GENESIS = "0" * 64


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, no NaN: the same value always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def timestamp_text(at: datetime) -> str:
    """The UTC microsecond timestamp as hashed (naive datetimes are taken as UTC)."""
    if at.tzinfo is not None:
        at = at.astimezone(UTC).replace(tzinfo=None)
    return at.isoformat(timespec="microseconds")


def entry_payload(
    seq: int, at: datetime, user: str, action: str, model: str | None, number: int | None, detail: dict
) -> dict:
    """The fields of an entry that its hash covers."""
    return {
        "seq": seq,
        "at": timestamp_text(at),
        "user": user,
        "action": action,
        "model": model,
        "number": number,
        "detail": detail,
    }


def entry_hash(prev_hash: str, payload: dict) -> str:
    """sha256(prev_hash + canonical JSON of the entry)."""
    return hashlib.sha256((prev_hash + canonical_json(payload)).encode("utf-8")).hexdigest()


class ChainEntry(Protocol):
    seq: int
    at: datetime
    user: str
    action: str
    model: str | None
    number: int | None
    detail: dict
    prev_hash: str
    hash: str


def verify_chain(entries: Iterable[ChainEntry]) -> list[str]:
    """Problems found walking the chain in seq order (empty when intact)."""
    problems: list[str] = []
    expected_prev = GENESIS
    expected_seq = 1
    for entry in entries:
        if entry.seq != expected_seq:
            problems.append(f"audit entry {entry.seq}: expected sequence number {expected_seq}; entries are missing")
        if entry.prev_hash != expected_prev:
            problems.append(
                f"audit entry {entry.seq}: prev_hash {entry.prev_hash[:12]}... does not match the previous "
                f"entry's hash {expected_prev[:12]}...; the chain was cut or reordered"
            )
        payload = entry_payload(entry.seq, entry.at, entry.user, entry.action, entry.model, entry.number, entry.detail)
        actual = entry_hash(entry.prev_hash, payload)
        if actual != entry.hash:
            problems.append(
                f"audit entry {entry.seq} ({entry.action} {entry.model}@{entry.number}): its content hashes to "
                f"{actual[:12]}... but {entry.hash[:12]}... is stored; the entry was modified"
            )
        expected_prev = entry.hash
        expected_seq = entry.seq + 1
    return problems
