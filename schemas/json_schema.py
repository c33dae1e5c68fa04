"""JSON Schema export of the spec, report and check result (`python -m schemas.json_schema`)."""

from __future__ import annotations

import json
from pathlib import Path

from .check_result import CheckResult
from .inspection import ModelInspection
from .norm_spec import NormSpec
from .report import ConversionReport
from .monitoring import DriftHistory, DriftWindow
from .serving import ContractResult, DriftReport, ExportResult, RecalibrationReport

SCHEMA_DIR = Path(__file__).parent / "json"
MODELS = {
    "normspec": NormSpec,
    "conversion_report": ConversionReport,
    "check_result": CheckResult,
    "model_inspection": ModelInspection,
    "contract_result": ContractResult,
    "export_result": ExportResult,
    "drift_report": DriftReport,
    "recalibration_report": RecalibrationReport,
    "drift_window": DriftWindow,
    "drift_history": DriftHistory,
}


def schema_documents() -> dict[str, str]:
    """File name -> JSON Schema text, for every exported model."""
    return {
        f"{name}.schema.json": json.dumps(model.model_json_schema(mode="serialization"), indent=2, sort_keys=True)
        + "\n"
        for name, model in MODELS.items()
    }


def write_schemas(folder: Path = SCHEMA_DIR) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in schema_documents().items():
        path = folder / name
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write_schemas():
        print(path)
