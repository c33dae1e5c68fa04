"""The framework-neutral vocabulary of normbridge: NormSpec, reports, check results."""

from .check_result import CheckResult, OutputComparison, StatsComparison, TargetCheck
from .compare import FRAMEWORK_BOUND_FIELDS, Difference, spec_differences
from .errors import (
    AdapterNotFoundError,
    CheckFailedError,
    DuplicateAdapterError,
    InputFileError,
    NormbridgeError,
    NotExpressibleError,
    SpecError,
    UnsupportedObjectError,
)
from .norm_spec import SCHEMA_VERSION, NormSpec, Source
from .report import ConversionReport, LayerReport, Translation
from .spec_io import load_spec, save_spec, spec_from_parts, spec_to_json, tensors_to_bytes
from .vocabulary import CHANNEL_KINDS, DTYPES, FRAMEWORKS, KINDS, TRAILING_KINDS

__all__ = [
    "AdapterNotFoundError",
    "CHANNEL_KINDS",
    "CheckFailedError",
    "CheckResult",
    "ConversionReport",
    "DTYPES",
    "Difference",
    "DuplicateAdapterError",
    "FRAMEWORKS",
    "FRAMEWORK_BOUND_FIELDS",
    "InputFileError",
    "KINDS",
    "LayerReport",
    "NormSpec",
    "NormbridgeError",
    "NotExpressibleError",
    "OutputComparison",
    "SCHEMA_VERSION",
    "Source",
    "SpecError",
    "StatsComparison",
    "TRAILING_KINDS",
    "TargetCheck",
    "Translation",
    "UnsupportedObjectError",
    "load_spec",
    "save_spec",
    "spec_differences",
    "spec_from_parts",
    "spec_to_json",
    "tensors_to_bytes",
]
