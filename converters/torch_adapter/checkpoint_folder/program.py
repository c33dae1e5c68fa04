"""A checkpoint folder's model as a torch.export program, so `export --to onnx` serves it as it serves a `.pt2`.

The weights are loaded by transformers' `from_pretrained` (after the folder's checks: meta_model.load_pretrained), and
the model is traced with example inputs transformers' own config describes: token ids for a model whose main input is
`input_ids`, pixels of the config's `num_channels` and `image_size` for one whose main input is `pixel_values`. The
shapes are the example's (a batch of 2; 8 tokens, or the config's image size): with dynamic sizes (`Dim.AUTO`), Llama's
mask and DETR's reshapes kept the example's sizes inside the graph, and the written file failed on any other batch. A
folder lacking tensors its model has (transformers would initialize them at random) is refused. Another main input
(audio, multimodal) is refused naming it, with what to pass instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from schemas import UnsupportedObjectError

#: The example batch; tokens per sequence and pixels per side where the config does not say.
BATCH, TOKENS, PIXELS = 2, 8, 64


def example_inputs(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The keyword inputs of one example call of a transformers model, from its config;
    refused for another main input."""
    config, name = getattr(model, "config", None), getattr(model, "main_input_name", None)
    generator = torch.Generator().manual_seed(0)
    if name == "input_ids":
        vocabulary = int(getattr(config, "vocab_size", 8) or 8)
        return {name: torch.randint(0, min(8, vocabulary), (BATCH, TOKENS), generator=generator)}
    if name == "pixel_values":
        side = getattr(config, "image_size", None) or PIXELS
        side = side if isinstance(side, int) else int(side[0])
        channels = int(getattr(config, "num_channels", 3) or 3)
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        return {name: torch.rand(BATCH, channels, side, side, generator=generator).to(dtype)}
    raise UnsupportedObjectError(
        f"a {type(model).__name__} takes '{name}' as its main input, which normbridge does not know how to make an example "
        "of; export the model yourself (torch.export.export with example inputs, then torch.export.save) and pass the .pt2."
    )


def folder_program(model: torch.nn.Module) -> Any:
    """The ExportedProgram of a transformers model (eval mode, no key-value cache), traced on `example_inputs`."""
    inputs = example_inputs(model)
    if hasattr(getattr(model, "config", None), "use_cache"):
        model.config.use_cache = False  # a cache object is not a tensor a serving graph returns
    try:
        return torch.export.export(model.eval(), (), inputs, strict=False)
    # tracing fails in many ways on models nobody here wrote; each is one line
    except Exception as error:  # noqa: BLE001
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise UnsupportedObjectError(
            f"torch.export could not trace the {type(model).__name__} ({type(error).__name__}: {first[:300]}); export it "
            "yourself with the inputs it needs (torch.export.export, then torch.export.save) and pass the .pt2."
        ) from None


def load_folder_program(path: str | Path) -> Any:
    """The program of the checkpoint folder at `path` (its weights loaded by transformers);
    a refusal names the folder."""
    from .meta_model import load_pretrained

    model = load_pretrained(path, complete=True)
    try:
        return folder_program(model)
    except UnsupportedObjectError as error:
        raise UnsupportedObjectError(f"checkpoint folder '{path}': {error}") from None


def is_transformers_model(model: Any) -> bool:
    """Whether `model` is a transformers PreTrainedModel (checked without importing transformers when it is not
    loaded)."""
    import sys

    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, transformers.PreTrainedModel)


__all__ = ["example_inputs", "folder_program", "is_transformers_model", "load_folder_program"]
