"""The registry over HTTP: `RemoteRegistry` answers what `Registry` answers, by asking a `normbridge serve` server.

The CLI picks it when `--server URL` (env NORMBRIDGE_SERVER) is given, so every registry command works unchanged against
a shared server. Methods and return types follow registry.service.Registry (records from registry/entities.py, pydantic
results from registry/service/results.py); server errors come back as the same schemas.errors types (and so the same
exit codes), and a server that does not answer is a ServerUnreachableError naming the URL. Bundles are re-hashed on
arrival: a blob that does not hash to its name, or a manifest whose digest is not the one the server announced, is
refused. What the server's headers say is checked before it is used: the version it names must be a version of the model
asked for (the very one when a number was asked), so a hostile server's X-Normbridge-Version never becomes a path, and a
pulled file goes from the download's temporary file to its place in chunks, never held whole.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter, ValidationError

import converters
from converters.models.loading import load_model
from schemas import CheckResult
from schemas.atomic_io import atomic_writer
from schemas.manifest import UnrecognisedLayer, load_manifest
from schemas.manifest_diff import ManifestDiff
from schemas.errors import (
    CheckFailedError,
    ForbiddenError,
    InputFileError,
    IntegrityError,
    NormbridgeError,
    NotFoundError,
    PayloadTooLargeError,
    RegistryError,
    ServerUnreachableError,
    UnauthorizedError,
    error_class_for_code,
)

from .audit_chain import AuditCheck, AuditHead
from .client_transfer import (
    TransferProgress,
    artifact_members,
    bytes_chunks,
    extract_bundle,
    file_chunks,
    folder_blob_digests,
    folder_tar_chunks,
    folder_tar_size,
    no_progress,
    save_stream,
    server_error_in,
    tar_chunks,
    tar_size,
)
from .drift_records import DriftRecord
from .entities import AliasRecord, AuditRecord, VersionRecord, split_ref
from .service.interface import ModelRegistry
from .service.layer_export import export_layers
from .service.model_files import STRUCTURE_SUFFIXES, SUFFIXES, ModelFile, PullResult, pulled_path, read_back
from .service.model_folders import FOLDER_FORMATS, folder_target, load_version_folder, write_version_folder
from .lineage import LineageView
from .manifest_io import BLOBS_DIR, MANIFEST_FILE, load_artifact_folder, tensors_from_blobs
from .service.results import GcResult, Registration, VerifyResult

API = "/api/v1"
#: Model file suffix -> the upload format it is sent as (each framework's structure format: FrameworkInfo).
UPLOAD_FORMATS = {suffix: fmt for fmt, suffix in STRUCTURE_SUFFIXES.items()}
#: Registration runs the equivalence gate on the server: reads may take minutes, connecting may not.
TIMEOUT = httpx.Timeout(600.0, connect=10.0)
_STATUS_ERRORS = {401: UnauthorizedError, 403: ForbiddenError, 404: NotFoundError, 413: PayloadTooLargeError}


class RemoteRegistry(ModelRegistry):
    """A registry on a normbridge server at `url`, authenticated with `token`
    (`nbt_...`; None for `serve --insecure-local`).

    `transfer(description, total_bytes)` may be given to draw byte progress for uploads and downloads.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        transfer: TransferProgress | None = None,
        timeout: httpx.Timeout = TIMEOUT,
        waiting: Callable[[str], AbstractContextManager] | None = None,
    ):
        self.url = url.rstrip("/")
        self.token = token
        self.transfer = transfer or no_progress
        self.waiting = waiting or (lambda description: nullcontext())
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url + API, headers=headers, timeout=timeout, follow_redirects=False)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "RemoteRegistry":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ HTTP plumbing

    def _unreachable(self, error: Exception) -> ServerUnreachableError:
        return ServerUnreachableError(
            f"the registry server at {self.url} did not answer ({type(error).__name__}: {error}); start it with `normbridge serve` "
            "or fix --server / NORMBRIDGE_SERVER."
        )

    def _request(self, method: str, path: str, **kwargs) -> Any:
        """The JSON answer of a request; server errors re-raised as their schemas.errors type."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise self._unreachable(error) from error
        return self._json(response)

    def _json(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise self._error(response)
        try:
            return response.json()
        except ValueError as error:
            raise ServerUnreachableError(
                f"{self.url} answered {response.request.url.path} with something that is not JSON "
                f"(HTTP {response.status_code}); check that --server / NORMBRIDGE_SERVER points at a normbridge server."
            ) from error

    def _error(self, response: httpx.Response) -> NormbridgeError:
        """The server's {"error": {...}} as the matching schemas.errors type (CheckFailedError keeps its
        CheckResult)."""
        try:
            body = response.json()["error"]
            code, message = body["code"], body["message"]
        except (ValueError, KeyError, TypeError):
            cls = _STATUS_ERRORS.get(response.status_code)
            text = response.text[:200].strip()
            if cls is not None:
                return cls(
                    f"{self.url} refused {response.request.method} {response.request.url.path} with HTTP {response.status_code}: {text}"
                )
            return ServerUnreachableError(
                f"{self.url} answered HTTP {response.status_code} without a normbridge error body ({text!r}); "
                "check that --server / NORMBRIDGE_SERVER points at a normbridge server."
            )
        if code == "unauthorized":
            message = message.rstrip(".") + "; the CLI sends the token given with --token or env NORMBRIDGE_TOKEN."
        return _rebuild(error_class_for_code(code), message, body)

    @contextmanager
    def _download(self, path: str, description: str) -> Iterator[tuple[Path, httpx.Headers]]:
        """Stream a response body into a temporary file (deleted afterwards); yields (file, headers)."""
        with tempfile.TemporaryDirectory(prefix="normbridge-download-") as tmp:
            target = Path(tmp) / "body"
            started = False
            try:
                with self.http.stream("GET", path) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise self._error(response)
                    started = True
                    length = response.headers.get("Content-Length")
                    with self.transfer(description, int(length) if length and length.isdigit() else None) as advance:
                        save_stream(response.iter_bytes(), target, advance)
                    headers = response.headers
            except httpx.TransportError as error:
                if not started:
                    raise self._unreachable(error) from error
                # The server stops a bundle mid-stream when a stored blob fails its hash: never use what arrived.
                reason = server_error_in(target) if target.exists() else None
                if reason is not None:
                    raise IntegrityError(
                        f"{description} from {self.url} was stopped by the server: {reason}"
                    ) from error
                raise IntegrityError(
                    f"{description} from {self.url} ended early ({type(error).__name__}: {error}); the server stops "
                    "sending when a stored blob fails its hash check: run `normbridge verify` against the server."
                ) from error
            yield target, headers

    @contextmanager
    def _bundle(self, ref: str) -> Iterator[tuple[Any, str]]:
        """The version's artifact (every blob re-hashed, digest checked against the server's) and its 'name@N'."""
        name, version = _split(ref)
        with self._download(f"/models/{_q(name)}/versions/{_q(version)}/bundle", f"downloading {ref}") as (
            archive,
            headers,
        ):
            folder = extract_bundle(archive, archive.parent / "bundle")
            try:
                artifact = load_artifact_folder(folder)
            except InputFileError as error:
                raise IntegrityError(
                    f"the bundle of {ref} downloaded from {self.url} is damaged ({error}); it was not used."
                ) from error
            self._check_announced(ref, artifact.manifest, headers)
            yield artifact, served_ref(self.url, ref, headers.get("X-Normbridge-Version"))

    def _check_announced(self, ref: str, manifest, headers: httpx.Headers) -> None:
        """IntegrityError unless a downloaded bundle's manifest has the digest the server announced
        (X-Normbridge-Digest)."""
        announced = headers.get("X-Normbridge-Digest")
        if announced is None or manifest.digest() != announced:
            raise IntegrityError(
                f"the bundle of {ref} from {self.url} has manifest digest {manifest.digest()[:12]} but the server "
                f"announced {str(announced)[:12]}; it was not used: retry, or run `normbridge verify {ref}` on the server."
            )

    @contextmanager
    def _bundle_on_disk(self, ref: str) -> Iterator[tuple[Any, Callable[[str], bytes], str]]:
        """(manifest, get(digest), 'name@N') of the version's bundle extracted to a temporary folder: each blob is read
        from its file when asked and re-hashed, so a folder version is written holding one blob at a time, not all."""
        name, version = _split(ref)
        with self._download(f"/models/{_q(name)}/versions/{_q(version)}/bundle", f"downloading {ref}") as (
            archive,
            headers,
        ):
            folder = extract_bundle(archive, archive.parent / "bundle")
            archive.unlink()  # extracted: its bytes are in the blob files now
            try:
                manifest = load_manifest(json.loads((folder / MANIFEST_FILE).read_text()))
            except (OSError, ValueError, NormbridgeError) as error:
                raise IntegrityError(
                    f"the bundle of {ref} downloaded from {self.url} has no readable manifest ({error}); it was not used."
                ) from error
            self._check_announced(ref, manifest, headers)

            def get(digest: str) -> bytes:
                path = folder / BLOBS_DIR / f"{digest}.safetensors"
                data = path.read_bytes() if path.is_file() else b""
                if hashlib.sha256(data).hexdigest() != digest:
                    raise IntegrityError(
                        f"the bundle of {ref} from {self.url} lacks blob {digest[:12]} or holds other bytes under its "
                        "name; nothing was written: retry, or run `normbridge verify` on the server."
                    )
                return data

            yield manifest, get, served_ref(self.url, ref, headers.get("X-Normbridge-Version"))

    # ------------------------------------------------------------------ registration

    def register(
        self,
        name: str,
        model: Any,
        parent: str | None = None,
        note: str | None = None,
        operation: str | None = None,
        progress=None,
        allow_unrecognised: bool = False,
    ):
        """Upload a model file (.onnx, .keras, .pt2) or an artifact folder; the server runs the equivalence gate and
        stores it.

        Returns a registry.service.Registration. An in-memory model is refused: save it to a file first.
        """
        path, fmt, size, chunks = self._upload_body(model)
        report = progress or (lambda step, done, total: None)
        params = {
            k: v
            for k, v in (("format", fmt), ("parent", parent), ("note", note), ("operation", operation))
            if v is not None
        }
        if allow_unrecognised:
            params["allow_unrecognised"] = "true"

        with ExitStack() as stack:

            def body() -> Iterator[bytes]:
                with self.transfer(f"uploading {path.name}", size) as advance:

                    def both(done: int) -> None:
                        advance(done)
                        report("uploading", done, size)

                    yield from chunks(both)
                report("checking on the server", 0, 1)
                stack.enter_context(self.waiting(f"{name}: the server is running the equivalence check"))

            try:
                response = self.http.post(
                    f"/models/{_q(name)}/versions",
                    params=params,
                    content=body(),
                    headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"},
                )
            except (httpx.WriteError, httpx.RemoteProtocolError) as error:
                raise ServerUnreachableError(
                    f"the registry server at {self.url} closed the connection while {path.name} was being uploaded "
                    f"({type(error).__name__}: {error}); retry, and check the server's log (size limit, restarts)."
                ) from error
            except httpx.TransportError as error:
                raise self._unreachable(error) from error
        answer = self._json(response)
        report("committed", 1, 1)
        return Registration(
            version=_version(answer["version"]),
            created=bool(answer["created"]),
            checks=[check_result(c) for c in answer.get("checks") or []],
            unrecognised=[UnrecognisedLayer.model_validate(u) for u in answer.get("unrecognised") or []],
        )

    def _upload_body(self, model: Any):
        """(path, format, size, chunks(advance)) for a model path; InputFileError/RegistryError before anything is
        sent."""
        if not isinstance(model, (str, Path)):
            raise RegistryError(
                f"cannot send an in-memory {type(model).__name__} to the registry server at {self.url}; save it to a file first "
                "(torch.export.save -> .pt2, model.save -> .keras, or .onnx) and register the path."
            )
        path = Path(model)
        if not path.exists():
            raise InputFileError(f"'{path}' does not exist; pass a .pt2, .keras or .onnx file or an artifact folder.")
        if path.is_dir():
            if not (
                path / "manifest.json"
            ).is_file():  # a checkpoint folder: read here, sent as a bundle streamed from its files
                from .artifact import extract_artifact

                artifact = extract_artifact(path)
                members = artifact_members(
                    artifact.manifest, artifact.blobs, self._present(artifact.manifest.blob_digests())
                )
                return path, "bundle", tar_size(members), lambda advance: tar_chunks(members, advance)
            skip = self._present(folder_blob_digests(path))
            return path, "bundle", folder_tar_size(path, skip), lambda advance: folder_tar_chunks(path, advance, skip)
        fmt = UPLOAD_FORMATS.get(path.suffix.lower())
        if fmt is None:
            load_model(
                path
            )  # raises the same InputFileError (pickles refused, unknown formats) as a local registration
            raise InputFileError(
                f"'{path}' has format '{path.suffix}'; a server accepts .pt2, .keras, .onnx files or an artifact folder."
            )
        if fmt == "onnx":
            embedded = converters.onnx_upload_bytes(
                path
            )  # the server receives one file: external data is embedded in it
            if embedded is not None:
                return path, fmt, len(embedded), lambda advance: bytes_chunks(embedded, advance)
        return path, fmt, path.stat().st_size, lambda advance: file_chunks(path, advance)

    def _present(self, digests: list[str]) -> frozenset[str]:
        """The blobs the server already holds for this token (it may read a version that has them): not sent again."""
        if not digests:
            return frozenset()
        return frozenset(self._request("POST", "/blobs/present", json={"digests": digests})["present"]) & frozenset(
            digests
        )

    # ------------------------------------------------------------------ reading

    def models(self) -> list[tuple[str, int, int]]:
        return [(m["name"], m["latest"], m["versions"]) for m in self._request("GET", "/models")]

    def versions(self, name: str) -> list[VersionRecord]:
        return [_version(v) for v in self._request("GET", f"/models/{_q(name)}/versions")["versions"]]

    def aliases(self, name: str) -> list[AliasRecord]:
        return [_alias(a) for a in self._request("GET", f"/models/{_q(name)}/aliases")]

    def show(self, ref: str) -> VersionRecord:
        name, version = _split(ref)
        return _version(self._request("GET", f"/models/{_q(name)}/versions/{_q(version)}"))

    def manifest(self, ref: str):
        return load_manifest(self.show(ref).manifest)

    def specs(self, ref: str) -> list:
        with self._bundle(ref) as (artifact, _):
            return list(artifact.specs)

    def tensors(self, ref: str) -> dict:
        with self._bundle(ref) as (artifact, _):
            return tensors_from_blobs(artifact.manifest, artifact.blobs.__getitem__)

    def blob_reader(self, record: VersionRecord) -> Callable[[str], bytes]:
        """`Registry.blob_reader` over HTTP: the version's blobs from its downloaded bundle (each re-hashed, the
        manifest digest checked against the server's), read once (`mlflow push --server` logs all of them)."""
        with self._bundle(record.ref) as (artifact, _):
            blobs = dict(artifact.blobs)

        def get(digest: str) -> bytes:
            if digest not in blobs:
                raise IntegrityError(
                    f"version {record.ref}: blob {digest[:12]} is not in the bundle {self.url} sent; run `normbridge verify` on the server."
                )
            return blobs[digest]

        return get

    def diff(self, ref_a: str, ref_b: str):
        return ManifestDiff.model_validate(self._request("GET", "/diff", params={"a": ref_a, "b": ref_b}))

    def lineage(self, ref: str):
        name, version = _split(ref)
        return LineageView.model_validate(self._request("GET", f"/models/{_q(name)}/versions/{_q(version)}/lineage"))

    # ------------------------------------------------------------------ writing

    def set_alias(self, name: str, alias: str, ref: str, force: bool = False) -> AliasRecord:
        params = {"force": "true"} if force else None
        return _alias(
            self._request("PUT", f"/models/{_q(name)}/aliases/{_q(alias)}", json={"version": ref}, params=params)
        )

    def verify(self, ref: str | None = None, rerun_checks: bool = True):
        params = {"check": "true" if rerun_checks else "false", **({"ref": ref} if ref is not None else {})}
        answer = self._request("POST", "/verify", params=params)
        answer.pop("passed", None)
        return VerifyResult.model_validate(answer)

    def audit(self, model: str | None = None, user: str | None = None) -> list[AuditRecord]:
        params = {k: v for k, v in (("model", model), ("user", user)) if v is not None}
        return [_audit(e) for e in self._request("GET", "/audit", params=params)["entries"]]

    def verify_audit(self, pinned_head: str | None = None) -> list[str]:
        return self.check_audit(pinned_head).problems

    def check_audit(self, pinned_head: str | None = None):
        """The server's audit chain verified (registry.audit_chain.AuditCheck), against `pinned_head` if given."""
        params = {"verify": "true", **({"expect_head": pinned_head} if pinned_head is not None else {})}
        answer = self._request("GET", "/audit", params=params)
        head = answer.get("head")
        return AuditCheck(
            problems=list(answer.get("chain_problems") or []),
            head=None if head is None else AuditHead(head["seq"], head["hash"]),
            entries=len(answer.get("entries", [])),
        )

    def record_drift(self, ref: str, report) -> DriftRecord:
        """Store a drift report on the server against `ref` (refused there unless the report's statistics are that
        version's)."""
        name, version = _split(ref)
        body = report.model_dump(mode="json") if hasattr(report, "model_dump") else report
        return DriftRecord.model_validate(
            self._request("POST", f"/models/{_q(name)}/versions/{_q(version)}/drift/reports", json=body)
        )

    def gc(self, grace_seconds: float = 3600.0):
        return GcResult.model_validate(self._request("POST", "/gc", params={"grace": grace_seconds}))

    @contextmanager
    def _model_download(self, ref: str, fmt: str | None) -> Iterator[tuple[Path, ModelFile]]:
        """GET .../model into a temporary file, its sha256 checked against X-Normbridge-Digest and its version and
        format headers against what was asked; yields (the file, a ModelFile of those without data)."""
        name, version = _split(ref)
        path = f"/models/{_q(name)}/versions/{_q(version)}/model?format={_q(fmt or 'source')}"
        with self._download(path, f"downloading {ref}") as (body, headers):
            served = served_ref(self.url, ref, headers.get("X-Normbridge-Version"))
            written = served_format(self.url, ref, fmt, headers.get("X-Normbridge-Format"))
            with open(body, "rb") as handle:
                got = hashlib.file_digest(handle, "sha256").hexdigest()
            announced = headers.get("X-Normbridge-Digest")
            if announced != got:
                raise IntegrityError(
                    f"the model file of {ref} downloaded from {self.url} hashes to {got[:12]} but the server announced "
                    f"{str(announced)[:12]}; it was not used: retry, or run `normbridge verify {ref}` on the server."
                )
            yield body, ModelFile(served, written, b"", got)

    def model_file(self, ref: str, fmt: str | None = None, progress=None) -> ModelFile:
        """The version as one file from GET .../model (streamed; its sha256 must be the X-Normbridge-Digest the server
        sent)."""
        with self._model_download(ref, fmt) as (body, file):
            return ModelFile(file.ref, file.format, body.read_bytes(), file.sha256)

    def pull(self, ref: str, path: str | Path, fmt: str | None = None, progress=None) -> PullResult:
        """Download the version's model file (digest, version and format checked) and move it to `path` atomically, in
        chunks, as `Registry.pull` writes it; nothing is written when a check fails."""
        if fmt in FOLDER_FORMATS:
            return self._pull_folder(ref, path, progress)
        try:
            with self._model_download(ref, fmt) as (body, file):
                target = pulled_path(path, file.ref, file.suffix)
                with open(body, "rb") as source, atomic_writer(target) as stream:
                    shutil.copyfileobj(source, stream, 1 << 20)
                return PullResult(
                    ref=file.ref, path=str(target), format=file.format, digest=file.sha256, nbytes=body.stat().st_size
                )
        except (
            RegistryError
        ):  # the server gives no single file of a folder version: then its bundle, written as the folder
            if self._folder_format(ref, fmt) is None:
                raise
            return self._pull_folder(ref, path, progress)

    def _pull_folder(self, ref: str, path: str | Path, progress=None) -> PullResult:
        """The version's bundle (extracted to disk, each blob re-hashed) written as the folder it was registered
        from."""
        with self._bundle_on_disk(ref) as (manifest, get, version):
            target = folder_target(path, version)
            written = write_version_folder(manifest, get, 4, target, progress)
            return PullResult(
                ref=version,
                path=str(target),
                format=manifest.structure.format,
                digest=manifest.digest(),
                nbytes=written,
            )

    def load(self, ref: str) -> Any:
        """The version as its framework's object, read from the downloaded file by the framework's safe reader (a folder
        version: the transformers model, from its bundle)."""
        try:
            file = self.model_file(ref)
        except RegistryError:
            if self._folder_format(ref, None) is None:
                raise
            with self._bundle_on_disk(ref) as (manifest, get, _):
                return load_version_folder(manifest, get, 4)
        return read_back(file.ref, file.format, self.manifest(file.ref).framework, file.data)

    def _folder_format(self, ref: str, fmt: str | None) -> str | None:
        """The folder format `ref` is given back in when `fmt` asks for its source (or that folder format);
        else None."""
        if fmt not in (None, "source", *FOLDER_FORMATS):
            return None
        structure = self.manifest(ref).structure
        return structure.format if structure is not None and structure.format in FOLDER_FORMATS else None

    def export(self, ref: str, to: str, folder: str | Path):
        """Download the version's bundle (re-hashed) and write each normalization layer locally,
        as `Registry.export` does."""
        with self._bundle(ref) as (artifact, version):
            return export_layers(artifact.manifest, list(artifact.specs), to, folder, version)


