"""`.keras` files that declare far more than they store (issue 30, holes 4 and 5): refused before Keras allocates it.

A genuine `model.save` file is rewritten as an attacker would (tests/keras_crafting.py): the Dense kernel in
model.weights.h5 becomes a chunked gzip dataset of 256 MiB never written (with a zero or another fill value), with one
chunk written, or written with zeros at ~1000x; 200 datasets of 1 MiB of zeros each (the bound on the whole file);
weights in a `model.weights.npz` whose member is 64 MiB of deflated zeros; a config.json declaring an 8000x8000 or
24000x24000 Dense over the genuine weights, or widening a Normalization (which reads its variables while it is built)
to 100M features. Before the fix `load_model` raised the process's peak memory by up to 12 GiB on these (the 24000
one also took 93 s of CPU); now the library and real `normbridge inspect` processes refuse them with bad_input_file
(exit 6) while the peak memory, read from /proc (or, for a process, from the kernel's accounting through a small
launcher), stays within 100 MiB of a genuine load. Real server uploads are tested in tests/registry/test_bundle_bomb.py.
"""

from __future__ import annotations

import json
import re
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from converters.keras_adapter.keras_file_checks import check_keras_file
from converters.models.loading import load_model
from schemas import InputFileError
from tests.cli_run import run_cli_measured
from tests.keras_crafting import (
    craft,
    genuine_keras,
    genuine_normalization_keras,
    giant_dense,
    huge_normalization,
    many_small_zero_datasets,
    npz_weights,
    one_chunk_written,
    unwritten_kernel,
    zeros_written,
)

PEAK_BOUND = 100 << 20  # bytes a refused file may add to the peak resident memory

#: name -> (how the genuine file is rewritten, what the refusal says)
ATTACKS = {
    "h5 dataset never written": (
        dict(edit_weights=unwritten_kernel(8192)),
        r"dataset 'layers/dense/vars/0' declares float32\[8192, 8192\] \(268435456 bytes\) and stores none",
    ),
    "h5 dataset with a fill value": (
        dict(edit_weights=unwritten_kernel(8192, fill=1.5)),
        r"declares float32\[8192, 8192\].*stores none",
    ),
    "h5 dataset with one chunk written": (
        dict(edit_weights=one_chunk_written(8192)),
        r"declares float32\[8192, 8192\] \(268435456 bytes\) and stores \d+, more than 100 times",
    ),
    "h5 dataset of compressed zeros": (
        dict(edit_weights=zeros_written(8192)),
        r"declares float32\[8192, 8192\].*more than 100 times",
    ),
    "h5 many small compressed datasets": (
        dict(edit_weights=many_small_zero_datasets(200)),
        r"declares \d+ bytes of weights in a \d+-byte file, more than 100 times its size",
    ),
    "npz weights": (
        dict(replace_weights=npz_weights(16 << 20)),
        r"holds no 'model.weights.h5' \(a 'model.weights.npz'",
    ),
    "config 8000x8000 Dense": (
        dict(edit_config=giant_dense(8000)),
        r"'config.json' builds 6 variables of 256160000 bytes \(the largest 'dense/kernel' float32\[8000, 8000\]",
    ),
    "config 24000x24000 Dense": (
        dict(edit_config=giant_dense(24000)),
        r"the largest 'dense/kernel' float32\[24000, 24000\], 2304000000 bytes",
    ),
}


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> Path:
    return genuine_keras(tmp_path_factory.mktemp("genuine-keras") / "model.keras")


def hostile(name: str, genuine: Path, folder: Path) -> Path:
    path = craft(genuine, folder / (re.sub(r"\W+", "_", name) + ".keras"), **ATTACKS[name][0])
    assert path.stat().st_size < 1 << 20, f"{name}: the file is {path.stat().st_size} bytes, meant to be small"
    return path


