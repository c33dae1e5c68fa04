"""The bridge to an MLflow Model Registry: push a normbridge version out, import an MLflow model in.

Push logs the version to an MLflow run and creates a registered-model version whose source is that
folder, tagged with the normbridge digest, lineage and equivalence verdict, so an MLflow user can
trace the model back and re-verify it. A version registered from a model file is pushed as a
runnable MLflow model (registry/mlflow_model.py) with its manifest.json beside it, the weights
only in the model file; a torch nn.Module version as its artifact bundle (manifest.json + blobs,
as `save_artifact_folder` writes it). Artifacts go to the tracking server's artifact store (or
beside a local sqlite tracking database), never into the working directory. Import goes the other way through the
normal gate (`Registry.register(..., operation="imported")`): ONNX, Keras 3 (.keras, safe_mode)
and torch.export (.pt2) flavours are read without executing code; a pickled PyTorch model is
refused unless the caller explicitly trusts the source, because unpickling runs arbitrary code.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.errors import InputFileError, NormbridgeError, NotFoundError, RegistryError, ServerUnreachableError

from .artifact import extract_artifact
from .manifest_io import BLOBS_DIR, MANIFEST_FILE, Artifact, save_artifact_folder
from .mlflow_model import write_mlflow_model

EXPERIMENT = "normbridge"
BUNDLE_PATH = "normbridge-artifact"
TAG_PREFIX = "normbridge."
PICKLE_WARNING = (
    "warning: --trust-pickle: loading a pickled PyTorch model executes code stored in it; "
    "do this only for a model from a source you trust."
)


@dataclass(frozen=True)
class PushResult:
    """What `push` did: the MLflow model version (new, or an existing one with the same digest)."""

    name: str  # registered model name in MLflow
    version: str  # MLflow model version number
    run_id: str
    source: str
    tags: dict[str, str]
    created: bool
    servable: bool = False  # the pushed folder is an MLflow model too (the version was registered from a model file)


@dataclass(frozen=True)
class ImportResult:
    """What `import_model` did: the normbridge registration and which MLflow flavour it came from."""

    registration: Any  # registry.service.Registration
    flavor: str  # onnx | keras | pytorch-pt2 | pytorch-pickle | normbridge-bundle
    model_uri: str


def tracking_uri(explicit: str | None) -> str:
    """--tracking-uri, else $MLFLOW_TRACKING_URI; never MLflow's implicit ./mlruns."""
    uri = explicit or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise RegistryError(
            "no MLflow tracking server was given; pass --tracking-uri http://HOST:PORT or set MLFLOW_TRACKING_URI."
        )
    return uri


def _client(uri: str):
    """A client bound to `uri`; an HTTP server that does not answer fails in seconds,
    not after MLflow's minutes of retries."""
    from mlflow.tracking import MlflowClient

    if uri.startswith(("http://", "https://")):
        _probe(uri)

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _probe(uri: str) -> None:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=10):
            return
    except urllib.error.HTTPError:
        return  # it answered: authentication or routing is MLflow's to report
    except OSError as error:
        raise ServerUnreachableError(
            f"the MLflow tracking server at '{uri}' did not answer ({error}); "
            "start it (mlflow server) or fix --tracking-uri / MLFLOW_TRACKING_URI."
        ) from error


def _mlflow_error(action: str, error: Exception) -> RegistryError:
    message = getattr(error, "message", None) or str(error)
    return RegistryError(
        f"MLflow refused to {action} ({type(error).__name__}: {message.splitlines()[0] if message else ''}); "
        "check the tracking URI and that the server is running."
    )


# ---------------------------------------------------------------------------------------- push


def version_tags(record, manifest) -> dict[str, str]:
    """The normbridge facts an MLflow user needs to trace and re-verify the version."""
    checks = manifest.equivalence
    passed = sum(bool(check.get("passed")) for check in checks)
    verdict = "passed" if passed == len(checks) else "failed"
    kinds: dict[str, int] = {}
    for entry in manifest.normalizers:
        kind = str(entry.spec.get("kind", "?"))
        kinds[kind] = kinds.get(kind, 0) + 1
    return {
        f"{TAG_PREFIX}digest": record.digest,
        f"{TAG_PREFIX}content_digest": record.content_digest,
        f"{TAG_PREFIX}version": f"{record.model}@{record.number}",
        f"{TAG_PREFIX}parent": record.parent or "",
        f"{TAG_PREFIX}operation": record.operation,
        f"{TAG_PREFIX}equivalence": f"{verdict} {passed}/{len(checks)}",
        f"{TAG_PREFIX}normalizers": f"{len(manifest.normalizers)}"
        + (" (" + ", ".join(f"{kind} x{count}" for kind, count in sorted(kinds.items())) + ")" if kinds else ""),
    }


