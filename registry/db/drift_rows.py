"""Rows of the drift history (migrations 0005, 0007, 0009, 0010, 0012): one per stored window, one per layer of it,
its per-channel arrays, and each version's incremental alert state.

The window and layer rows are the summaries the history and the charts read; the per-channel arrays sit apart in
drift_window_arrays (zlib-compressed JSON) so a retention setting can drop them without touching the summaries. The
state row is what the sustained-shift rule keeps between windows (the last m over-threshold flags), so storing a window
never rescans the history. A window's content digest is unique per version, so a window posted twice is stored once.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from registry.db.models import Base


class DriftWindowRow(Base):
    """One window a collector shipped for a version, with the state the rule gave the version right after it."""

    __tablename__ = "drift_windows"
    __table_args__ = (
        Index("ix_drift_windows_version_id", "version_id", "id"),
        Index("ix_drift_windows_received_at", "received_at"),
        Index("ux_drift_windows_content", "version_id", "content_digest", unique=True),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"), nullable=False)
    received_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    started_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    ended_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    replica: Mapped[str | None] = mapped_column(String(255), nullable=True)
    user: Mapped[str] = mapped_column(String(255), nullable=False)
    requests: Mapped[int] = mapped_column(BigInteger, nullable=False)  # 64 bits on PostgreSQL since 0009
    sampled: Mapped[int] = mapped_column(BigInteger, nullable=False)
    dropped: Mapped[int] = mapped_column(BigInteger, nullable=False)
    statistics_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    over: Mapped[bool] = mapped_column(Boolean, nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    unmatched: Mapped[str | None] = mapped_column(String(4096), nullable=True)  # '\n'-joined layer names
    content_digest: Mapped[str | None] = mapped_column(
        String(64), nullable=True
    )  # drift_history.window_digest (0009); NULL before
    # The window's serving faults as a JSON list of schemas.monitoring.ServingFault (0012); NULL: none or stored before.
    faults: Mapped[str | None] = mapped_column(Text, nullable=True)


class DriftLayerRow(Base):
    """One layer of one window: its shift and variance ratio against the version's running statistics."""

    __tablename__ = "drift_layers"
    __table_args__ = (Index("ix_drift_layers_window_id", "window_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    window_id: Mapped[int] = mapped_column(ForeignKey("drift_windows.id", ondelete="CASCADE"), nullable=False)
    layer: Mapped[str] = mapped_column(String(512), nullable=False)
    channels: Mapped[int] = mapped_column(Integer, nullable=False)
    count: Mapped[int] = mapped_column(BigInteger, nullable=False)
    max_shift: Mapped[float] = mapped_column(Float, nullable=False)
    mean_shift: Mapped[float] = mapped_column(Float, nullable=False)
    worst_shift_channel: Mapped[int] = mapped_column(Integer, nullable=False)
    variance_ratio: Mapped[float] = mapped_column(Float, nullable=False)
    max_abs_log_ratio: Mapped[float] = mapped_column(Float, nullable=False)
    over: Mapped[bool] = mapped_column(Boolean, nullable=False)
    status: Mapped[str] = mapped_column(
        String(24), nullable=False, server_default="ok"
    )  # ok, drift, unconverged_statistics (0007)
    initial_weight: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The sampling error the rule allowed for (0010; NULL before, and where it could not be measured):
    # schemas.monitoring.LayerShift.
    batches: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    shift_bound: Mapped[float | None] = mapped_column(Float, nullable=True)
    log_ratio_bound: Mapped[float | None] = mapped_column(Float, nullable=True)
    error_multiplier: Mapped[float | None] = mapped_column(Float, nullable=True)


class DriftArraysRow(Base):
    """The per-channel means and variances a window carried (zlib-compressed JSON),
    dropped after the retention period."""

    __tablename__ = "drift_window_arrays"

    window_id: Mapped[int] = mapped_column(ForeignKey("drift_windows.id", ondelete="CASCADE"), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class DriftStateRow(Base):
    """A version's alert state and the over-threshold flags of its last windows ('1' = over, oldest first)."""

    __tablename__ = "drift_state"

    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    recent: Mapped[str] = mapped_column(String(64), nullable=False)
    windows: Mapped[int] = mapped_column(Integer, nullable=False)
    last_window_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)


__all__ = ["DriftArraysRow", "DriftLayerRow", "DriftStateRow", "DriftWindowRow"]
