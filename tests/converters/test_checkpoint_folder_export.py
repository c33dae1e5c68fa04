"""`normbridge export DIR --to onnx` on a Hugging Face checkpoint folder, and on a registered folder's version.

The folder's model is loaded by transformers, traced on inputs its config describes and exported as a `.pt2` is: the
file keeps native normalization ops with the config's eps, and what onnxruntime computes from it is compared here with
what the model `from_pretrained` loads computes in torch (both run here; nothing of normbridge's contract is the
oracle). A folder lacking tensors of its architecture, and a model whose main input normbridge cannot make, are refused
in one line. Nothing comes from a hub (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from tests.cli_run import invoke_cli  # noqa: E402
from tests.converters.test_checkpoint_folder import _saved  # noqa: E402
from tests.real_norms import randomise  # noqa: E402

#: case -> (ONNX op the norms must be, eps the config gives them, the input the file is run on).
CASES = {
    "llama-f32-sharded": ("RMSNormalization", 3e-6, np.arange(16, dtype=np.int64).reshape(2, 8) % 8),
    "resnet-f32-one-file": ("BatchNormalization", 1e-5, None),
    "detr-f32-sharded": ("BatchNormalization", 1e-5, None),
}


def _epsilons(model: onnx.ModelProto, op: str) -> list[float]:
    return [
        attribute.f
        for node in model.graph.node
        if node.op_type == op
        for attribute in node.attribute
        if attribute.name == "epsilon"
    ]


@pytest.mark.parametrize("case", list(CASES))
def test_a_folder_exports_to_onnx_with_native_norms_computing_what_transformers_loads(case, tmp_path):
    _saved(case, tmp_path / "checkpoint")
    op, eps, tokens = CASES[case]

    done = invoke_cli("export", "checkpoint", "--to", "onnx", "-o", "model.onnx", cwd=tmp_path)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "contract PASSED" in done.stdout
    model = onnx.load(str(tmp_path / "model.onnx"))
    assert _epsilons(model, op) and all(value == np.float32(eps) for value in _epsilons(model, op))
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    [feed] = session.get_inputs()
    source = (
        transformers.AutoModel.from_pretrained(tmp_path / "checkpoint").eval()
        if not case.startswith("llama")
        else transformers.LlamaModel.from_pretrained(tmp_path / "checkpoint").eval()
    )
    if tokens is None:
        shape = [int(d) for d in feed.shape]
        inputs = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        with torch.no_grad():
            expected = source(pixel_values=torch.from_numpy(inputs))[0].numpy()
    else:
        inputs = tokens
        with torch.no_grad():
            expected = source(input_ids=torch.from_numpy(inputs), use_cache=False)[0].numpy()
    served = session.run(None, {feed.name: inputs})[0]
    np.testing.assert_allclose(served, expected, atol=2e-4, rtol=1e-3)


def test_a_registered_folder_version_exports_like_its_folder(tmp_path):
    _saved("llama-f32-sharded", tmp_path / "checkpoint")
    where = ["--db", f"sqlite:///{tmp_path / 'registry.db'}", "--blobs", str(tmp_path / "blobs")]
    assert invoke_cli("register", "llama", "checkpoint", *where, cwd=tmp_path).returncode == 0

    done = invoke_cli("export", "llama@1", "--to", "onnx", "-o", "served.onnx", *where, cwd=tmp_path)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "contract PASSED" in done.stdout
    assert _epsilons(onnx.load(str(tmp_path / "served.onnx")), "RMSNormalization") == [np.float32(3e-6)] * 5


def test_a_folder_lacking_tensors_of_its_architecture_is_refused_in_one_line(tmp_path):
    _saved("bert-f32-sharded", tmp_path / "checkpoint")  # a BertModel saved without its pooler; config says BertModel

    done = invoke_cli("export", "checkpoint", "--to", "onnx", "-o", "model.onnx", cwd=tmp_path)

    assert done.returncode == 6, done.stdout + done.stderr
    message = (done.stdout + done.stderr).strip().splitlines()[-1]
    assert "pooler.dense.bias" in message and "initialize at random" in message and "Traceback" not in done.stderr
    assert not (tmp_path / "model.onnx").exists()


def test_a_model_whose_main_input_normbridge_cannot_make_is_refused_naming_it(tmp_path):
    torch.manual_seed(0)
    model = randomise(
        transformers.Wav2Vec2Model(
            transformers.Wav2Vec2Config(
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=4,
                intermediate_size=64,
                conv_dim=(8, 8),
                conv_stride=(5, 2),
                conv_kernel=(10, 3),
                num_conv_pos_embeddings=16,
                num_conv_pos_embedding_groups=4,
            )
        ),
        seed=2,
    )
    model.save_pretrained(tmp_path / "checkpoint")

    done = invoke_cli("export", "checkpoint", "--to", "onnx", "-o", "model.onnx", cwd=tmp_path)

    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "checkpoint folder 'checkpoint'" in said and "'input_values' as its main input" in said
    assert "torch.export.save" in said and len(said.strip().splitlines()) == 1
    assert not (tmp_path / "model.onnx").exists()