def save_version_bundle(registry, ref: str, folder: str | Path) -> Path:
    """The version's artifact folder (manifest + every blob, re-hashed on read) written to `folder`."""
    record = registry.show(ref)
    manifest = registry.manifest(f"{record.model}@{record.number}")
    get = registry.blob_reader(record)  # names the tensor when a stored blob is tampered with
    blobs = {digest: get(digest) for digest in manifest.blob_digests()}
    return save_artifact_folder(Artifact(manifest=manifest, blobs=blobs), folder)


def push(registry, ref: str, tracking: str | None = None, name: str | None = None) -> PushResult:
    """Register normbridge version `ref` in the MLflow Model Registry (model name defaults to the normbridge name).

    A version already pushed (same model name and normbridge digest) is returned as it is (created=False).
    """
    from mlflow.exceptions import MlflowException

    record = registry.show(ref)
    manifest = registry.manifest(f"{record.model}@{record.number}")
    name = name or record.model
    tags = version_tags(record, manifest)
    client = _client(tracking_uri(tracking))
    # MLflow prints "View run ..." links: keep stdout for the command's own output (e.g. --json).
    with contextlib.redirect_stdout(sys.stderr):
        try:
            existing = _pushed_version(client, name, record.digest)
            if existing is not None:
                return PushResult(
                    name,
                    existing.version,
                    existing.run_id or "",
                    existing.source,
                    dict(existing.tags),
                    created=False,
                    servable=manifest.structure is not None,
                )
            run_id = _log_bundle(client, registry, record, tags)
            try:
                client.create_registered_model(
                    name, description="Registered by normbridge (normalization-layer registry)."
                )
            except MlflowException as error:
                if error.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            source = f"{client.get_run(run_id).info.artifact_uri}/{BUNDLE_PATH}"
            version = client.create_model_version(
                name,
                source,
                run_id=run_id,
                tags=tags,
                description=f"normbridge {record.model}@{record.number}: {record.note or ''}".strip(),
            )
        except MlflowException as error:
            raise _mlflow_error(f"register '{name}'", error) from error
    return PushResult(
        name, version.version, run_id, source, tags, created=True, servable=manifest.structure is not None
    )


def _pushed_version(client, name: str, digest: str):
    """The MLflow version of `name` already tagged with `digest`, if any."""
    from mlflow.exceptions import MlflowException

    try:
        versions = client.search_model_versions(f"name = '{name}'")
    except MlflowException:
        return None
    return next((v for v in versions if v.tags.get(f"{TAG_PREFIX}digest") == digest), None)


def _log_bundle(client, registry, record, tags: dict[str, str]) -> str:
    """A finished run in experiment 'normbridge' holding the pushed folder under BUNDLE_PATH.

    The folder holds the weights once: in the MLflow model's file when the version has one (manifest.json beside it, and
    `import_model` rebuilds the blobs from the file), else as the bundle's blobs.
    """
    experiment = client.get_experiment_by_name(EXPERIMENT)
    experiment_id = (
        experiment.experiment_id if experiment else client.create_experiment(EXPERIMENT, **_artifact_location(client))
    )
    run = client.create_run(experiment_id, run_name=f"{record.model}@{record.number}", tags=tags)
    try:
        _refuse_working_directory_artifacts(client.tracking_uri, run.info.artifact_uri)
        with tempfile.TemporaryDirectory(prefix="normbridge-mlflow-") as tmp:
            folder = Path(tmp) / BUNDLE_PATH
            folder.mkdir()
            ref = f"{record.model}@{record.number}"
            if write_mlflow_model(registry, ref, folder) is None:  # a torch nn.Module: the bundle is all there is
                folder = save_version_bundle(registry, ref, folder)
            else:
                (folder / MANIFEST_FILE).write_text(registry.manifest(ref).to_json() + "\n")
            client.log_artifacts(run.info.run_id, str(folder), artifact_path=BUNDLE_PATH)
    except BaseException:
        client.set_terminated(run.info.run_id, status="FAILED")
        raise
    client.set_terminated(run.info.run_id, status="FINISHED")
    return run.info.run_id


def _artifact_location(client) -> dict[str, str]:
    """Where a new experiment keeps its artifacts: the server's store over HTTP; beside a local database, never MLflow's
    default ./mlruns in whatever folder the command runs from."""
    path = _artifact_location_path(client.tracking_uri)
    return {"artifact_location": path.as_uri()} if path is not None else {}


