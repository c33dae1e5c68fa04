"""`export` and `contract` say what they did (issue 16 items 5, 6, 7 and 9).

The opset cap runs as real processes (with --verbose the frameworks' own lines are on, and no traceback
may reach stderr); the other rows run the console script's app in this process (tests.cli_run.invoke_cli).

5. `export --opset N` writes a file at opset N or below (converted down with onnx's version
   converter) or refuses with the reason and a non-zero exit, and never prints a traceback; above
   the newest opset onnx knows, the exporter is asked for that newest one.
6. `export` repeats every warning- and error-level hazard `inspect` reports on the same file, in
   its text and its JSON (`hazards`), and refuses error-level ones unless `--force`.
7. `contract` on a file with one layer's eps changed names the first differing output, the layer
   and the setting.
9. A single-request contract shows its batch test as skipped, with the reason; the export says
   how many requests its seeded sample has.
10. `recalibrate` no longer ends with "the artifact registry does not exist yet"; it says how to
   register the file it wrote (or to pass --register).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from converters.models.inspection import inspect_path
from converters.models.loading import load_model
from converters.models.serving.contract import contract_test
from tests.cli_run import invoke_cli, run_cli
from testkit.model_zoo import torch_resnet_small, train_batchnorm_statistics

pytestmark = pytest.mark.slow

#: The BatchNorm layers of torch_resnet_small in execution order (the order torch.onnx writes their nodes).
RESNET_NORMS = [
    "stem.1",
    "layer1.0.bn1",
    "layer1.0.bn2",
    "layer1.1.bn1",
    "layer1.1.bn2",
    "layer2.0.bn1",
    "layer2.0.bn2",
    "layer2.0.downsample.1",
    "layer2.1.bn1",
    "layer2.1.bn2",
]


def _save_program(model: nn.Module, path: Path, shape: tuple[int, ...]) -> None:
    program = torch.export.export(
        model.eval(), (torch.randn(*shape),), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},)
    )
    torch.export.save(program, path)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """trained.pt2 (a small ResNet whose BatchNorms saw data), untrained.pt2 (never did), untracked.pt2
    (batch statistics at eval), samples."""
    folder = tmp_path_factory.mktemp("serving_honesty")
    torch.manual_seed(0)
    batches = [
        torch.randn(8, 3, 32, 32) * 2 + 0.5 for _ in range(30)
    ]  # 0.9 ** 30 < 5% of the initial statistics left: converged
    _save_program(train_batchnorm_statistics(torch_resnet_small(), batches), folder / "trained.pt2", (2, 3, 32, 32))
    _save_program(torch_resnet_small(), folder / "untrained.pt2", (2, 3, 32, 32))
    untracked = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8, track_running_stats=False),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )
    _save_program(untracked, folder / "untracked.pt2", (2, 3, 16, 16))
    rng = np.random.default_rng(0)
    np.save(folder / "one.npy", rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    np.save(folder / "inputs.npy", (rng.standard_normal((16, 3, 32, 32)) * 3 - 1).astype(np.float32))
    return folder


@pytest.fixture(scope="module")
def at_17(work) -> tuple:
    """`export trained.pt2 --opset 17` with --verbose (the frameworks' own lines on): (process, written file)."""
    result = run_cli("--verbose", "export", "trained.pt2", "-o", "at17.onnx", "--opset", "17", cwd=work, columns=200)
    return result, work / "at17.onnx"


# -- 5. the opset cap ---------------------------------------------------------------------------------


def test_export_at_opset_17_writes_opset_17_without_a_traceback(at_17):
    result, path = at_17
    assert result.returncode == 0, result.stderr
    model = onnx.load(path)
    assert {o.domain or "ai.onnx": o.version for o in model.opset_import}["ai.onnx"] == 17
    assert (
        "Traceback" not in result.stderr + result.stdout
    )  # even with --verbose: torch.onnx is never asked below its own opset
    assert "converted down to opset 17" in result.stdout and "file opset 17" in result.stdout
    assert all(
        n.op_type != "ReduceMean" or all(a.name != "noop_with_empty_axes" for a in n.attribute)
        for n in model.graph.node
    )


def test_export_below_what_the_converter_can_reach_is_refused_with_the_reason(work):
    result = run_cli("export", "trained.pt2", "-o", "at14.onnx", "--opset", "14", cwd=work, columns=200)
    assert result.returncode == 5, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "cannot take the graph down to --opset 14" in result.stderr and "BatchNormalization" in result.stderr
    assert "pass a higher --opset" in result.stderr
    assert not (work / "at14.onnx").exists()


def test_export_above_the_newest_opset_onnx_knows_asks_the_exporter_for_that_one(work):
    newest = onnx.defs.onnx_opset_version()
    done = invoke_cli("export", "trained.pt2", "-o", "above.onnx", "--opset", str(newest + 2), "--json", cwd=work)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # torch.onnx asked for an opset onnx does not know exports at 18 and logs a traceback; asked for the newest,
    # it writes that one
    assert result["exporter"].endswith(f"at opset {newest}") and result["opset"] == newest
    assert (
        f"onnx {onnx.__version__} knows opsets up to {newest}; the exporter was asked for {newest}, within the --opset {newest + 2} cap"
        in result["notes"]
    )
    assert {o.domain or "ai.onnx": o.version for o in onnx.load(work / "above.onnx").opset_import}["ai.onnx"] == newest


# -- 6. hazards -----------------------------------------------------------------------------------------


def test_export_repeats_inspect_s_warnings_and_errors(work):
    inspection = inspect_path(work / "untrained.pt2")  # what `inspect` reports (its --json is this model's dump)
    expected = sorted(
        (where, h.code, h.severity) for where, h in inspection.all_hazards() if h.severity in ("warning", "error")
    )
    assert {code for _, code, _ in expected} == {"never_trained"} and len(expected) == len(RESNET_NORMS)

    exported = invoke_cli("export", "untrained.pt2", "-o", "untrained.onnx", "--json", cwd=work)
    assert exported.returncode == 0, exported.stderr  # warnings do not refuse
    result = json.loads(exported.stdout)
    assert sorted((h["layer"], h["code"], h["severity"]) for h in result["hazards"]) == expected
    text = invoke_cli("export", "untrained.pt2", "-o", "untrained_text.onnx", cwd=work, columns=200)
    assert text.returncode == 0, text.stderr
    # one line for the ten identical hazards (issue 35 §3): the first three layers named, the rest counted
    assert text.stdout.count("warning never_trained") == 1 and "contract PASSED" in text.stdout
    assert (
        f"at {', '.join(RESNET_NORMS[:3])} and {len(RESNET_NORMS) - 3} more ({len(RESNET_NORMS)} layers)" in text.stdout
    )
    assert "hazard(s) in the source" in text.stdout


def test_export_of_a_trained_model_has_no_hazards(at_17):
    result, _ = at_17
    assert "never_trained" not in result.stdout and "hazard(s) in the source" not in result.stdout


def test_an_error_level_hazard_refuses_the_export_unless_forced(work):
    text = invoke_cli("export", "untracked.pt2", "-o", "untracked.onnx", cwd=work, columns=200)
    assert text.returncode == 7, text.stderr
    assert "error batch_stats_at_eval" in text.stdout and "error-level hazard(s) in the source refuse" in text.stdout
    assert not (work / "untracked.onnx").exists()

    forced = invoke_cli("export", "untracked.pt2", "-o", "untracked.onnx", "--force", "--json", cwd=work)
    assert forced.returncode == 0, forced.stderr
    result = json.loads(forced.stdout)
    assert result["written"] and result["forced"] and (work / "untracked.onnx").is_file()
    assert [h["code"] for h in result["hazards"]] == ["batch_stats_at_eval"]


# -- 7. a contract that fails names the layer and the setting ----------------------------------------------


def test_contract_names_the_output_the_layer_and_the_setting_of_a_changed_eps(work, at_17):
    _, path = at_17
    model = onnx.load(path)
    norms = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert len(norms) == len(RESNET_NORMS)
    next(a for a in norms[3].attribute if a.name == "epsilon").f = 0.5
    onnx.save(model, work / "eps_changed.onnx")

    text = invoke_cli("contract", "trained.pt2", "eps_changed.onnx", cwd=work, columns=400)
    assert text.returncode == 7, text.stderr
    assert "first differing output: linear" in text.stdout
    assert f"layer {RESNET_NORMS[3]}, graph site {norms[3].name}, setting eps: source 1e-05, serving 0.5" in text.stdout
    source = load_model(work / "trained.pt2")  # the same result as --json prints it, in this process
    result = contract_test(source, work / "eps_changed.onnx")
    assert not result.passed
    assert [(d.source_layer, d.setting, d.expected, d.found) for d in result.differing_settings] == [
        (RESNET_NORMS[3], "eps", "1e-05", "0.5")
    ]
    assert '"differing_settings"' in result.to_json()
    passing = contract_test(source, path)
    assert passing.passed and passing.differing_settings == [] and not any("differing" in f for f in passing.findings)


# -- 9. skipped is skipped; the batch size is said ----------------------------------------------------


def test_a_single_request_contract_says_its_batch_test_was_skipped(work, at_17):
    text = invoke_cli("contract", "trained.pt2", "at17.onnx", "--sample", "one.npy", cwd=work, columns=200)
    assert text.returncode == 0, text.stderr
    rows = [line for line in text.stdout.splitlines() if line.startswith(("│ source", "│ serving"))]
    assert len(rows) == 2 and all("skipped" in row and " ok " not in row for row in rows)
    assert "batch independence skipped: the sample has a single request, so no request can be compared" in text.stdout
    assert "one.npy: 1 request " in text.stdout


def test_a_program_traced_at_batch_one_on_token_ids_is_described_as_such(tmp_path):
    """A static batch of 1 over int64 token ids: the header says token ids and the fixed batch, not 'a batch of 4
    standard normal requests', and the skipped test says how to export a dynamic batch (issue 35)."""
    import torch

    class Tokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.norm = torch.nn.Embedding(8, 6), torch.nn.LayerNorm(6)

        def forward(self, ids):
            return self.norm(self.embed(ids))

    torch.export.save(
        torch.export.export(Tokens().eval(), (torch.zeros(1, 16, dtype=torch.int64),)), str(tmp_path / "t.pt2")
    )
    done = invoke_cli("export", "t.pt2", "--to", "onnx", "-o", "t.onnx", cwd=tmp_path, columns=400)
    assert done.returncode == 0, done.stdout + done.stderr
    text = " ".join(done.stdout.split())
    assert "seeded random batch of 1 request (seed 0; the model's batch size is fixed at 1)" in text, text
    assert "int64[1, 16] integers in [0, 8) (token ids or indices)" in text and "standard normal" not in text
    assert "torch.export.Dim on axis 0" in text


def test_export_says_the_batch_size_of_its_sample(at_17):
    result, _ = at_17
    assert "seeded random batch of 4 requests" in result.stdout


# -- 10. recalibrate points at the registry that exists ----------------------------------------------


def test_recalibrate_says_how_to_register_the_result_and_not_that_the_registry_is_missing(work):
    result = invoke_cli("recalibrate", "trained.pt2", "inputs.npy", "-o", "recalibrated.pt2", cwd=work, columns=300)
    assert result.returncode == 0, result.stderr
    assert "does not exist yet" not in result.stdout + result.stderr and "not registered" not in result.stdout
    assert "normbridge register NAME recalibrated.pt2 --parent NAME@N --operation recalibrated" in result.stdout
    assert "(or recalibrate with --register NAME@N)" in result.stdout
    assert (work / "recalibrated.pt2").is_file()
