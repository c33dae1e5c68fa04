"""Serving taps of ONNX models: an onnxruntime session whose sampled requests also return every BatchNormalization
input.

The served graph is left alone: unsampled requests run the caller's own session; sampled ones run a second session
on a copy of the graph that adds each BatchNormalization node's input as an extra output (statistics._with_outputs,
what `drift` reads), and the wrapper returns only the outputs the caller asked for. Should the copy fail on a request,
that request is served by the original session and the failure counted.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from schemas import UnsupportedObjectError

from ..serving_taps import ServingTaps, TappedLayer, TapSink, numpy_moments
from .statistics import _with_outputs, onnx_batchnorms, onnx_constant


def _proto_of(session: Any) -> onnx.ModelProto:
    """The graph an onnxruntime session was made from (its bytes or its path, as onnxruntime keeps them)."""
    data, path = getattr(session, "_model_bytes", None), getattr(session, "_model_path", None)
    if data:
        return onnx.load_from_string(data)
    if path:
        return onnx.load(path, load_external_data=True)
    raise UnsupportedObjectError(
        "this onnxruntime session keeps neither the model's bytes nor its path; pass the onnx.ModelProto to monitor()."
    )


class MonitoredSession:
    """An InferenceSession stand-in: `run` answers exactly as the session does;
    sampled requests report their BatchNorm inputs."""

    def __init__(self, session: Any, probe: Any, taps: list[str], sink: TapSink):
        self.session, self._probe, self._taps, self._sink = session, probe, taps, sink
        self._outputs = [o.name for o in session.get_outputs()]
        self.input_names = [i.name for i in session.get_inputs()]

    def run(self, output_names, input_feed, run_options=None):
        names = list(output_names) if output_names else self._outputs
        try:
            if self._sink.begin():
                fed = [name for name in self.input_names if name in input_feed]
                self._sink.keep(tuple(input_feed[name] for name in fed), fed)
                try:
                    values = self._probe.run(names + self._taps, input_feed, run_options)
                except Exception as error:  # the copy failed: serve from the original, count it
                    self._sink.failed(error)
                else:
                    for index, value in enumerate(values[len(names) :]):
                        try:
                            self._sink.observe(index, *numpy_moments(value, 1))
                        except Exception as error:
                            self._sink.failed(error)
                    return values[: len(names)]
            return self.session.run(names, input_feed, run_options)
        finally:
            self._sink.end()

    def __getattr__(self, name: str):
        return getattr(self.session, name)


def session_taps(model: Any, sink: TapSink) -> ServingTaps:
    """`model` (an onnxruntime InferenceSession or an onnx.ModelProto) served through a MonitoredSession."""
    import onnxruntime

    if isinstance(model, onnx.ModelProto):
        proto, session = (
            model,
            onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]),
        )
    else:
        proto, session = _proto_of(model), model
    sites = onnx_batchnorms(proto)
    if not sites:
        raise UnsupportedObjectError(
            "the ONNX graph has no BatchNormalization node with stored statistics to monitor "
            "(an exporter may have folded them into the Conv: export with `normbridge export`, which keeps them)."
        )
    layers = [
        TappedLayer(
            s.name,
            onnx_constant(proto, s.mean_name).astype(np.float64),
            onnx_constant(proto, s.var_name).astype(np.float64),
            s.eps,
        )
        for s in sites
    ]
    probe_proto = _with_outputs(proto, [s.input for s in sites], train=False)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    probe = onnxruntime.InferenceSession(probe_proto.SerializeToString(), options, providers=session.get_providers())
    outputs = [o.name for o in probe.get_outputs()]
    taps = [
        s.input if s.input in outputs else next(n for n in outputs if n.startswith(f"{s.input}__normbridge_probe_"))
        for s in sites
    ]
    served = MonitoredSession(session, probe, taps, sink)
    found = training_mode_faults(proto)
    return ServingTaps(served, layers, input_names=served.input_names, faults=lambda: list(found))


def training_mode_faults(proto: onnx.ModelProto) -> list[tuple[str, str | None, str]]:
    """A batch_statistics_in_graph fault per BatchNormalization with training_mode=1: onnxruntime normalizes each
    request by its own batch there (the graph's statistics are constants, so they never change while serving)."""
    found = []
    for node in proto.graph.node:
        if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        if any(a.name == "training_mode" and onnx.helper.get_attribute_value(a) == 1 for a in node.attribute):
            found.append(
                (
                    "batch_statistics_in_graph",
                    node.name or node.input[0],
                    "BatchNormalization with training_mode=1 in the served graph: each request is normalized by "
                    "its own batch; export the model after model.eval() (normbridge export does)",
                )
            )
    return found


__all__ = ["MonitoredSession", "session_taps", "training_mode_faults"]
