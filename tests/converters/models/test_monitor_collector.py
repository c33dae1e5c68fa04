"""The serving collector without a registry: windows merge exactly, served outputs are unchanged,
nothing fails a request.

Expected values come from NumPy over the same layer inputs (read by independent hooks or by running the graph's parts),
never from the collector itself.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime
import pytest
import torch

import converters
from converters.models.monitoring.window import ChannelMoments
from schemas import InputFileError
from schemas.monitoring import DriftWindow, statistics_digest
from testkit.monitoring_models import calm, keras_cnn, onnx_bn_model, shifted, torch_cnn


def test_chan_merges_of_uneven_batches_equal_numpy_over_everything():
    rng = np.random.default_rng(3)
    parts = [rng.standard_normal((n, 5)) * 3 + 7 for n in (1, 2, 17, 250)]
    merged = ChannelMoments()
    for part in parts:
        merged.merge(part.shape[0], part.mean(0), part.var(0))
    everything = np.concatenate(parts)
    assert merged.count == everything.shape[0]
    np.testing.assert_allclose(merged.mean, everything.mean(0), rtol=1e-12)
    np.testing.assert_allclose(merged.var, everything.var(0), rtol=1e-10)


def _bn_inputs(model, batches):
    """Each BatchNorm's input over `batches`, read by hooks of this test (not the collector's)."""
    seen = {name: [] for name, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)}
    handles = [
        m.register_forward_pre_hook(lambda _m, a, name=name: seen[name].append(a[0].detach().double().numpy()))
        for name, m in model.named_modules()
        if name in seen
    ]
    with torch.no_grad():
        for batch in batches:
            model(torch.from_numpy(batch))
    for h in handles:
        h.remove()
    return {name: np.concatenate(v) for name, v in seen.items()}


def test_torch_module_window_is_numpy_over_the_sampled_inputs_and_outputs_are_unchanged():
    model = torch_cnn()
    rng = np.random.default_rng(0)
    batches = [shifted(rng) for _ in range(6)]
    with torch.no_grad():
        expected_out = [model(torch.from_numpy(b)).numpy() for b in batches]
    watch = converters.monitor(model, sample_rate=1.0, window_requests=6)
    with torch.no_grad():
        served = [model(torch.from_numpy(b)).numpy() for b in batches]
    stats = watch.stats()
    watch.close()
    for a, b in zip(served, expected_out):
        np.testing.assert_array_equal(a, b)
    assert (stats.requests, stats.sampled, stats.windows_closed, stats.errors) == (6, 6, 1, 0)
    window = DriftWindow.model_validate(watch.closed_windows[0])
    inputs = _bn_inputs(model, batches)  # hooks removed by close(): this reads them afresh
    for layer in window.layers:
        x = inputs[layer.name]
        np.testing.assert_allclose(layer.mean, x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(layer.var, x.var(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
        assert layer.count == x.shape[0] * x.shape[2] * x.shape[3]
    expected_digest = statistics_digest(
        (m.running_mean.numpy(), m.running_var.numpy()) for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)
    )
    assert window.statistics_digest == expected_digest
    assert not model._forward_pre_hooks and not model.bn1._forward_pre_hooks  # close() took the hooks off


def test_torch_layers_are_drawn_apart_each_seeing_its_share_and_its_window_is_numpy_over_what_it_saw():
    """At sample_rate < 1 a torch layer's observations are drawn per request and per layer: each layer sees about that
    share of the requests, not the same ones, and its window is NumPy over exactly the inputs it observed."""
    model = torch_cnn()
    rng = np.random.default_rng(14)
    batches = [shifted(rng) for _ in range(200)]
    watch = converters.monitor(model, sample_rate=0.3, window_requests=10_000, seed=5)
    index = {name: i for i, name in enumerate(watch.layers)}
    seen = {name: [] for name in watch.layers}  # what each layer received when drawn, by hooks of this test
    requests = {name: set() for name in watch.layers}
    count = iter(range(len(batches)))

    def recorder(name):
        def hook(_module, args):
            if watch.observing(index[name]):
                seen[name].append(args[0].detach().double().numpy())
                requests[name].add(current[0])

        return hook

    current = [None]
    handles = [getattr(model, name).register_forward_pre_hook(recorder(name)) for name in watch.layers]
    with torch.no_grad():
        for batch in batches:
            current[0] = next(count)
            model(torch.from_numpy(batch))
    for handle in handles:
        handle.remove()
    stats = watch.stats()
    watch.flush()
    watch.close()
    assert stats.errors == 0 and 30 <= stats.sampled <= 90  # the request-level draw (keep_sample, stats) at 0.3
    for name in watch.layers:
        assert 30 <= len(requests[name]) <= 90, (name, len(requests[name]))  # about 0.3 of 200 requests each
    first, second = (requests[name] for name in watch.layers[:2])
    assert first != second and len(first | second) > max(len(first), len(second))  # drawn apart, not the same requests
    window = DriftWindow.model_validate(watch.closed_windows[0])
    for layer in window.layers:
        x = np.concatenate(seen[layer.name])
        assert layer.count == x.shape[0] * x.shape[2] * x.shape[3]
        np.testing.assert_allclose(layer.mean, x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(layer.var, x.var(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)


def test_sample_rate_zero_observes_nothing_and_windows_close_on_time():
    model = torch_cnn()
    quiet = converters.monitor(model, sample_rate=0.0, window_requests=2)
    with torch.no_grad():
        for _ in range(4):
            model(torch.from_numpy(calm(np.random.default_rng(1))))
    assert quiet.stats().sampled == 0 and not quiet.closed_windows  # empty windows are not shipped
    quiet.close()
    timed = converters.monitor(model, sample_rate=1.0, window_requests=10_000, window_seconds=0.2)
    with torch.no_grad():
        model(torch.from_numpy(calm(np.random.default_rng(1))))
    deadline = __import__("time").monotonic() + 5
    while not timed.closed_windows and __import__("time").monotonic() < deadline:
        __import__("time").sleep(0.05)
    timed.close()
    assert len(timed.closed_windows) == 1 and timed.closed_windows[0]["requests"] == 1


def test_exported_program_taps_agree_with_the_module_and_keep_its_outputs():
    model = torch_cnn()
    x = shifted(np.random.default_rng(2))
    program = torch.export.export(model, (torch.from_numpy(x),))
    with_module = converters.monitor(model, sample_rate=1.0, window_requests=1)
    with_program = converters.monitor(program, sample_rate=1.0, window_requests=1)
    with torch.no_grad():
        expected = program.module()(torch.from_numpy(x)).numpy()
        served = with_program.served(torch.from_numpy(x)).numpy()
        model(torch.from_numpy(x))
    with_module.close(), with_program.close()
    np.testing.assert_array_equal(served, expected)
    assert with_program.layers == with_module.layers == ["bn1", "bn2"]
    assert with_program.statistics_digest == with_module.statistics_digest
    for a, b in zip(with_program.closed_windows[0]["layers"], with_module.closed_windows[0]["layers"]):
        np.testing.assert_allclose(a["mean"], b["mean"], rtol=1e-6, atol=1e-7)


def test_onnxruntime_session_serves_its_own_outputs_and_reports_the_batchnorm_input():
    model = onnx_bn_model()
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = shifted(np.random.default_rng(4))
    expected = session.run(None, {"x": x})
    watch = converters.monitor(session, sample_rate=1.0, window_requests=1)
    served = watch.served.run(None, {"x": x})
    assert len(served) == len(expected) == 1
    np.testing.assert_array_equal(served[0], expected[0])
    assert [o.name for o in watch.served.get_outputs()] == ["y"]  # the served graph's outputs, unchanged
    watch.close()
    layer = watch.closed_windows[0]["layers"][0]
    assert layer["name"] == "bn"
    np.testing.assert_allclose(layer["mean"], (2 * x.astype(np.float64)).mean(axis=(0, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(layer["var"], (2 * x.astype(np.float64)).var(axis=(0, 2, 3)), rtol=1e-5)


def test_keras_model_served_through_the_monitor_returns_what_the_model_returns():
    model = keras_cnn()
    x = shifted(np.random.default_rng(5), 4, (8, 8, 3))
    expected = np.asarray(model(x, training=False))
    watch = converters.monitor(model, sample_rate=1.0, window_requests=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        served = np.asarray(watch.served(x))
    watch.close()
    np.testing.assert_allclose(served, expected, rtol=1e-6, atol=1e-6)
    layer = watch.closed_windows[0]["layers"][0]
    assert layer["name"] == "bn" and layer["count"] == 4 * 8 * 8 and len(layer["mean"]) == 4
    assert not [w for w in seen if issubclass(w.category, UserWarning)], [
        str(w.message) for w in seen
    ]  # called as the model is called


def test_a_keras_model_on_a_dict_of_inputs_is_tapped_as_it_is_called():
    import keras

    a, b = keras.Input((4,), name="a"), keras.Input((4,), name="b")
    model = keras.Model({"b": b, "a": a}, keras.layers.BatchNormalization(name="bn")(a - 2 * b))
    rng = np.random.default_rng(7)
    xa, xb = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32)
    watch = converters.monitor(model, sample_rate=1.0, window_requests=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        served = np.asarray(watch.served({"a": xa, "b": xb}))
    watch.close()
    np.testing.assert_allclose(served, np.asarray(model({"a": xa, "b": xb}, training=False)), rtol=1e-6, atol=1e-6)
    layer = watch.closed_windows[0]["layers"][0]
    np.testing.assert_allclose(layer["mean"], (xa.astype(np.float64) - 2 * xb).mean(axis=0), rtol=1e-5, atol=1e-6)
    assert not [w for w in seen if issubclass(w.category, UserWarning)], [str(w.message) for w in seen]


def test_a_failing_tap_is_counted_and_the_request_still_answers():
    model = torch_cnn()
    watch = converters.monitor(model, sample_rate=1.0, window_requests=100)
    watch._window.moments = []  # every merge now fails inside the collector
    with torch.no_grad():
        out = model(torch.from_numpy(calm(np.random.default_rng(6))))
    stats = watch.stats()
    watch.close()
    assert out.shape == (4, 2) and stats.errors == 2 and "IndexError" in stats.last_error


def test_bad_settings_are_refused_before_anything_is_hooked():
    model = torch_cnn()
    with pytest.raises(InputFileError, match="sample_rate"):
        converters.monitor(model, sample_rate=1.5)
    with pytest.raises(InputFileError, match="ref="):
        converters.monitor(model, server="http://127.0.0.1:9")
    with pytest.raises(InputFileError, match="NAME@N"):
        converters.monitor(model, server="http://127.0.0.1:9", ref="cnn")
    assert not model._forward_pre_hooks


def test_sum_merges_of_far_from_zero_batches_equal_numpy_over_everything():
    """The torch taps hand over per-channel sums and sums of squares in float32; the worker merges them in float64."""
    rng = np.random.default_rng(8)
    parts = [(rng.standard_normal((n, 6, 5, 5)) * 2 + 3).astype(np.float32) for n in (1, 3, 8)]
    merged = ChannelMoments()
    for part in parts:
        t = torch.from_numpy(part)
        merged.merge_sums(part.size // 6, t.sum(dim=(0, 2, 3)), torch.linalg.vector_norm(t, dim=(0, 2, 3)).square())
    everything = np.concatenate(parts).astype(np.float64)
    assert merged.count == everything.size // 6
    np.testing.assert_allclose(merged.mean, everything.mean(axis=(0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(merged.var, everything.var(axis=(0, 2, 3)), rtol=1e-5)


def test_keep_sample_is_a_ring_of_the_newest_sampled_rows_saved_for_recalibrate(tmp_path):
    from converters.models.serving.samples import load_sample

    model = torch_cnn()
    rng = np.random.default_rng(9)
    batches = [shifted(rng) for _ in range(40)]
    seen = []  # what the served model's first layer received on sampled requests, by a hook of this test
    watch = converters.monitor(model, sample_rate=0.5, window_requests=1000, keep_sample=10, seed=3)
    probe = model.conv1.register_forward_pre_hook(
        lambda _m, a: seen.append(a[0].numpy().copy()) if watch.sampling() else None
    )
    with torch.no_grad():
        for batch in batches:
            model(torch.from_numpy(batch))
            batch[:] = 0  # the caller reuses its buffer: the sample holds copies
    probe.remove()
    stats = watch.stats()
    rows = watch.save_sample(tmp_path / "traffic.npz")
    watch.close()
    assert 0 < stats.sampled < 40 and len(seen) == stats.sampled and stats.kept_rows == rows == 10
    kept = load_sample(tmp_path / "traffic.npz")
    assert kept.names == ("x",)  # MonitoredCNN.forward(self, x)
    np.testing.assert_array_equal(kept.arrays[0], np.concatenate(seen)[-10:])  # the newest 10 rows, oldest first
    with pytest.raises(InputFileError, match="keep_sample=N"):
        converters.monitor(model, sample_rate=1.0).save_sample(tmp_path / "none.npz")
    with pytest.raises(InputFileError, match="empty"):
        converters.monitor(model, sample_rate=0.0, keep_sample=4).save_sample(tmp_path / "empty.npz")
    with pytest.raises(InputFileError, match=".npz"):
        watch.save_sample(tmp_path / "traffic.npy")


def test_an_onnxruntime_sample_recalibrates_the_batchnorm_to_numpy_over_the_kept_inputs(tmp_path):
    from converters import recalibrate
    from onnx import numpy_helper

    model = onnx_bn_model()
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(10)
    batches = [shifted(rng, 2) for _ in range(6)]
    watch = converters.monitor(session, sample_rate=1.0, keep_sample=8)
    for batch in batches:
        watch.served.run(None, {"x": batch})
    watch.save_sample(tmp_path / "traffic.npz")
    watch.close()
    with np.load(tmp_path / "traffic.npz") as saved:
        assert saved.files == ["x"]
        np.testing.assert_array_equal(saved["x"], np.concatenate(batches)[-8:])
    new, report = recalibrate(model, str(tmp_path / "traffic.npz"), batch_size=4, variance_estimator="biased")
    stats = {i.name: numpy_helper.to_array(i) for i in new.graph.initializer}
    doubled = 2 * np.concatenate(batches)[-8:].astype(np.float64)  # the BatchNormalization input is 2x
    np.testing.assert_allclose(
        stats["bn.running_mean"], doubled.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6
    )  # over all 8 rows
    np.testing.assert_allclose(stats["bn.running_var"], doubled.var(axis=(0, 2, 3)), rtol=1e-5)
    assert report.samples == 8 and report.batches == 2


def test_a_keras_sample_is_named_after_the_model_input_and_reads_back_for_the_model(tmp_path):
    from converters.models.serving.samples import input_specs, load_sample

    model = keras_cnn()
    rng = np.random.default_rng(11)
    batches = [shifted(rng, 4, (8, 8, 3)) for _ in range(3)]
    watch = converters.monitor(model, sample_rate=1.0, keep_sample=6)
    for batch in batches:
        watch.served(batch)
    assert watch.save_sample(tmp_path / "traffic.npz") == 6
    watch.close()
    kept = load_sample(tmp_path / "traffic.npz", input_specs(model))  # matched to the model's input, channels last
    assert kept.names == ("image",)
    np.testing.assert_array_equal(kept.arrays[0], np.concatenate(batches)[-6:])


def test_a_stalled_worker_never_holds_up_requests_and_what_it_cannot_take_is_counted():
    import threading

    model = torch_cnn()
    watch = converters.monitor(model, sample_rate=1.0, window_requests=1000, keep_sample=64, max_backlog=1)
    entered, release = threading.Event(), threading.Event()
    keep = watch.sample.add

    def stalled(*kept):  # the worker's first hand-over blocks until released
        entered.set()
        release.wait(30)
        keep(*kept)

    watch.sample.add = stalled
    rng = np.random.default_rng(12)
    with torch.no_grad():
        model(torch.from_numpy(calm(rng)))
        assert entered.wait(30)  # the worker holds the first request; the backlog (1) takes the second
        outputs = [model(torch.from_numpy(calm(rng))) for _ in range(4)]
    assert all(out.shape == (4, 2) for out in outputs)
    release.set()
    stats = watch.stats()
    watch.close()
    assert (stats.requests, stats.sampled, stats.discarded, stats.errors, stats.kept_rows) == (5, 5, 3, 0, 8)
    window = watch.closed_windows[0]
    assert (
        window["sampled"] == 2 and window["layers"][0]["count"] == 2 * 4 * 8 * 8
    )  # the window holds the two merged requests


def test_a_bfloat16_model_is_reduced_in_float32_not_in_its_8_bit_mantissa():
    model = torch_cnn().to(torch.bfloat16)
    x = torch.from_numpy(shifted(np.random.default_rng(13), 64, (3, 32, 32))).to(
        torch.bfloat16
    )  # 65536 values per channel
    watch = converters.monitor(model, sample_rate=1.0, window_requests=1)
    with torch.no_grad():
        model(x)
    watch.close()
    seen = []
    probe = model.bn2.register_forward_pre_hook(lambda _m, a: seen.append(a[0].double().numpy()))
    with torch.no_grad():
        model(x)
    probe.remove()
    layer = watch.closed_windows[0]["layers"][1]
    assert layer["name"] == "bn2" and watch.stats().errors == 0
    np.testing.assert_allclose(layer["mean"], seen[0].mean(axis=(0, 2, 3)), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(layer["var"], seen[0].var(axis=(0, 2, 3)), rtol=1e-3)


def test_a_transformers_resnet_is_tapped_at_every_batchnorm_and_each_window_is_numpy_over_what_it_saw():
    """A model nobody here wrote (transformers ResNet from a small config, random init): every BatchNorm2d is tapped,
    drawn per layer at 0.5, and each layer's window is NumPy over the inputs it observed (read by this test's hooks)."""
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    model = ResNetModel(
        ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
    ).eval()
    norms = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)}
    watch = converters.monitor(model, sample_rate=0.5, window_requests=10_000, seed=7)
    assert sorted(watch.layers) == sorted(norms)  # every BatchNorm found, whatever its class's module path
    index = {name: i for i, name in enumerate(watch.layers)}
    seen = {name: [] for name in watch.layers}
    handles = [
        norms[name].register_forward_pre_hook(
            lambda _m, a, name=name: (
                seen[name].append(a[0].detach().double().numpy()) if watch.observing(index[name]) else None
            )
        )
        for name in watch.layers
    ]
    rng = np.random.default_rng(15)
    with torch.no_grad():
        for _ in range(30):
            model(torch.from_numpy(rng.standard_normal((2, 3, 32, 32)).astype(np.float32) * 2 + 1))
    for handle in handles:
        handle.remove()
    watch.flush()
    stats = watch.stats()
    watch.close()
    assert stats.errors == 0
    window = DriftWindow.model_validate(watch.closed_windows[0])
    assert {layer.name for layer in window.layers} == {name for name in seen if seen[name]}
    assert (
        len({len(v) for v in seen.values()}) > 1
    )  # layers drawn apart: not every layer saw the same number of requests
    for layer in window.layers:
        x = np.concatenate(seen[layer.name])
        assert layer.count == x.shape[0] * x.shape[2] * x.shape[3]
        np.testing.assert_allclose(layer.mean, x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(layer.var, x.var(axis=(0, 2, 3)), rtol=1e-5, atol=1e-5)
