"""Every error normbridge raises, and the two tables that map them to CLI exit codes and HTTP statuses.

Messages are one sentence: what was received, what was expected, how to fix it.
Errors that concern one layer name it and the setting, so a user of a 200-layer
model can find the culprit without a debugger.
"""

from __future__ import annotations


class NormbridgeError(Exception):
    """Base class; `code` is the stable machine-readable name (CLI JSON, HTTP)."""

    code = "normbridge_error"

    def __init__(self, message: str, *, layer: str | None = None, setting: str | None = None):
        self.layer = layer
        self.setting = setting
        prefix = ""
        if layer is not None and setting is not None:
            prefix = f"layer '{layer}', setting '{setting}': "
        elif layer is not None:
            prefix = f"layer '{layer}': "
        super().__init__(prefix + message)
        self.message = str(self)

    def to_dict(self) -> dict:
        return {"code": self.code, "message": self.message, "layer": self.layer, "setting": self.setting}


class SpecError(NormbridgeError):
    """The spec (or the state read from a framework) is invalid: shapes, values, missing fields."""

    code = "invalid_spec"


class NotExpressibleError(NormbridgeError):
    """The target framework cannot hold this setting faithfully and no faithful alternative exists."""

    code = "not_expressible"

    def __init__(self, message: str, *, layer: str, setting: str, target: str):
        self.target = target
        super().__init__(f"cannot convert to {target}: {message}", layer=layer, setting=setting)


class UnsupportedObjectError(NormbridgeError):
    """`to_spec` got an object that is not a normalization layer normbridge knows."""

    code = "unsupported_object"


class AdapterNotFoundError(NormbridgeError):
    """No adapter is registered for a (framework, kind) pair."""

    code = "adapter_not_found"


class DuplicateAdapterError(NormbridgeError):
    """Two adapters were registered for the same (framework, kind) pair."""

    code = "duplicate_adapter"


class InputFileError(NormbridgeError):
    """A file given to normbridge is missing, corrupt or of a format it refuses to execute."""

    code = "bad_input_file"


class OutputPathError(NormbridgeError):
    """An output path normbridge cannot write: its folder is a file or missing and cannot be made, it is a folder where
    a file goes (or a file where a folder goes), or the system refused the write
    (permissions, a read-only or full disk)."""

    code = "bad_output_path"


class CheckFailedError(NormbridgeError):
    """An equivalence check ran and found a difference; carries the structured result."""

    code = "check_failed"

    def __init__(self, message: str, result=None):
        self.result = result
        super().__init__(message)


class NotFoundError(NormbridgeError):
    """A model, version, alias or blob that was asked for does not exist."""

    code = "not_found"


class IntegrityError(NormbridgeError):
    """Stored bytes no longer hash to their digest, or the audit chain is broken: never served."""

    code = "integrity_error"


class RegistryError(NormbridgeError):
    """The registry refused an operation (a conflicting alias, a deletion that would orphan lineage, ...)."""

    code = "registry_error"


class InvalidReferenceError(RegistryError):
    """A model name, alias or version reference that is not well formed (`a b`, `cnn@@1`, an alias called `latest` or
    `42`), or a drift report that contradicts its own numbers: a malformed request (HTTP 422 invalid_request, a usage
    error on the command line), not one the registry refused."""

    code = "invalid_request"


class UnauthorizedError(NormbridgeError):
    """A registry server refused the request: no token, or an unknown, malformed or revoked one (HTTP 401)."""

    code = "unauthorized"


class ForbiddenError(NormbridgeError):
    """The token is valid but its role or model scope does not allow the request (HTTP 403)."""

    code = "forbidden"


class PayloadTooLargeError(NormbridgeError):
    """An upload is larger than the server's limit (HTTP 413)."""

    code = "payload_too_large"


class UntrustedRequestError(NormbridgeError):
    """A server refused a request whose Host, Origin, Referer or Sec-Fetch-Site does not name the server itself (HTTP
    403): a DNS-rebinding or cross-site request forgery; `setting` names the header."""

    code = "untrusted_request"


