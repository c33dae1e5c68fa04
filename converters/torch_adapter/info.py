"""PyTorch's facts (`FrameworkInfo`), read without importing torch."""

from ..framework_info import FrameworkInfo

INFO = FrameworkInfo(
    name="torch",
    package="converters.torch_adapter",
    default_eps_name="PyTorch's default",
    model_files={".pt2": ".pt2 (torch.export)"},
    structure_format="pt2",
    structure_suffix=".pt2",
    archive=("a torch.export .pt2 archive", "save the model with torch.export.save"),
    mlflow_flavour="pytorch",
    object_origin="module",
    format_origins={"pt2": "exported_program", "torch-module": "module"},
    layer_suffix="",  # a folder: the state dict beside its spec
    empty_batch="keeps them",
    worker_packages=("torch",),
    folder_formats={"hf-folder": "a Hugging Face checkpoint folder"},
    folder_markers=("config.json",),
)
