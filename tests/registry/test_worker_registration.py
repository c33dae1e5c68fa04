"""A registration run by the warm shared worker is the registration made in process (registry/worker_jobs.py).

Each case registers the same file both ways, into two empty registries: the worker's (through
`register_in_worker`, as the CLI calls it) and this process's (`Registry.register`), then compares
what each stored and answered: the version, its digests, manifest, checks and verdict, the audit entry,
and, for refusals, the error class, message (naming the model as the caller gave it), layer and what was
left stored (nothing). The worker is a real `python -m converters.gate.shared_worker` with the registry's jobs.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
import torch

from converters.gate import shared_worker
from converters.adapters import REGISTRY
from registry.service import Registry
from registry.worker_jobs import worker_jobs, local_store, register_in_worker
from schemas.errors import InputFileError, UnrecognisedNormalizationError
from tests.pt2_crafting import genuine_pt2
from tests.registry.test_unrecognised_gate import block, save_pt2

pytestmark = pytest.mark.slow  # starts a worker process


@pytest.fixture(scope="module")
def worker_folder(tmp_path_factory):
    """A folder whose shared worker (with the registry's jobs, torch, Keras and ONNX imported) serves this module."""
    folder = tmp_path_factory.mktemp("workers")
    worker = shared_worker.connect(folder, REGISTRY.packages, ["torch", "keras", "onnx"], idle=300, jobs=worker_jobs)
    worker.close()
    yield folder
    if not shared_worker.stop(folder, REGISTRY.packages, jobs=worker_jobs):
        with contextlib.suppress(
            ProcessLookupError
        ):  # its socket's name changed (a code file edited meanwhile): by its pid
            os.kill(worker.pid, signal.SIGTERM)


def stores(tmp_path: Path, label: str) -> tuple[str, str]:
    return f"sqlite:///{tmp_path / label / 'registry.db'}", str(tmp_path / label / "blobs")


def both_ways(tmp_path: Path, folder: Path, model: str, **options):
    """(the worker's outcome, this process's outcome, their registries): a Registration or the error raised."""
    outcomes, registries, steps = [], [], []
    for label in ("worker", "here"):
        db, blobs = stores(tmp_path, label)
        registries.append(Registry(db=db, blobs=blobs))
        try:
            if label == "worker":
                done = register_in_worker(
                    folder,
                    REGISTRY.packages,
                    "net",
                    Path(model),
                    db,
                    blobs,
                    None,
                    None,
                    None,
                    False,
                    progress=lambda step, done, total: steps.append(step),
                    **options,
                )
                assert done is not None, "the worker did not run the registration"
            else:
                done = registries[-1].register("net", Path(model))
            outcomes.append(done)
        except Exception as error:  # noqa: BLE001  compared below
            outcomes.append(error)
    return outcomes, registries, steps


def test_the_workers_registration_stores_and_answers_what_an_in_process_one_does(tmp_path, worker_folder, monkeypatch):
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Conv2d(4, 4, 3),
        torch.nn.BatchNorm2d(4),
    ).eval()
    with torch.no_grad():
        for bn in (net[1], net[4]):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
    genuine_pt2(tmp_path / "net.pt2", net, (torch.randn(2, 3, 8, 8),))
    monkeypatch.chdir(tmp_path)  # the model is named relatively, as a user types it
    (ours, theirs), (worker_registry, here_registry), steps = both_ways(tmp_path, worker_folder, "net.pt2")
    assert ours.created and theirs.created
    for field in (
        "model",
        "number",
        "digest",
        "content_digest",
        "parent",
        "operation",
        "user",
        "servable",
        "hazards",
        "structure_checked",
    ):
        assert getattr(ours.version, field) == getattr(theirs.version, field), field
    assert worker_registry.show("net@1").manifest == here_registry.show("net@1").manifest
    assert [c.model_dump(mode="json") for c in ours.checks] == [c.model_dump(mode="json") for c in theirs.checks]
    assert len(ours.checks) == 2 and all(c.passed for c in ours.checks)
    assert (
        list(ours.seconds) == list(theirs.seconds) == ["reading", "gate", "staging", "commit"]
    )  # measured in the worker, sent back
    assert all(isinstance(spent, float) and spent > 0 for spent in ours.seconds.values())
    assert sorted(worker_registry.store.digests()) == sorted(here_registry.store.digests())
    assert [(e.action, e.detail.get("model_input")) for e in worker_registry.audit()] == [
        (e.action, e.detail.get("model_input")) for e in here_registry.audit()
    ]
    assert (
        steps[0] == "extracting the artifact"
        and any(s.startswith("checking") for s in steps)
        and steps[-1] == "committed"
    )
    # the same content again: the existing version, nothing new
    again = register_in_worker(
        worker_folder, REGISTRY.packages, "net", Path("net.pt2"), *stores(tmp_path, "worker"), None, None, None, False
    )
    assert not again.created and again.version.number == 1