# -- what a server's headers may say ------------------------------------------------------------


def served_ref(url: str, requested: str, announced: str | None) -> str:
    """The NAME@N a server says it sent for `requested`: a version of the model asked for (the very one when a number
    was asked), else IntegrityError. The answer names files (NAME-N.onnx),
    so a header such as '../../x@1' is never used."""
    name, suffix = _split(requested)
    number = re.fullmatch(rf"{re.escape(name)}@([1-9][0-9]{{0,17}})", announced or "")
    if number is None or (suffix.isdigit() and int(suffix) != int(number.group(1))):
        raise IntegrityError(
            f"{url} answered {requested} with the version {str(announced)[:80]!r}, which is not "
            f"{name + '@' + suffix if suffix.isdigit() else 'a version of ' + name}; nothing was used or written: check "
            "that --server points at a normbridge server you trust."
        )
    return announced


def served_format(url: str, requested: str, fmt: str | None, announced: str | None) -> str:
    """The format a server says it sent: one `pull` writes, and the one asked for unless that was 'source';
    else IntegrityError."""
    if announced not in SUFFIXES or (fmt not in (None, "source") and announced != fmt):
        expected = f"'{fmt}'" if fmt not in (None, "source") else f"one of {', '.join(SUFFIXES)}"
        raise IntegrityError(
            f"{url} answered {requested} with the format {str(announced)[:40]!r}, not {expected}; nothing was used or "
            "written: check that --server points at a normbridge server you trust."
        )
    return announced


