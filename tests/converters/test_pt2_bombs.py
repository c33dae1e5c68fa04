"""`.pt2` archives that cost far more than they hold, or that once crashed the reader (issue 30, holes 2, 3 and 10).

Each is a genuine torch.export.save archive of 14 KiB rewritten as an attacker would (tests/pt2_crafting.py):

- a symbolic size whose numbers sympy would compute for seconds to hours holding the GIL: the issue's
  `Pow(Pow(Pow(Pow(Integer(10), 64), 64), 64), 64)` (14 s before the fix, one level deeper hours) and its other
  spellings (`**`, PowByNatural, LShift, a power over a symbol's coefficient, a product of large literals, one long
  literal, a Float whose exponent (14 s) or precision (over 20 s) is huge, a Max of 200 symbols (39 s), a hint of
  4,000 digits);
- a weight or constant that claims far more than its payload stores: the issue's empty payload of 2**27 elements, which
  torch fills with zeros (+1.8 GiB on the server before the fix), a smaller one (32 MiB) under every claim limit, and a
  stride-0 view of 2**27 elements over 4 stored ones (the registration then holds all of them);
- metadata that raised something other than InputFileError (a 500 on the server, a traceback from the CLI): a weight on
  cuda (a CPU build), hpu, privateuseone or meta, `module_call_graph: 5`, a stride of 2**64 on a size-1 dimension.

Each is refused with bad_input_file naming the entry and the setting, quickly, by the library with its peak memory
measured, and by the CLI (exit 6: in this process for every row, as real processes for the issue's two attacks).
A real server is attacked in tests/registry/test_pt2_upload_bombs.py.
"""

from __future__ import annotations

import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from converters.models.loading import load_model
from schemas import InputFileError
from testkit.processes import stop_process_group
from tests.cli_process import normbridge_command
from tests.cli_run import invoke_cli, run_cli_measured, user_environment
from tests.pt2_crafting import (
    CONSTANTS_CONFIG,
    PROGRAM,
    WEIGHTS_CONFIG,
    claiming,
    craft,
    first_constant,
    genuine_pt2,
    power_tower,
    size_expression,
    tensor_meta_of,
)

S0 = "Symbol('s0', positive=True, integer=True)"
PEAK_BOUND = 100 << 20  # bytes a refused file may add to the peak resident memory
SECONDS = 10.0  # a refusal takes milliseconds; the bombs took 14 s to hours

#: name -> (how the genuine file is rewritten, the entry the refusal names, what it says)
SIZE_BOMBS = {
    "power tower (the issue's)": (
        size_expression(power_tower(4)),
        PROGRAM,
        r"'Pow\(Integer\(10\), 64\)'.* bits from literals alone",
    ),
    "power tower one level deeper": (
        size_expression(power_tower(5)),
        PROGRAM,
        r"bits from literals alone, more than the 64",
    ),
    "power operator": (
        size_expression("(((10**64)**64)**64)**64"),
        PROGRAM,
        r"'10 \*\* 64'.* bits from literals alone",
    ),
    "PowByNatural": (
        size_expression("PowByNatural(PowByNatural(PowByNatural(Integer(10), 64), 64), 64)"),
        PROGRAM,
        r"from literals alone",
    ),
    "power over a symbol's coefficient": (
        size_expression(power_tower(4).replace("Integer(10)", f"Mul(Integer(10), {S0})")),
        PROGRAM,
        r"bits with every symbol at 2\*\*64, more than the 16384",
    ),
    "product of large literals": (
        size_expression("Mul(" + ", ".join(["Integer(18446744073709551615)"] * 40) + ")"),
        PROGRAM,
        r"2,560 bits from literals alone",
    ),
    "one long literal": (size_expression("Integer(" + "9" * 3000 + ")"), PROGRAM, r"9,966 bits from literals alone"),
    "LShift": (size_expression("LShift(Integer(1), Integer(4611686018427387904))"), PROGRAM, r"from literals alone"),
    "Float exponent": (size_expression("floor(Float('1e-1000000'))"), PROGRAM, r"whose exponent is beyond the 1024"),
    "Float precision": (
        size_expression("floor(Float('1.5', 1000000))"),
        PROGRAM,
        r"1000000 digits of precision, more than the 1024",
    ),
    "Max of 200 symbols": (
        size_expression("Max(" + ", ".join(f"s{i}" for i in range(200)) + ")"),
        PROGRAM,
        r"calls Max with 200 arguments, more than the 8",
    ),
    "hint of 4000 digits": (
        size_expression(S0, hint=10**3999),
        PROGRAM,
        r"'as_int' holds an integer of 13285 bits, more than the 64",
    ),
}
CLAIM_BOMBS = {
    "empty weight of 2**27 elements (the issue's)": (
        claiming(WEIGHTS_CONFIG, "bn.running_mean", [2**27], empty=True),
        WEIGHTS_CONFIG,
        r"'bn.running_mean' claims 536870912 bytes of tensor data",
    ),
    "empty weight of 2**23 elements": (
        claiming(WEIGHTS_CONFIG, "bn.running_var", [2**23], empty=True),
        WEIGHTS_CONFIG,
        r"'bn.running_var': the entry 'data/weights/weight_\d+' is empty, but its tensor claims 8388608",
    ),
    "empty constant of 2**23 elements": (
        claiming(CONSTANTS_CONFIG, first_constant, [2**23], empty=True),
        CONSTANTS_CONFIG,
        r"is empty, but its tensor claims 8388608 elements",
    ),
    "stride-0 view of 2**27 elements": (
        claiming(WEIGHTS_CONFIG, "bn.running_mean", [2**27], [0]),
        WEIGHTS_CONFIG,
        r"'bn.running_mean' claims 536870912 bytes of tensor data",
    ),
}
CRASHES = {
    **{
        f"weight on {device}": (
            tensor_meta_of(WEIGHTS_CONFIG, "bn.running_mean", device={"type": device, "index": None}),
            WEIGHTS_CONFIG,
            rf"'bn.running_mean': 'device' is {{\"type\": \"{device}\"",
        )
        for device in ("cuda", "hpu", "privateuseone", "meta")
    },
    "module_call_graph 5": (
        lambda g, o: craft(g, o, edit_program=lambda p: p["graph_module"].update(module_call_graph=5)),
        PROGRAM,
        r"'graph_module.module_call_graph' is 5, where torch.export.save writes a list",
    ),
    "stride 2**64 on a size-1 dimension": (
        tensor_meta_of(
            WEIGHTS_CONFIG,
            "conv.weight",
            sizes=[{"as_int": n} for n in (1, 3, 3, 3)],
            strides=[{"as_int": n} for n in (2**64, 9, 3, 1)],
        ),
        WEIGHTS_CONFIG,
        r"'conv.weight': tensor_meta 'strides' is \[\{\"as_int\": 18446744073709551616\}",
    ),
}
ATTACKS = {**SIZE_BOMBS, **CLAIM_BOMBS, **CRASHES}


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> Path:
    return genuine_pt2(tmp_path_factory.mktemp("genuine") / "model.pt2")


