"""The audit log's hash chain: each entry's hash covers the previous hash and the entry itself.

hash = sha256(prev_hash + canonical JSON of the entry), so editing, deleting or reordering any
entry breaks every hash after it; the first entry chains to GENESIS. Deleting the LAST entries
breaks no hash, so the chain's end is anchored outside it: the head (table audit_head, moved in
the same transaction as every append) must name the last entry, and a head an operator pinned
earlier (`normbridge audit --verify` prints it) must still be in the chain. An attacker who can
rewrite both the log and the head row is caught only by the pinned head.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from registry.entities import AuditRecord
from schemas.errors import RegistryError

GENESIS = "0" * 64
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class AuditHead:
    """The chain's last entry as the head row records it (seq 0 and GENESIS for an empty log)."""

    seq: int
    hash: str


@dataclass(frozen=True)
class AuditCheck:
    """A verified audit log: its problems (empty when intact) and the head that was checked (None if missing)."""

    problems: list[str]
    head: AuditHead | None
    entries: int


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


def verify_chain(entries: Iterable[AuditRecord]) -> list[str]:
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


def check_pinned_head(text: str) -> str:
    """A pinned head as given on the command line: the full 64-hex-digit entry hash (RegistryError otherwise)."""
    value = (text or "").strip().lower()
    if len(value) != 64 or not set(value) <= _HEX:
        raise RegistryError(
            f"pinned audit head {text!r} is not an entry hash; pass the 64 hex digits `normbridge audit --verify` printed"
        )
    return value


def check_head(entries: Sequence[AuditRecord], head: AuditHead | None, pinned: str | None = None) -> list[str]:
    """Problems at the chain's end: the head row must name its last entry, and a `pinned` head hash must be in it."""
    last = AuditHead(entries[-1].seq, entries[-1].hash) if entries else AuditHead(0, GENESIS)
    problems: list[str] = []
    if head is None:
        problems.append(
            "the audit head (table audit_head) is missing, so the log's end cannot be checked; restore it from a backup"
        )
    elif head.seq > last.seq:
        problems.append(
            f"the audit log ends at entry {last.seq} but its head says {head.seq}: entries {last.seq + 1}-{head.seq} "
            "were deleted from its end; restore the log from a backup"
        )
    elif head.seq < last.seq:
        problems.append(
            f"the audit log goes on to entry {last.seq} but its head says {head.seq}: entries {head.seq + 1}-{last.seq} "
            "were added outside the registry; restore the log from a backup"
        )
    elif head.hash != last.hash:
        problems.append(
            f"audit entry {last.seq} has hash {last.hash[:12]}... but the head records {head.hash[:12]}...: the end of "
            "the log was rewritten; restore it from a backup"
        )
    if pinned is not None and pinned != GENESIS and all(entry.hash != pinned for entry in entries):
        problems.append(
            f"the pinned audit head {pinned[:12]}... is not in the audit log (it ends at entry {last.seq}, "
            f"{last.hash[:12]}...): entries were deleted or rewritten since it was pinned; restore the log from a backup"
        )
    return problems
