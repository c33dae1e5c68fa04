"""Seeded mutations of a genuine `.pt2`, and a process that reads each one with normbridge's reader and reports the
outcome.

`mutated(genuine, seed, index, out)` writes case `index` of run `seed`: one to three mutations, chosen by
`random.Random(f"{seed}:{index}")` so a case is rebuilt from its numbers alone, of the kinds an attacker (or a broken
disk) makes: a JSON entry edited (a value replaced by another type or an extreme number, deleted, duplicated, emptied),
an entry's bytes flipped, cut or swapped with another's, an entry dropped or emptied, and the zip file's own bytes
flipped or cut. `python -m tests.pt2_fuzzing GENUINE SEED FIRST COUNT FOLDER` reads cases FIRST..FIRST+COUNT-1 through
`load_model` and prints one JSON line as each starts and one when it ends: `read`, `refused` (an InputFileError, with
its code and message) or `crashed` (anything else, with its traceback), so a test can put a deadline on every case.
"""

from __future__ import annotations

import json
import random
import sys
import traceback
import zipfile
from pathlib import Path
from typing import Any

import torch

JSON_ENTRIES = (
    "models/model.json",
    "data/weights/model_weights_config.json",
    "data/constants/model_constants_config.json",
)
#: Values a JSON edit puts in place of another: other types, extreme integers, names torch resolves, paths, devices.
REPLACEMENTS: tuple[Any, ...] = (
    None,
    True,
    False,
    0,
    1,
    -1,
    5,
    7,
    2**31,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63),
    10**30,
    1.5,
    -0.0,
    1e308,
    float("inf"),
    "",
    "x",
    "s0",
    "u0",
    "Symbol('s0', positive=True, integer=True)",
    "Pow(s0, 64)",
    "cuda",
    "meta",
    "cpu",
    "../../escape",
    "weight_0",
    "tensor_0",
    "torch.ops.aten.add.Tensor",
    "torch.ops.higher_order.cond",
    "builtins.dict",
    "a" * 300,
    [],
    {},
    [1],
    [[]],
    {"as_int": 5},
    {"as_int": 2**62},
    {"as_expr": {"expr_str": "s0", "hint": None}},
    {"type": "cpu", "index": None},
    {"as_tensor": {"name": "x"}},
)

#: Keys whose values the reader interprets (a device, a size, an expression, a structure torch walks),
#: edited more often.
STEERING_KEYS = frozenset(
    {
        "type",
        "index",
        "device",
        "dtype",
        "sizes",
        "strides",
        "storage_offset",
        "as_int",
        "layout",
        "requires_grad",
        "path_name",
        "use_pickle",
        "is_param",
        "module_call_graph",
        "signature",
        "in_spec",
        "out_spec",
        "expr_str",
        "hint",
        "min_val",
        "max_val",
        "range_constraints",
        "graph_module",
        "config",
    }
)


