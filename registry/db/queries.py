"""Queries the metadata store's reads and writes share, each on a session the caller holds open.

Finding a model or a version (NotFoundError listing what exists), turning version rows into
VersionRecords with their parents' 'name@N' in one query, locking or creating a model row, and
appending one entry to the audit hash chain under the global audit lock.
"""

from __future__ import annotations

import json

from sqlalchemy import select, update
from sqlalchemy.orm import Session, aliased, defer

from registry.audit_chain import entry_hash, entry_payload
from registry.db.engine import now
from registry.db.models import AuditHeadRow, AuditRow, LockRow, ModelRow, VersionRow
from registry.entities import VersionRecord
from schemas.errors import IntegrityError, NotFoundError

#: The parent version and its model, joined onto every version query (built once: aliased() is costly per request).
_PARENT = aliased(VersionRow)
_PARENT_MODEL = aliased(ModelRow)
#: A model's versions in a subquery (the newest number).
OTHER_VERSION = aliased(VersionRow)


def model_row(session: Session, name: str, *, lock: bool = False) -> ModelRow:
    """The row of model `name` (FOR UPDATE with `lock`); NotFoundError listing the registered models."""
    query = select(ModelRow).where(ModelRow.name == name)
    if lock:
        query = query.with_for_update()
    row = session.scalars(query).one_or_none()
    if row is None:
        known = session.scalars(select(ModelRow.name).order_by(ModelRow.name).limit(20)).all()
        listing = ", ".join(known) if known else "none yet"
        raise NotFoundError(
            f"model {name!r} is not in the registry (registered models: {listing}); check the name or register it first"
        )
    return row


#: The largest version number a 64-bit integer column holds: a larger one names no version (binding it overflows).
MAX_VERSION_NUMBER = 2**63 - 1


def storable_number(number: int) -> bool:
    """Whether `number` can be a version's number (and be bound as one: SQLite raises OverflowError past 64 bits)."""
    return 0 <= number <= MAX_VERSION_NUMBER


def version_id(session: Session, model: str, number: int, lock: bool = False) -> int:
    """The id of `model@number`'s row (`lock`: held FOR UPDATE until the session ends);
    NotFoundError when there is none."""
    query = (
        select(VersionRow.id)
        .join(ModelRow, VersionRow.model_id == ModelRow.id)
        .where(ModelRow.name == model, VersionRow.number == number)
    )
    found = (
        session.execute(query.with_for_update() if lock else query).scalar_one_or_none()
        if storable_number(number)
        else None
    )
    if found is None:
        raise NotFoundError(
            f"version {model}@{number} does not exist; `normbridge versions {model}` lists its versions."
        )
    return found


def version_row(session: Session, model: str, number: int, owner: ModelRow | None = None) -> VersionRow:
    """The row of `model@number` (`owner`: the model's row, when already read); NotFoundError listing its versions."""
    owner = owner or model_row(session, model)
    row = (
        session.scalars(
            select(VersionRow).where(VersionRow.model_id == owner.id, VersionRow.number == number)
        ).one_or_none()
        if storable_number(number)
        else None
    )
    if row is None:
        numbers = session.scalars(
            select(VersionRow.number).where(VersionRow.model_id == owner.id).order_by(VersionRow.number)
        ).all()
        raise NotFoundError(
            f"version {model}@{number} does not exist; {model} has versions {ranges(numbers) if numbers else 'none'}"
        )
    return row


def records(session: Session, condition, order=None) -> list[VersionRecord]:
    """VersionRecords of the rows matching `condition`, with their parents' 'name@N' in one query."""
    return [found for _, found in records_by_id(session, condition, order)]


def records_by_id(
    session: Session, condition, order=None, *, manifests: bool = True
) -> list[tuple[int, VersionRecord]]:
    """(row id, VersionRecord) of the rows matching `condition`; `manifests=False` leaves every manifest empty."""
    parent, parent_model = _PARENT, _PARENT_MODEL
    query = (
        select(VersionRow, parent_model.name, parent.number)
        .outerjoin(parent, VersionRow.parent_id == parent.id)
        .outerjoin(parent_model, parent.model_id == parent_model.id)
        .where(condition)
    )
    if order is not None:
        query = query.order_by(*order)
    if not manifests:
        query = query.options(defer(VersionRow.manifest, raiseload=True))
    return [
        (row.id, row.to_record(None if pname is None else f"{pname}@{pnumber}", with_manifest=manifests))
        for row, pname, pnumber in session.execute(query).all()
    ]


def record(session: Session, row: VersionRow) -> VersionRecord:
    """The VersionRecord of one row."""
    return records(session, VersionRow.id == row.id)[0]


def lock_or_create_model(session: Session, model: str) -> ModelRow:
    """The model row, locked FOR UPDATE (created first if needed, race-free via ON CONFLICT DO NOTHING)."""
    dialect = session.get_bind().dialect.name
    values = {"name": model, "last_number": 0, "created_at": now()}
    if dialect in ("postgresql", "sqlite"):
        module = __import__(f"sqlalchemy.dialects.{dialect}", fromlist=["insert"])
        session.execute(module.insert(ModelRow).values(**values).on_conflict_do_nothing(index_elements=["name"]))
    elif session.scalars(select(ModelRow.id).where(ModelRow.name == model)).one_or_none() is None:
        session.add(ModelRow(**values))
        session.flush()
    return model_row(session, model, lock=True)


def append_audit(
    session: Session, user: str, action: str, model: str | None, number: int | None, detail: dict
) -> AuditRow:
    """Append one chained entry after the head and move the head onto it; takes the global audit lock (always the
    last lock a writer takes). Continuing from the head, not from the last row, keeps a cut visible for good: the
    next entry then chains to an entry that is no longer there."""
    session.scalars(select(LockRow).where(LockRow.name == "audit").with_for_update()).one()
    head = session.execute(select(AuditHeadRow.seq, AuditHeadRow.hash).where(AuditHeadRow.id == 1)).first()
    if head is None:
        raise IntegrityError(
            "the audit head (table audit_head) is missing, so nothing more is appended to the audit log; "
            "restore the database from a backup"
        )
    seq, prev_hash = head.seq + 1, head.hash
    at = now()
    # Hash exactly what the database will give back: JSON types only (tuples become lists, paths strings).
    detail = json.loads(json.dumps(dict(detail), default=str))
    payload = entry_payload(seq, at, user, action, model, number, detail)
    row = AuditRow(
        seq=seq,
        at=at,
        user=user,
        action=action,
        model=model,
        number=number,
        detail=detail,
        prev_hash=prev_hash,
        hash=entry_hash(prev_hash, payload),
    )
    session.add(row)
    session.flush()
    session.execute(update(AuditHeadRow).where(AuditHeadRow.id == 1).values(seq=seq, hash=row.hash))
    return row


def ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5' (short enough for an error message)."""
    parts: list[str] = []
    start = prev = None
    for n in numbers:
        if start is None:
            start = prev = n
        elif n == prev + 1:
            prev = n
        else:
            parts.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = n
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ", ".join(parts)
