"""Serving faults the collector sees without a registry (issue 35 item 1): a served graph computing batch statistics.

A torch ExportedProgram exported from a module in train mode calls batch_norm with training=True: served as the
program or as its `module()`, the first window carries batch_statistics_in_graph (and statistics_changed, since each
request rewrote the running statistics); exported after eval() it carries none. An ONNX graph whose BatchNormalization
has training_mode=1 (and the two running statistics outputs that mode requires) is served by onnxruntime's CPU build,
each request normalized by its own batch: the collector watching that session reports it; one in inference mode is not.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import onnxruntime

import converters
from converters.onnx_adapter.serving_taps import training_mode_faults
from testkit.monitoring_models import onnx_bn_model

from tests.pt2_crafting import ConvBatchNorm


def _first_window(served_of, program) -> tuple[list[dict], object]:
    watch = converters.monitor(program, sample_rate=1.0, window_requests=2)
    served = served_of(watch)
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for _ in range(2):
            served(torch.from_numpy(rng.standard_normal((2, 3, 8, 8)).astype(np.float32)))
    watch.close()
    return watch.closed_windows[0]["faults"], watch.stats()


@pytest.mark.parametrize("as_module", [False, True], ids=["program", "module"])
def test_a_program_exported_in_train_mode_is_reported_by_its_first_window(as_module):
    torch.manual_seed(0)
    trained = torch.export.export(ConvBatchNorm().train(), (torch.randn(2, 3, 8, 8),))
    target = trained.module() if as_module else trained
    faults, stats = _first_window(lambda watch: watch.served, target)
    expected = {("batch_statistics_in_graph", "bn"), ("statistics_changed", "bn")}
    assert {(f["kind"], f["layer"]) for f in faults} == expected
    assert [f.kind for f in stats.faults] == ["batch_statistics_in_graph", "statistics_changed"] and stats.errors == 0

    evaluated = torch.export.export(ConvBatchNorm().eval(), (torch.randn(2, 3, 8, 8),))
    target = evaluated.module() if as_module else evaluated
    faults, stats = _first_window(lambda watch: watch.served, target)
    assert faults == [] and stats.faults == ()


def test_an_onnx_batchnormalization_in_training_mode_is_a_fault_and_one_in_inference_mode_is_not():
    model = onnx_bn_model()
    assert training_mode_faults(model) == []
    trained = onnx.ModelProto()
    trained.CopyFrom(model)
    node = next(n for n in trained.graph.node if n.op_type == "BatchNormalization")
    node.attribute.append(onnx.helper.make_attribute("training_mode", 1))
    node.output.extend(["bn.mean_out", "bn.var_out"])  # training mode outputs the updated statistics too
    [(kind, layer, detail)] = training_mode_faults(trained)
    assert (kind, layer) == ("batch_statistics_in_graph", "bn") and "training_mode=1" in detail

    rng = np.random.default_rng(1)
    for proto, expected in ((trained, [("batch_statistics_in_graph", "bn")]), (model, [])):
        session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        watch = converters.monitor(session, sample_rate=1.0, window_requests=2)
        for _ in range(2):
            watch.served.run(None, {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)})
        watch.close()
        assert [(f["kind"], f["layer"]) for f in watch.closed_windows[0]["faults"]] == expected
        assert [(f.kind, f.layer) for f in watch.stats().faults] == expected and watch.stats().errors == 0