class FuzzNet(torch.nn.Module):
    """Conv, BatchNorm, a lifted constant, a stride-0 buffer and a 1.2 MB buffer
    (a payload the reader maps, not reads)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.register_buffer("table", torch.randn(300, 1000))
        self.register_buffer("wide", torch.ones(4).expand(6, 4))
        self.offset = torch.arange(4.0).view(1, 4, 1, 1)
        self.eval()

    def forward(self, x):
        return (
            self.bn(self.conv(x)) + self.offset + self.table[:4, :1].view(1, 4, 1, 1) + self.wide[:1].view(1, 4, 1, 1)
        )


def genuine_fuzz_base(path: Path) -> Path:
    """A real torch.export.save archive of FuzzNet with a dynamic batch (so its program holds shape expressions)."""
    batch = torch.export.Dim("batch", min=2, max=64)
    program = torch.export.export(FuzzNet(), (torch.randn(2, 3, 8, 8),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))
    return path


def mutated(genuine: Path, seed: int, index: int, out: Path) -> tuple[Path, list[str]]:
    """(case `index` of run `seed` written to `out`, what was done to it)."""
    chance = random.Random(f"{seed}:{index}")
    with zipfile.ZipFile(genuine) as source:
        root = source.namelist()[0].split("/")[0] + "/"
        entries = [(info.filename[len(root) :], source.read(info)) for info in source.infolist()]
    done: list[str] = []
    raw_edits = []
    for _ in range(chance.choice((1, 1, 2, 3))):
        kind = chance.choices(("json", "bytes", "drop", "empty", "swap", "zip"), weights=(8, 3, 1, 1, 1, 1))[0]
        if kind == "zip":
            raw_edits.append(chance.random())
            done.append("zip bytes")
            continue
        done.append(_mutate(entries, kind, chance))
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for name, data in entries:
            target.writestr(root + name, data)
    if raw_edits:
        data = bytearray(out.read_bytes())
        for _ in raw_edits:
            if chance.random() < 0.2:
                del data[chance.randrange(len(data)) :]
            else:
                for _ in range(chance.randint(1, 8)):
                    data[chance.randrange(len(data))] = chance.randrange(256)
        out.write_bytes(bytes(data))
    return out, done


def _mutate(entries: list[tuple[str, bytes]], kind: str, chance: random.Random) -> str:
    names = [name for name, _ in entries]
    if kind == "json":
        name = chance.choice([n for n in JSON_ENTRIES if n in names] or names)
        position = names.index(name)
        try:
            document = json.loads(entries[position][1])
        except ValueError:
            return f"json {name}: not JSON any more"
        what = _edit_json(document, chance)
        entries[position] = (name, json.dumps(document).encode())
        return f"json {name}: {what}"
    position = chance.randrange(len(entries))
    name, data = entries[position]
    if kind == "drop":
        del entries[position]
        return f"dropped {name}"
    if kind == "empty":
        entries[position] = (name, b"")
        return f"emptied {name}"
    if kind == "swap":
        other = chance.randrange(len(entries))
        other_name, other_data = entries[other]
        entries[position], entries[other] = (name, other_data), (other_name, data)
        return f"swapped the bytes of {name} and {other_name}"
    changed = bytearray(data)
    if changed and chance.random() < 0.3:
        del changed[chance.randrange(len(changed)) :]
        what = "cut"
    else:
        for _ in range(chance.randint(1, 6)):
            if changed:
                changed[chance.randrange(len(changed))] = chance.randrange(256)
        what = "flipped"
    entries[position] = (name, bytes(changed))
    return f"bytes of {name} {what}"


def _edit_json(document: Any, chance: random.Random) -> str:
    """Apply one edit to a random place of `document` (a depth first, then a place at that depth, so the few structural
    keys near the top are edited as often as the many leaves); what was done."""
    by_depth: dict[int, list] = {}
    for place in _places(document, "", 0):
        by_depth.setdefault(place[3], []).append(place)
    if not by_depth:
        return "nothing to edit"
    steered = [place for places in by_depth.values() for place in places if place[1] in STEERING_KEYS]
    if steered and chance.random() < 0.3:
        parent, key, path, _ = chance.choice(steered)
    else:
        parent, key, path, _ = chance.choice(by_depth[chance.choice(sorted(by_depth))])
    value = parent[key]
    move = chance.choice(("replace", "replace", "replace", "retype", "delete", "duplicate", "empty", "nudge", "wrap"))
    if move == "retype":  # a container where a scalar belongs, or a scalar where a container does: what readers trip on
        parent[key] = chance.choice(
            [r for r in REPLACEMENTS if isinstance(r, (dict, list)) != isinstance(value, (dict, list))]
        )
    elif move == "delete":
        del parent[key]
    elif move == "duplicate" and isinstance(parent, list):
        parent.insert(key, value)
    elif move == "empty":
        parent[key] = type(value)() if isinstance(value, (dict, list, str)) else None
    elif move == "nudge" and type(value) is int:
        parent[key] = chance.choice((value + 1, value - 1, -value, value * 2**40, 2**63 - 1, 2**64, 0))
    elif move == "wrap":
        parent[key] = [value]
    else:
        move = "replace"
        alike = [r for r in REPLACEMENTS if type(r) is type(value)]
        parent[key] = chance.choice(alike if alike and chance.random() < 0.5 else REPLACEMENTS)
    return f"{move} {path}"


def _places(value: Any, path: str, depth: int):
    """(container, key, path, depth) of every value in a JSON document."""
    if isinstance(value, dict):
        for key in list(value):
            yield value, key, f"{path}.{key}", depth
            yield from _places(value[key], f"{path}.{key}", depth + 1)
    elif isinstance(value, list):
        for index in range(len(value)):
            yield value, index, f"{path}[{index}]", depth
            yield from _places(value[index], f"{path}[{index}]", depth + 1)


def main(genuine: str, seed: str, first: str, count: str, folder: str) -> None:
    from converters.models.loading import load_model
    from schemas import InputFileError

    load_model(Path(genuine))  # imports and torch's first-use costs, before any case is timed
    for index in range(int(first), int(first) + int(count)):
        path, done = mutated(Path(genuine), int(seed), index, Path(folder) / f"case-{index}.pt2")
        print(json.dumps({"case": index, "started": done}), flush=True)
        try:
            load_model(path)
            outcome = {"outcome": "read"}
        except InputFileError as error:
            outcome = {"outcome": "refused", "code": error.code, "message": str(error)}
        except BaseException as error:  # noqa: BLE001 - what the test is looking for
            outcome = {"outcome": "crashed", "type": type(error).__name__, "traceback": traceback.format_exc()[-3000:]}
        print(json.dumps({"case": index, "done": done, **outcome}), flush=True)
        path.unlink()


if __name__ == "__main__":
    main(*sys.argv[1:])