def _artifact_location_path(tracking: str) -> Path | None:
    """'mlartifacts' beside the database of a sqlite:/// tracking URI; None for a server."""
    if tracking.startswith("sqlite:///"):
        return Path(tracking[len("sqlite:///") :]).resolve().parent / "mlartifacts"
    return None


def _refuse_working_directory_artifacts(tracking: str, artifact_uri: str) -> None:
    """Refuse, before anything is written, a run whose artifacts would land in the folder this command runs from: an
    experiment created with MLflow's default ./mlruns, or a server without an artifact proxy naming a relative root.
    The folder beside a local tracking database (`_artifact_location`) is the explicit place the user named."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(artifact_uri)
    if parsed.scheme not in ("", "file"):
        return  # the server's artifact store (mlflow-artifacts:/, s3://, ...)
    path = Path(unquote(parsed.path))
    beside_database = _artifact_location_path(tracking)
    if path.is_absolute() and beside_database is not None and path.resolve().is_relative_to(beside_database):
        return
    if not path.is_absolute() or path.resolve().is_relative_to(Path.cwd().resolve()):
        raise RegistryError(
            f"the MLflow experiment '{EXPERIMENT}' stores artifacts at '{artifact_uri}', inside the folder this "
            "command runs from; give the server an artifact store (mlflow server --artifacts-destination DIR) "
            f"or give the experiment an artifact location elsewhere; nothing was written."
        )


# -------------------------------------------------------------------------------------- import


def default_name(model_uri: str) -> str | None:
    """'models:/NAME/...' or 'models:/NAME@alias' -> NAME; other URIs carry no usable name."""
    if not model_uri.startswith("models:/"):
        return None
    head = model_uri[len("models:/") :].split("/")[0]
    name = head.split("@")[0]
    return None if name.startswith("m-") else name  # MLflow 3 logged-model ids are not names


def import_model(
    registry,
    model_uri: str,
    tracking: str | None = None,
    name: str | None = None,
    trust_pickle: bool = False,
    warn=None,
) -> ImportResult:
    """Download the MLflow model at `model_uri` and register it through the equivalence gate as 'imported'.

    Raises:
        InputFileError: the model is pickled and `trust_pickle` is False, or it has no flavour normbridge reads.
        RegistryError: no name could be derived, or MLflow refused a request.
        ServerUnreachableError: the tracking server did not answer.
    """
    name = name or default_name(model_uri)
    if not name:
        raise RegistryError(f"cannot derive a normbridge model name from '{model_uri}'; pass --name NAME.")
    uri = tracking_uri(tracking)
    with tempfile.TemporaryDirectory(prefix="normbridge-mlflow-") as tmp:
        with contextlib.redirect_stdout(sys.stderr):
            local = _download(model_uri, uri, Path(tmp))
        if (local / MANIFEST_FILE).is_file() and not (local / BLOBS_DIR).is_dir():  # pushed with its model file
            local = rebuilt_bundle(local, Path(tmp) / "rebuilt")
        flavor, path = locate_model_file(local)
        note = f"imported from MLflow {model_uri} ({flavor})"
        if flavor == "pytorch-pickle":
            if not trust_pickle:
                raise InputFileError(
                    f"'{model_uri}' is a pickled PyTorch model and loading it can execute arbitrary code; nothing was loaded: "
                    "pass --trust-pickle only if the model comes from a source you trust, or log it as ONNX, Keras or pt2."
                )
            (warn or (lambda text: None))(PICKLE_WARNING)
            model = _load_pickled_torch(path)
        else:
            model = path
        registration = registry.register(name, model, note=note, operation="imported")
    return ImportResult(registration=registration, flavor=flavor, model_uri=model_uri)


def _download(model_uri: str, uri: str, folder: Path) -> Path:
    from mlflow.exceptions import MlflowException

    try:
        return Path(_download_with(_client(uri), model_uri, uri, folder))
    except MlflowException as error:
        if error.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"):
            raise NotFoundError(
                f"MLflow has no model at '{model_uri}'; check the URI (runs:/RUN/PATH, models:/NAME/VERSION)."
            ) from error
        raise _mlflow_error(f"download '{model_uri}'", error) from error
    except OSError as error:
        raise _mlflow_error(f"download '{model_uri}'", error) from error


def _download_with(client, model_uri: str, uri: str, folder: Path) -> str:
    """Download `model_uri`, resolving models:/ URIs on OUR client: MLflow 3.17 resolves them on the global registry
    URI."""
    import mlflow.artifacts
    from mlflow.store.artifact.models_artifact_repo import ModelsArtifactRepository
    from mlflow.store.artifact.utils.models import get_model_name_and_version

    if ModelsArtifactRepository.is_models_uri(model_uri):
        base, inner = ModelsArtifactRepository.split_models_uri(model_uri)
        found = get_model_name_and_version(client, base)
        if len(found) == 1:
            location = client.get_logged_model(found[0]).artifact_location
        else:
            location = client.get_model_version_download_uri(*found)
        model_uri = location.rstrip("/") + (f"/{inner}" if inner else "")
    return mlflow.artifacts.download_artifacts(
        artifact_uri=model_uri, dst_path=str(folder), tracking_uri=uri, registry_uri=uri
    )


def locate_model_file(local: Path, bundle: bool = True) -> tuple[str, Path]:
    """(flavour, file) of a downloaded MLflow model folder (or pushed normbridge bundle),
    preferring formats that load without pickle.

    Reads only the MLmodel YAML and file names: nothing in the model is deserialised here.
    """
    import yaml

    if (
        bundle and (local / MANIFEST_FILE).is_file() and (local / BLOBS_DIR).is_dir()
    ):  # pushed by `normbridge mlflow push`: safetensors only
        return "normbridge-bundle", local
    mlmodel = local / "MLmodel"
    if not mlmodel.is_file():
        raise InputFileError(
            f"'{local.name}' holds no MLmodel file; pass the URI of an MLflow model (e.g. runs:/RUN/model)."
        )
    try:
        flavors = (yaml.safe_load(mlmodel.read_text()) or {}).get("flavors", {})
    except yaml.YAMLError as error:
        raise InputFileError(f"the MLmodel file of the model is not valid YAML ({error}).") from error
    if not isinstance(flavors, dict) or not all(isinstance(conf, dict) for conf in flavors.values()):
        raise InputFileError("the MLmodel file of the model has no 'flavors' mapping; pass the URI of an MLflow model.")
    if "onnx" in flavors:
        path = _inside(local, flavors["onnx"].get("data", "model.onnx"))
        if path.is_file():
            return "onnx", path
    if "keras" in flavors:
        conf = flavors["keras"]
        path = _inside(local, conf.get("data", "data")) / "model.keras"
        if path.is_file() and not conf.get("save_exported_model"):
            return "keras", path
    if "pytorch" in flavors:
        data = _inside(local, flavors["pytorch"].get("model_data", "data"))
        if (data / "model.pt2").is_file():
            return "pytorch-pt2", data / "model.pt2"
        if (data / "model.pth").is_file():
            return "pytorch-pickle", data
    raise InputFileError(
        f"the MLflow model has flavours {sorted(flavors)} but none normbridge reads; "
        "log it with mlflow.onnx, mlflow.keras (.keras) or mlflow.pytorch (serialization_format='pt2')."
    )


def rebuilt_bundle(local: Path, folder: Path) -> Path:
    """The bundle of a version pushed with its model file: the pushed manifest,
    with blobs read from the file MLflow holds.

    The file is read as any MLflow model is (locate_model_file, then the framework's safe reader); it must hold exactly
    what the manifest says (same content digest), or nothing is registered.
    """
    from schemas.manifest import load_manifest

    try:
        manifest = load_manifest(json.loads((local / MANIFEST_FILE).read_text()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputFileError(f"the pushed {MANIFEST_FILE} is not readable JSON ({error}).") from error
    flavor, path = locate_model_file(local, bundle=False)
    read = extract_artifact(path)
    if read.manifest.content_digest() != manifest.content_digest():
        raise InputFileError(
            f"the {flavor} model file MLflow holds is not the one normbridge pushed (content digest "
            f"{read.manifest.content_digest()[:12]}, the pushed manifest says {manifest.content_digest()[:12]}); "
            "nothing was registered."
        )
    return save_artifact_folder(Artifact(manifest=manifest, blobs=read.blobs), folder)


def _inside(local: Path, relative: Any) -> Path:
    """`local / relative`, refused when the MLmodel names a path outside the downloaded model ('/etc/x', '../x')."""
    path = (local / str(relative)).resolve()
    if not isinstance(relative, str) or not path.is_relative_to(local.resolve()):
        raise InputFileError(
            f"the MLmodel file names the data path {relative!r}, which is outside the model's own folder; "
            "normbridge reads only files MLflow downloaded with the model."
        )
    return path


def _load_pickled_torch(data: Path) -> Any:
    """The module in an MLflow pickled-PyTorch data folder (runs the pickle: only after the caller trusted it)."""
    import mlflow.pytorch

    try:
        model = mlflow.pytorch.load_model(str(data.parent))
    except NormbridgeError:
        raise
    except Exception as error:  # unpickling can fail in many ways
        raise InputFileError(
            f"the pickled PyTorch model could not be loaded ({type(error).__name__}: {error})."
        ) from error
    return model