def llama_pt2(folder: Path) -> Path:
    """A transformers Llama from a tiny config, random state (tests/real_norms.py), saved as a .pt2."""
    import warnings

    from tests import real_norms as R

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = R.randomise(R.llama())
        model.config.use_cache = False
        ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(0))
        torch.export.save(torch.export.export(model, (ids,)), str(folder / "llama.pt2"))
    return folder / "llama.pt2"


def mobilenet_keras(folder: Path) -> Path:
    """keras.applications MobileNet (weights=None, 32x32, alpha 0.25) with Keras's initial statistics:
    never_trained hazards."""
    import keras

    keras.utils.set_random_seed(0)
    keras.applications.MobileNet(input_shape=(32, 32, 3), alpha=0.25, weights=None, classes=10).save(
        folder / "mobilenet.keras"
    )
    return folder / "mobilenet.keras"


@pytest.mark.parametrize(
    "make", [llama_pt2, mobilenet_keras], ids=["transformers llama .pt2", "keras.applications mobilenet .keras"]
)
def test_models_nobody_here_wrote_register_in_the_worker_as_in_process(tmp_path, worker_folder, monkeypatch, make):
    name = make(tmp_path).name
    monkeypatch.chdir(tmp_path)
    (ours, theirs), (worker_registry, here_registry), _ = both_ways(tmp_path, worker_folder, name)
    assert ours.created and theirs.created and ours.checks and all(c.passed for c in ours.checks)
    for field in ("digest", "content_digest", "servable", "hazards", "structure_checked"):
        assert getattr(ours.version, field) == getattr(theirs.version, field), field
    assert [c.model_dump(mode="json") for c in ours.checks] == [c.model_dump(mode="json") for c in theirs.checks]
    assert worker_registry.show("net@1").manifest == here_registry.show("net@1").manifest


@pytest.mark.parametrize("case", ["corrupt file", "unrecognised normalization"])
def test_a_refusal_in_the_worker_is_the_in_process_refusal(tmp_path, worker_folder, monkeypatch, case):
    if case == "corrupt file":
        (tmp_path / "net.pt2").write_bytes(b"PK\x03\x04 not really a zip")
        expected = InputFileError
    else:
        save_pt2(block(), tmp_path / "net.pt2")
        expected = UnrecognisedNormalizationError
    monkeypatch.chdir(tmp_path)
    (ours, theirs), (worker_registry, here_registry), _ = both_ways(tmp_path, worker_folder, "net.pt2")
    assert type(ours) is type(theirs) is expected
    assert (str(ours), ours.layer, ours.setting) == (str(theirs), theirs.layer, theirs.setting)
    assert "'net.pt2'" in str(ours) or case != "corrupt file"  # named as the caller gave it, not by its absolute path
    assert worker_registry.models() == here_registry.models() == []
    assert sorted(worker_registry.store.digests()) == []
    assert [(e.action, e.detail.get("error"), e.detail.get("model_input")) for e in worker_registry.audit()] == [
        (e.action, e.detail.get("error"), e.detail.get("model_input")) for e in here_registry.audit()
    ]


