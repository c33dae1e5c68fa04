"""Options of a conversion: every choice that is not dictated by the source layer."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_OPSET = 23
MIN_OPSET = 13


class ConversionOptions(BaseModel):
    """What to do where the target cannot hold the source exactly.

    Defaults refuse rather than guess: a train-mode BatchNorm is not written to ONNX
    unless `onnx_training_mode` is set, and `momentum=None` is an error unless
    `cumulative_momentum="next_step"`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    opset: int = Field(
        default=DEFAULT_OPSET,
        ge=MIN_OPSET,
        description="ONNX opset to emit; native LayerNorm >= 17, GroupNorm >= 21, RMSNorm >= 23.",
    )
    onnx_training_mode: bool = Field(
        default=False, description="Emit training_mode=1 for a train-mode layer instead of refusing."
    )
    match_variance_estimator: bool = Field(
        default=False,
        description="Emit a small subclass that updates running_var with the source's estimator, so training steps match exactly.",
    )
    cumulative_momentum: Literal["error", "next_step"] = Field(
        default="error",
        description="PyTorch momentum=None: refuse, or emit the momentum 1/(num_batches_tracked+1) that matches the next step only.",
    )
    restore_source_class: bool = Field(
        default=True,
        description="Converting a layer back to the framework it was read from rebuilds its own class (LlamaRMSNorm) "
        "where the spec records it, it is importable (torch) or registered or already imported (Keras), and proved equal "
        "(torch_adapter/restoring.py, keras_adapter/restoring.py); False builds the stock class.",
    )
    input_rank: int | None = Field(
        default=None,
        ge=1,
        le=8,
        description="Rank of the inputs the converted layer takes, where the target fixes one (an ONNX graph input, a built Keras layer); "
        "default: the rank the source recorded, else the kind's usual rank (reported); a Keras BatchNormalization or "
        "GroupNormalization whose source takes several ranks (BatchNorm1d, GroupNorm) is then built on its first call.",
    )
