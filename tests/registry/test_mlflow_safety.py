"""`normbridge mlflow import` of hostile MLflow models against a real `mlflow server`.

A pickled PyTorch flavour whose unpickling writes a marker is refused without --trust-pickle
(exit 6, bad_input_file, nothing unpickled, nothing registered); a pytorch flavour whose model.pt2
is a crafted archive (a pickle in its sample inputs or a use_pickle weight) is refused the same way,
naming the entry; and an MLmodel whose data path points outside the downloaded model (an absolute
path or '../') is refused instead of registering a file from the importing machine. The pickle row runs
a real process; the others run the console script's app in this process (tests.cli_run.invoke_cli).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from registry.service import Registry
from tests.cli_process import normbridge_command
from tests.cli_run import invoke_cli
from tests.mlflow_server import mlflow_server  # noqa: F401  (module-scoped fixture)
from tests.pt2_crafting import HOSTILE, genuine_pt2

# fixtures
from tests.registry.test_mlflow import MarkingBatchNorm, mlflow_fluent, no_implicit_mlflow_store, store  # noqa: F401
from tests.registry.http.test_http_api import onnx_bytes

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)

ROOT = Path(__file__).resolve().parents[2]


def import_process(
    uri: str, tracking: str, store: dict, *extra: str, process: bool = True
) -> subprocess.CompletedProcess:  # noqa: F811
    """`normbridge mlflow import` as a real process, or in this process (tests.cli_run.invoke_cli) if not `process`."""
    args = [
        "mlflow",
        "import",
        uri,
        "--tracking-uri",
        tracking,
        "--name",
        "imported",
        "--db",
        store["db"],
        "--blobs",
        store["blobs"],
        *extra,
    ]
    if not process:
        return invoke_cli(*args, cwd=ROOT, columns=200)
    command = [*normbridge_command(), *args]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "COLUMNS": "200"}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def assert_nothing_registered(store: dict) -> None:  # noqa: F811
    assert Registry(db=store["db"], blobs=store["blobs"]).models() == []


def log_folder(mlflow, folder: Path) -> str:
    """Upload a hand-made MLflow model folder (MLmodel + data) to a new run; its runs:/ URI."""
    with mlflow.start_run() as run:
        mlflow.log_artifacts(str(folder), artifact_path="model")
    return f"runs:/{run.info.run_id}/model"


def test_a_pickled_pytorch_flavour_is_refused_without_trust_pickle_and_never_unpickled(
    mlflow_fluent, mlflow_server, store, tmp_path
):  # noqa: F811
    marker = tmp_path / "unpickled.txt"
    with mlflow_fluent.start_run():
        info = mlflow_fluent.pytorch.log_model(
            MarkingBatchNorm(marker).eval(), name="model", serialization_format="pickle"
        )
    marker.unlink(missing_ok=True)  # MLflow's own logging round-trips the object; only what import does counts

    refused = import_process(info.model_uri, mlflow_server.url, store)
    assert refused.returncode == 6, refused.stderr[-3000:]
    assert "bad_input_file" in refused.stderr and "--trust-pickle" in refused.stderr, refused.stderr[-3000:]
    assert not marker.exists(), "the pickle ran although --trust-pickle was not given"
    assert_nothing_registered(store)


@pytest.mark.parametrize("attack", ["sample_inputs", "use_pickle_weight"])
def test_a_pt2_flavour_holding_a_crafted_archive_is_refused_naming_the_entry(
    attack, mlflow_fluent, mlflow_server, store, tmp_path
):  # noqa: F811
    folder = tmp_path / "model"
    (folder / "data").mkdir(parents=True)
    marker = tmp_path / "payload.marker"
    genuine = genuine_pt2(tmp_path / "genuine.pt2")
    HOSTILE[attack].build(genuine, folder / "data" / "model.pt2", marker)
    (folder / "MLmodel").write_text("flavors:\n  pytorch:\n    model_data: data\n    pytorch_version: 2.13.0\n")
    uri = log_folder(mlflow_fluent, folder)

    refused = import_process(uri, mlflow_server.url, store, process=False)  # the pickle row above is the real process
    assert refused.returncode == 6 and "bad_input_file" in refused.stderr, refused.stderr[-3000:]
    assert HOSTILE[attack].entry in refused.stderr, refused.stderr[-3000:]
    assert not marker.exists(), f"the '{attack}' payload ran during mlflow import"
    assert_nothing_registered(store)


@pytest.mark.parametrize("where", ["absolute", "parent"])
def test_an_mlmodel_data_path_outside_the_model_folder_is_refused(where, mlflow_fluent, mlflow_server, store, tmp_path):  # noqa: F811
    private = tmp_path / "private.onnx"  # a file of the importing machine, not of the model
    private.write_bytes(onnx_bytes())
    folder = tmp_path / "model"
    folder.mkdir()
    data = str(private) if where == "absolute" else "../../../../../../../../../../.." + str(private)
    (folder / "MLmodel").write_text(f"flavors:\n  onnx:\n    data: {data}\n    onnx_version: 1.17.0\n")
    uri = log_folder(mlflow_fluent, folder)

    refused = import_process(uri, mlflow_server.url, store, process=False)  # the pickle row above is the real process
    assert refused.returncode == 6 and "bad_input_file" in refused.stderr and "outside" in refused.stderr, (
        refused.stderr[-3000:]
    )
    assert_nothing_registered(store)