# -- JSON -> records ---------------------------------------------------------------------------


def _q(part: str) -> str:
    return quote(str(part), safe="")


def _split(ref: str) -> tuple[str, str]:
    """'name@N' / 'name@alias' / 'name' -> (name, version part; 'latest' when absent), by the local registry's rules."""
    name, suffix = split_ref(str(ref))
    return name, suffix or "latest"


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


def _version(v: dict) -> VersionRecord:
    return _adapter(VersionRecord).validate_python(v)


def _alias(a: dict) -> AliasRecord:
    return _adapter(AliasRecord).validate_python(a)


def _audit(e: dict) -> AuditRecord:
    return _adapter(AuditRecord).validate_python(e)


def check_result(document: dict):
    """A CheckResult from its JSON; errors that overflowed to inf/NaN arrive as null
    (JSON has neither) and come back as NaN."""
    document = copy.deepcopy(document)
    for _ in range(8):  # one pass per nesting of nulls is plenty; a report that still fails is returned as None
        try:
            return CheckResult.model_validate(document)
        except ValidationError as error:
            nulls = [e["loc"] for e in error.errors() if e["type"] == "float_type" and e.get("input") is None]
            if not nulls:
                return None
            for loc in nulls:
                target = document
                for key in loc[:-1]:
                    target = target[key]
                target[loc[-1]] = float("nan")
    return None


def _rebuild(cls: type[NormbridgeError], message: str, body: dict) -> NormbridgeError:
    """An error of `cls` carrying the server's message as is (it already names the layer), its layer,
    setting and report."""
    error = cls.__new__(cls)
    NormbridgeError.__init__(error, message)
    error.layer, error.setting = body.get("layer"), body.get("setting")
    if isinstance(error, CheckFailedError):
        report = body.get("report")
        error.result = check_result(report) if report else None
    if cls.__name__ == "NotExpressibleError":
        error.target = None
    return error


__all__ = ["RemoteRegistry"]