class UnsupportedMediaTypeError(NormbridgeError):
    """A server refused a request body whose Content-Type the endpoint does not take, e.g.
    a form on a JSON endpoint (HTTP 415)."""

    code = "unsupported_media_type"


class UnrecognisedNormalizationError(NormbridgeError):
    """A model holds layers that look like normalizations and that no recognizer proved,
    so the gate cannot check them."""

    code = "unrecognised_normalization"


class NotServableError(RegistryError):
    """A guarded alias (production by default) was to point at a version whose verdict is not servable;
    `--force` overrides, audited."""

    code = "not_servable"


class StorageFullError(NormbridgeError):
    """The registry's database or blob store has no room left (no space on its disk, a quota, SQLite's 'database or disk
    is full'): nothing was stored (HTTP 507, the WebDAV status for it)."""

    code = "storage_full"


class MissingDependencyError(NormbridgeError):
    """An optional package the command needs is not installed; the message names the pip extra that brings it
    (schemas/extras.py). `setting` holds the extra's name."""

    code = "missing_dependency"


class ServerUnreachableError(NormbridgeError):
    """The registry server did not answer (connection refused, timeout, not a normbridge server)."""

    code = "server_unreachable"


#: Exit codes of verdicts that are not errors (a command ran and found something):
HAZARD_FOUND_EXIT = 10  # `normbridge inspect --fail-on`: a hazard at or above the severity
DRIFT_ALARM_EXIT = 11  # `normbridge drift`: a layer's activations drifted past the thresholds
DRIFT_UNCONVERGED_EXIT = 23  # `normbridge drift`: no layer drifted, but some layer's running statistics never converged

#: Error type -> CLI exit code (the most specific class listed wins; HTTP_STATUSES below has the same keys).
#: 1 is left to unexpected crashes and 2 to usage errors (Typer/Click's own).
EXIT_CODES: dict[type[NormbridgeError], int] = {
    SpecError: 3,
    NotExpressibleError: 4,
    UnsupportedObjectError: 5,
    InputFileError: 6,
    CheckFailedError: 7,
    AdapterNotFoundError: 8,
    DuplicateAdapterError: 8,
    IntegrityError: 12,
    NotFoundError: 13,
    RegistryError: 14,
    UnauthorizedError: 15,
    ForbiddenError: 16,
    PayloadTooLargeError: 17,
    ServerUnreachableError: 18,
    UntrustedRequestError: 19,
    UnsupportedMediaTypeError: 20,
    UnrecognisedNormalizationError: 21,
    NotServableError: 22,
    OutputPathError: 24,
    StorageFullError: 25,
    MissingDependencyError: 26,
    InvalidReferenceError: 2,
    NormbridgeError: 9,
}

#: Error type -> HTTP status of the service's error responses (registry/http/errors.py: status_for).
HTTP_STATUSES: dict[type[NormbridgeError], int] = {
    SpecError: 422,
    NotExpressibleError: 422,
    UnsupportedObjectError: 415,
    InputFileError: 400,
    CheckFailedError: 409,
    AdapterNotFoundError: 501,
    DuplicateAdapterError: 500,
    IntegrityError: 500,
    NotFoundError: 404,
    RegistryError: 409,
    UnauthorizedError: 401,
    ForbiddenError: 403,
    PayloadTooLargeError: 413,
    ServerUnreachableError: 502,
    UntrustedRequestError: 403,
    UnsupportedMediaTypeError: 415,
    UnrecognisedNormalizationError: 422,
    NotServableError: 409,
    OutputPathError: 500,
    StorageFullError: 507,
    MissingDependencyError: 501,
    InvalidReferenceError: 422,
    NormbridgeError: 500,
}


def error_class_for_code(code: str) -> type[NormbridgeError]:
    """The error class whose stable `code` this is (NormbridgeError for unknown codes):
    HTTP clients re-raise server errors with it."""
    for cls in EXIT_CODES:
        if cls.code == code:
            return cls
    return NormbridgeError


def exit_code_for(error: BaseException) -> int:
    """Exit code for an error: the most specific entry of EXIT_CODES, else 1."""
    for cls in type(error).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return 1
