"""JSON responses that stay valid JSON when a result holds inf or NaN (an overflowing layer, a relative change from 0).

Standard JSON has no inf/NaN; those values are sent as null, as pydantic's model_dump_json does. Each carries
X-Content-Type-Options: nosniff (the request guard adds it to every other response too).
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


#: Every JSON answer (errors included) tells browsers not to sniff it as something else (HTML, script).
NOSNIFF = {"X-Content-Type-Options": "nosniff"}


class SafeJSONResponse(JSONResponse):
    def __init__(self, content: Any, status_code: int = 200, headers: dict[str, str] | None = None, **kwargs):
        super().__init__(content, status_code=status_code, headers={**NOSNIFF, **(headers or {})}, **kwargs)

    def render(self, content: Any) -> bytes:
        try:
            return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
        except ValueError:  # only inf/NaN get here: the slow path is the rare one
            return json.dumps(finite(content), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode(
                "utf-8"
            )


__all__ = ["NOSNIFF", "SafeJSONResponse", "finite"]