def _status(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def test_the_genuine_model_passes_and_loads(genuine):
    check_keras_file(genuine)
    assert [type(layer).__name__ for layer in load_model(genuine).layers][1:] == ["Dense", "BatchNormalization"]


def test_a_genuine_model_whose_entries_were_deflated_still_loads(genuine, tmp_path):
    """A `.keras` re-zipped with compression (a hand-made archive: model.save stores entries plainly) is read as
    before."""
    deflated = tmp_path / "deflated.keras"
    with zipfile.ZipFile(genuine) as source, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            target.writestr(info.filename, source.read(info))
    assert {info.compress_type for info in zipfile.ZipFile(deflated).infolist()} == {zipfile.ZIP_DEFLATED}
    assert [type(layer).__name__ for layer in load_model(deflated).layers][1:] == ["Dense", "BatchNormalization"]


def test_a_keras_applications_model_passes_and_loads(tmp_path):
    """MobileNetV2 (262 variables, 14 MB of weights): the config builds exactly what the weights file declares,
    with no slack."""
    from converters.keras_adapter.built_variables import built_variables
    from converters.keras_adapter.runtime import import_keras
    from converters.keras_adapter.weights_file import declared_weights

    keras = import_keras()
    path = tmp_path / "mobilenet_v2.keras"
    keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3)).save(path)
    model = load_model(path)
    assert len(model.weights) == 262
    with zipfile.ZipFile(path) as archive:
        declared = declared_weights(
            archive.open("model.weights.h5"), archive.getinfo("model.weights.h5").file_size, "its weights"
        ).declared
        variables = built_variables(json.loads(archive.read("config.json")), budget=declared)
    assert sum(v.bytes for v in variables) == declared == sum(int(w.numpy().nbytes) for w in model.weights)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_load_model_refuses_before_allocating(name, genuine, tmp_path):
    path = hostile(name, genuine, tmp_path)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS now
    before = _status("self", "VmRSS")
    with pytest.raises(InputFileError) as refused:
        load_model(path)
    peak = _status("self", "VmHWM") - before
    assert refused.value.code == "bad_input_file" and str(path) in str(refused.value), refused.value
    assert re.search(ATTACKS[name][1], str(refused.value)), refused.value
    assert peak < PEAK_BOUND, f"{name}: refusing the file raised this process's peak memory by {peak >> 20} MiB"


def test_a_layer_reading_its_variables_while_built_is_refused_before_their_initializers_run(tmp_path):
    """Normalization reshapes its mean in `build`, which makes Keras run the initializer of a variable it had only
    counted: 100M features would be 800 MB of mean and variance (+813 MiB before these reads were budgeted)."""
    genuine = genuine_normalization_keras(tmp_path / "normalization.keras")
    load_model(genuine)
    path = craft(genuine, tmp_path / "huge_normalization.keras", edit_config=huge_normalization(100_000_000))
    Path("/proc/self/clear_refs").write_text("5")
    before = _status("self", "VmRSS")
    with pytest.raises(InputFileError, match=r"reads its variable 'norm/mean' float32\[100000000\] while it is built"):
        load_model(path)
    assert _status("self", "VmHWM") - before < PEAK_BOUND


@pytest.mark.slow
def test_inspect_processes_refuse_with_exit_6_and_bounded_memory(genuine, tmp_path):
    """The two attacks of the issue through the real command, each process's peak memory beside a genuine file's."""
    files = {
        "genuine": genuine,
        **{name: hostile(name, genuine, tmp_path) for name in ("h5 dataset never written", "config 8000x8000 Dense")},
    }
    with ThreadPoolExecutor(len(files)) as pool:  # three processes at once: each one's peak is its own
        runs = dict(
            zip(
                files,
                pool.map(
                    lambda path: run_cli_measured("inspect", str(path), cwd=tmp_path, env={"COLUMNS": "200"}),
                    files.values(),
                ),
            )
        )
    done, genuine_peak = runs.pop("genuine")
    assert done.returncode == 0, done.stderr
    for name, (done, peak) in runs.items():
        refused = done.returncode == 6 and "bad_input_file" in done.stderr and "Traceback" not in done.stderr
        assert refused, f"{name}: exit {done.returncode}\n{done.stderr}"
        assert peak - genuine_peak < PEAK_BOUND, (
            f"{name}: inspect peaked at {peak >> 20} MiB, a genuine file at {genuine_peak >> 20} MiB"
        )
