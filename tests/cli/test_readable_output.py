"""Output a person can read (issue 35 §3): one line per distinct hazard, and a layers table for long transformers names.

Real models, the console script's app run in this process (tests.cli_run.invoke_cli): keras.applications'
EfficientNetV2B0 built without weights (every BatchNorm never trained), transformers' ConvNeXt (eps not the default),
a small torch ResNet trained for 3 batches (unconverged statistics) and transformers' DETR in bfloat16 (long names).
`--json` keeps one entry per layer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.cli_run import invoke_cli
from testkit.model_zoo import torch_resnet_small, train_batchnorm_statistics

pytestmark = pytest.mark.slow

#: The severity and code that start a hazard line of `inspect` and `export`.
HAZARD_LINE = re.compile(r"^(error|warning|info) (\w+) at ", re.MULTILINE)


def _json_hazards(folder: Path, name: str) -> list[dict]:
    done = invoke_cli("inspect", name, "--json", cwd=folder)
    assert done.returncode == 0, done.stderr
    inspection = json.loads(done.stdout)
    by_layer = [{**h, "layer": layer["path"]} for layer in inspection["layers"] for h in layer["hazards"]]
    return by_layer + inspection["hazards"]


def _hazard_lines(text: str) -> list[tuple[str, str]]:
    return HAZARD_LINE.findall(text)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("readable")
    import keras

    keras.applications.EfficientNetV2B0(weights=None, input_shape=(32, 32, 3), classes=4).save(folder / "effnet.keras")
    keras.applications.ConvNeXtTiny(weights=None, input_shape=(32, 32, 3), classes=4).save(folder / "convnext.keras")
    from tests.real_norms import detr

    detr().eval().to(torch.bfloat16).save_pretrained(folder / "detr_bf16")
    torch.manual_seed(0)
    model = train_batchnorm_statistics(torch_resnet_small(), [torch.randn(4, 3, 32, 32) for _ in range(3)]).eval()
    program = torch.export.export(model, (torch.randn(2, 3, 32, 32),))
    torch.export.save(program, folder / "resnet3.pt2")
    untrained = torch.export.export(torch_resnet_small().eval(), (torch.randn(2, 3, 32, 32),))
    torch.export.save(untrained, folder / "untrained.pt2")
    return folder


def test_efficientnet_never_trained_is_one_line_and_json_keeps_every_layer(models):
    entries = _json_hazards(models, "effnet.keras")
    never = [h["layer"] for h in entries if h["code"] == "never_trained"]
    assert len(never) == 59 and len(set(never)) == 59  # every BatchNorm of EfficientNetV2B0, one entry each
    done = invoke_cli("inspect", "effnet.keras", cwd=models, columns=200)
    assert done.returncode == 0, done.stderr
    assert _hazard_lines(done.stdout).count(("warning", "never_trained")) == 1
    assert f"at {', '.join(never[:3])} and 56 more (59 layers): " in done.stdout


def test_convnext_eps_not_default_is_one_line(models):
    entries = [h for h in _json_hazards(models, "convnext.keras") if h["code"] == "eps_not_default"]
    assert len(entries) == 23 and {h["message"] for h in entries} == {  # every LayerNorm of ConvNeXtTiny at eps 1e-6
        "eps is 1e-06, not Keras's default 0.001: fine when the model was built that way, but an eps replaced by a "
        "converter shows up here."
    }
    done = invoke_cli("inspect", "convnext.keras", cwd=models, columns=200)
    assert done.returncode == 0, done.stderr
    assert _hazard_lines(done.stdout).count(("info", "eps_not_default")) == 1
    assert "and 20 more (23 layers): eps is 1e-06" in " ".join(done.stdout.split())


def test_unconverged_resnet_is_one_paragraph_in_inspect_and_export(models):
    entries = [h for h in _json_hazards(models, "resnet3.pt2") if h["code"] == "unconverged_statistics"]
    assert len(entries) == 10  # every BatchNorm: num_batches_tracked=3 at momentum 0.1
    for command in (("inspect", "resnet3.pt2"), ("export", "resnet3.pt2", "-o", "resnet3.onnx")):
        done = invoke_cli(*command, cwd=models, columns=120)
        assert done.returncode == 0, done.stderr
        assert _hazard_lines(done.stdout).count(("warning", "unconverged_statistics")) == 1, done.stdout
        text = " ".join(done.stdout.split())  # the message wraps at the console width
        assert text.count("num_batches_tracked=3 at momentum 0.1") == 1 and "and 7 more (10 layers)" in text
    exported = invoke_cli("export", "resnet3.pt2", "-o", "resnet3_json.onnx", "--json", cwd=models)
    assert [h["code"] for h in json.loads(exported.stdout)["hazards"]].count("unconverged_statistics") == 10


def test_detr_keeps_a_table_with_one_row_per_layer_and_its_dtype(models):
    inspection = json.loads(invoke_cli("inspect", "detr_bf16", "--json", cwd=models).stdout)
    paths = [layer["path"] for layer in inspection["layers"]]
    # backbone.model.encoder.stages.0.layers.0.layer.0.normalization
    assert max(len(p) for p in paths) > 60 and len(paths) >= 12
    done = invoke_cli("inspect", "detr_bf16", cwd=models, columns=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.split()[:3] == ["#", "path", "kind"])
    assert "dtype" in header.split()  # a table header, not one block of `column  value` lines per layer
    rows = [line for line in lines if re.match(r"^\s*\d+ \S", line)]
    assert [int(row.split()[0]) for row in rows] == list(range(len(paths)))  # one row per layer, in order
    assert all("bfloat16" in row for row in rows)
    assert all(len(line) <= 120 for line in lines)
    assert not any(line.strip().startswith("path ") for line in lines)  # no stacked blocks


def test_register_and_show_name_each_hazard_once(models, tmp_path):
    env = {"NORMBRIDGE_DB": f"sqlite:///{tmp_path / 'reg.db'}", "NORMBRIDGE_BLOBS": str(tmp_path / "blobs")}
    registered = invoke_cli("register", "fresh", "untrained.pt2", cwd=models, columns=120, env=env)
    assert registered.returncode == 0, registered.stderr
    text = " ".join(registered.stdout.split())
    assert "not servable: never_trained at stem.1, layer1.0.bn1, layer1.0.bn2 and 7 more" in text  # not all ten names
    shown = invoke_cli("show", "fresh@1", cwd=models, columns=120, env=env)
    assert shown.returncode == 0, shown.stderr
    blocking = re.findall(r"^ *BLOCKS warning never_trained at ", shown.stdout, re.MULTILINE)
    assert blocking == ["  BLOCKS warning never_trained at "]
    assert "and 7 more (10 layers)" in " ".join(shown.stdout.split())
    record = json.loads(invoke_cli("show", "fresh@1", "--json", cwd=models, env=env).stdout)
    assert [h["code"] for h in record["hazards"]] == ["never_trained"] * 10  # --json keeps one entry per layer