def test_only_a_local_registry_with_a_running_worker_is_registered_there(tmp_path, worker_folder, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert local_store("sqlite:///rel/registry.db", "blobs") == (
        f"sqlite:///{tmp_path / 'rel/registry.db'}",
        str(tmp_path / "blobs"),
    )
    assert local_store("sqlite:///rel/registry.db", "file:///srv/blobs") == (
        f"sqlite:///{tmp_path / 'rel/registry.db'}",
        "/srv/blobs",
    )
    assert (
        local_store("postgresql://postgres@127.0.0.1:5432/test", "blobs") is None
    )  # its credentials may be the caller's env
    assert local_store("sqlite:///registry.db", "s3://bucket/blobs") is None
    assert local_store("sqlite:///:memory:", "blobs") is None
    genuine_pt2(tmp_path / "net.pt2")
    db, blobs = stores(tmp_path, "none")
    nobody = tmp_path / "no-worker"
    assert (
        register_in_worker(nobody, REGISTRY.packages, "net", Path("net.pt2"), db, blobs, None, None, None, False)
        is None
    )
    assert not list(nobody.glob("*.sock"))  # none was started for it
    for env, value in (
        ("NORMBRIDGE_REGISTER_IN_WORKER", "0"),
        ("NORMBRIDGE_FAULT", "after_check"),
    ):  # a fault must kill the caller
        monkeypatch.setenv(env, value)
        assert (
            register_in_worker(
                worker_folder, REGISTRY.packages, "net", Path("net.pt2"), db, blobs, None, None, None, False
            )
            is None
        )
        monkeypatch.delenv(env)
    assert Registry(db=db, blobs=blobs).models() == []  # nothing was registered by anyone
    done = register_in_worker(
        worker_folder, REGISTRY.packages, "net", Path("net.pt2"), db, blobs, None, None, None, False
    )
    assert done is not None and done.created and Registry(db=db, blobs=blobs).models() == [("net", 1, 1)]


def test_a_caller_that_hangs_up_stops_the_registration_and_the_worker_serves_on(tmp_path, worker_folder):
    genuine_pt2(tmp_path / "net.pt2")
    db, blobs = stores(tmp_path, "gone")
    worker = shared_worker.connect(worker_folder, REGISTRY.packages, [], jobs=worker_jobs)
    first = []

    def hang_up(fields):  # on the first progress frame the caller goes away, as a Ctrl-C'd CLI does
        first.append(fields)
        worker.close()

    args = {
        "db": db,
        "blobs": blobs,
        "user": "tester",
        "name": "net",
        "model": str(tmp_path / "net.pt2"),
        "model_input": "net.pt2",
    }
    assert worker.run("register", args, hang_up) is None
    assert first and first[0][0] == "extracting the artifact"
    again = register_in_worker(
        worker_folder, REGISTRY.packages, "other", tmp_path / "net.pt2", db, blobs, None, None, None, False
    )
    assert again is not None and again.created  # the same worker answers the next caller
    assert Registry(db=db, blobs=blobs).models() == [("other", 1, 1)]  # and the first registration stored nothing


def spread_child(worker_pid: int) -> int | None:
    """The pid of the shared worker's second process (converters/gate/split_check.py: spread legs),
    None while it has none."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == worker_pid and b"converters.gate.check_worker" in command:
            return int(stat.parent.name)
    return None


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def warm_spread_child(folder: Path, model: Path, db: str, blobs: str) -> int:
    """Have the worker run a first registration of `model` into a store of its own (which starts its second process)
    and wait until that process has imported TensorFlow and torch and idles, serving: the next registration's gate
    spreads its legs over both."""
    import time

    worker = shared_worker.connect(folder, REGISTRY.packages, [], jobs=worker_jobs)
    try:
        assert (
            register_in_worker(folder, REGISTRY.packages, "first", model, db, blobs, None, None, None, False)
            is not None
        )
        assert spread_child(worker.pid) is not None  # started as the first registration ended
        deadline, child, last, still = time.monotonic() + 300, None, -1, 0
        while time.monotonic() < deadline:
            child = child or spread_child(worker.pid)
            if child is not None and "libtensorflow" in Path(f"/proc/{child}/maps").read_text():
                ticks = cpu_ticks(child)
                still, last = (still + 1 if ticks == last else 0), ticks
                if still >= 4:
                    return child
            time.sleep(0.5)
        raise AssertionError("the shared worker's second process did not become ready")
    finally:
        worker.close()


def test_a_registration_whose_legs_the_worker_spreads_over_two_processes_is_the_in_process_one(
    tmp_path, worker_folder, monkeypatch
):
    """The worker's gate runs the Keras legs of a .pt2 in its second process: same version, checks and manifest; and a
    model the registration refuses is refused as in process. (That a layer failing the gate still fails with its legs
    spread is tested on the broken adapters and the case table in tests/converters/gate/test_split_check.py.)"""
    torch.manual_seed(1)
    net = torch.nn.Sequential(
        *[m for _ in range(4) for m in (torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.BatchNorm2d(4))]
    ).eval()
    with torch.no_grad():
        for bn in net[1::2]:
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
    genuine_pt2(tmp_path / "net.pt2", net, (torch.randn(2, 4, 8, 8),))
    monkeypatch.chdir(tmp_path)
    child = warm_spread_child(worker_folder, tmp_path / "net.pt2", *stores(tmp_path, "first"))
    before = cpu_ticks(child)
    (ours, theirs), (worker_registry, here_registry), _ = both_ways(tmp_path, worker_folder, "net.pt2")
    assert cpu_ticks(child) > before  # the Keras legs ran there
    assert ours.created and theirs.created and len(ours.checks) == 4 and all(c.passed for c in ours.checks)
    for field in ("digest", "content_digest", "servable", "hazards", "structure_checked"):
        assert getattr(ours.version, field) == getattr(theirs.version, field), field
    assert [c.model_dump(mode="json") for c in ours.checks] == [c.model_dump(mode="json") for c in theirs.checks]
    assert worker_registry.show("net@1").manifest == here_registry.show("net@1").manifest
    save_pt2(block(), tmp_path / "bad.pt2")
    (ours, theirs), (worker_registry, _), _ = both_ways(tmp_path / "refused", worker_folder, str(tmp_path / "bad.pt2"))
    assert type(ours) is type(theirs) is UnrecognisedNormalizationError
    assert (str(ours), ours.layer, ours.setting) == (str(theirs), theirs.layer, theirs.setting)
    assert worker_registry.models() == []
