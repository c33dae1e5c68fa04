"""JSON responses that stay valid JSON when a result holds inf or NaN (an overflowing layer, a relative change from 0).

Standard JSON has no inf/NaN; those values are sent as null, as pydantic's model_dump_json does.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi.responses import JSONResponse


def finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (containers copied)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


class SafeJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        try:
            return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
        except ValueError:  # only inf/NaN get here: the slow path is the rare one
            return json.dumps(finite(content), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


__all__ = ["SafeJSONResponse", "finite"]