def hostile(name: str, genuine: Path, folder: Path) -> Path:
    path = ATTACKS[name][0](genuine, folder / (re.sub(r"\W+", "_", name) + ".pt2"))
    assert path.stat().st_size < 64 << 10, f"{name}: the file is {path.stat().st_size} bytes, meant to be small"
    return path


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"/proc/self/status has no {field}")


@pytest.mark.timeout(120)  # before the fix the deeper tower computes for hours: fail instead
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_load_model_refuses_quickly_naming_the_entry_with_bounded_memory(name, genuine, tmp_path):
    path = hostile(name, genuine, tmp_path)
    _, entry, message = ATTACKS[name]
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS now
    before, started = _status("VmRSS"), time.monotonic()
    with pytest.raises(InputFileError) as refused:
        load_model(path)
    took, peak = time.monotonic() - started, _status("VmHWM") - before
    assert refused.value.code == "bad_input_file" and f"'{path}' entry '{entry}'" in str(refused.value), refused.value
    assert re.search(message, str(refused.value)), refused.value
    assert took < SECONDS, f"{name}: refused after {took:.1f} s"
    assert peak < PEAK_BOUND, f"{name}: refusing the file raised this process's peak memory by {peak >> 20} MiB"


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_every_command_refuses_with_exit_6_and_no_traceback(name, genuine, tmp_path):
    """inspect and register (the console script's app, in this process): exit 6, the entry named, nothing registered."""
    path = hostile(name, genuine, tmp_path)
    env = {"NORMBRIDGE_DB": f"sqlite:///{tmp_path / 'reg.db'}", "NORMBRIDGE_BLOBS": str(tmp_path / "blobs")}
    for arguments in (["inspect", str(path)], ["register", "victim", str(path)]):
        done = invoke_cli(*arguments, cwd=tmp_path, env=env, columns=400)
        assert done.returncode == 6, (
            f"{arguments[0]}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
        assert "bad_input_file" in done.stderr and ATTACKS[name][1] in done.stderr and "Traceback" not in done.stderr, (
            done.stderr
        )


@pytest.mark.slow
def test_inspect_processes_refuse_the_issues_attacks_with_exit_6(genuine, tmp_path):
    """The deeper power tower (hours of CPU before the fix, so the process gets a deadline), the 2**27-element empty
    weight (+1.8 GiB before) and the cuda weight (a traceback) through real `normbridge inspect` processes."""
    tower = hostile("power tower one level deeper", genuine, tmp_path)
    process = subprocess.Popen(
        [*normbridge_command(), "inspect", str(tower)],
        cwd=tmp_path,
        env=user_environment({"COLUMNS": "400"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("normbridge inspect was still computing the power tower after 120 s (it starts in a few)")
    finally:
        stop_process_group(process)
    assert process.returncode == 6 and "bad_input_file" in stderr and f"entry '{PROGRAM}'" in stderr, stderr[-3000:]
    files = {
        "genuine": genuine,
        **{
            name: hostile(name, genuine, tmp_path)
            for name in ("empty weight of 2**27 elements (the issue's)", "weight on cuda")
        },
    }
    with ThreadPoolExecutor(len(files)) as pool:
        runs = dict(
            zip(
                files,
                pool.map(
                    lambda path: run_cli_measured("inspect", str(path), cwd=tmp_path, env={"COLUMNS": "400"}),
                    files.values(),
                ),
            )
        )
    done, genuine_peak = runs.pop("genuine")
    assert done.returncode == 0, done.stderr
    for name, (done, peak) in runs.items():
        assert done.returncode == 6 and "bad_input_file" in done.stderr and "Traceback" not in done.stderr, (
            f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}"
        )
        assert ATTACKS[name][1] in done.stderr, done.stderr
        assert peak - genuine_peak < PEAK_BOUND, (
            f"{name}: inspect peaked at {peak >> 20} MiB, a genuine file at {genuine_peak >> 20} MiB"
        )
