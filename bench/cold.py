"""Cold processes, as a user runs them: the `normbridge` CLI, MLflow's log_model + register_model, the bare loaders.

Each measurement is a fresh Python process (imports included), timed from start to exit, median of
`repeat` runs. Stores are created before the clock starts (a user registers into a registry that
exists), and each run gets its own copy of the empty store, so no run finds its model already there.
A registration's gate runs the legs its process has not imported in the shared worker
(converters/gate/shared_worker.py), which is not the CLI's child: `SharedWorkers` adds the CPU it spent
during the run to the CLI's, and times runs with no worker alive (the first registration on a
machine, or after the idle timeout) apart from runs that find it warm (every later one).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow"}
ENV.pop("NORMBRIDGE_SERVER", None)
ENV["NORMBRIDGE_GATE_WORKER"] = "shared"  # what the CLI does by default


@dataclass(frozen=True)
class Timing:
    """Wall seconds of a process from start to exit, and the CPU seconds (user + system) it and the children it waited
    for used.

    CPU seconds hardly move with other processes' load on the cores; wall seconds show what overlapping work saves."""

    wall: float
    cpu: float
    steps: dict = field(default_factory=dict)  # what `normbridge register --json` said its steps took (its "seconds")


def run_seconds(argv: list[str], env: dict | None = None) -> Timing:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env or ENV, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... exited {done.returncode}: {(done.stderr or done.stdout)[-1500:]}")
    return Timing(
        wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), _reported_steps(done.stdout)
    )


def _reported_steps(output: str) -> dict:
    """The "seconds" of a `register --json` answer, {} for any other output."""
    try:
        answer = json.loads(output)
    except ValueError:
        return {}
    return answer.get("seconds", {}) if isinstance(answer, dict) else {}


def medians(times: list[Timing]) -> Timing:
    """The median of each: wall, CPU and every reported step."""
    steps = {
        step: statistics.median(t.steps[step] for t in times)
        for step in times[0].steps
        if all(step in t.steps for t in times)
    }
    return Timing(statistics.median(t.wall for t in times), statistics.median(t.cpu for t in times), steps)


def median_seconds(make_argv, repeat: int, prepare=None) -> Timing:
    """Medians (wall and CPU, each) of `repeat` runs; `prepare(i)` (untimed) sets up run i and returns its env or
    None."""
    times = []
    for i in range(repeat):
        env = prepare(i) if prepare else None
        times.append(run_seconds(make_argv(i), env))
    return medians(times)


class SharedWorkers:
    """The shared gate workers of one folder (the CLI's NORMBRIDGE_WORKER_DIR in these runs):
    their CPU time and stopping them."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.env = {"NORMBRIDGE_WORKER_DIR": str(folder)}

    def cpu(self) -> dict[int, float]:
        """{pid: CPU seconds so far} of the live workers serving this folder and of their children (the second process
        their gate spreads legs to: converters/gate/split_check.py, `spread`), read from /proc."""
        workers, others, tick = {}, {}, os.sysconf("SC_CLK_TCK")
        for entry in Path("/proc").iterdir():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                seconds, parent = (int(fields[11]) + int(fields[12])) / tick, int(fields[1])
            except (OSError, ValueError, IndexError):
                continue
            if b"converters.gate.shared_worker" in argv and any(
                arg.startswith(os.fsencode(self.folder)) for arg in argv
            ):
                workers[int(entry.name)] = seconds
            elif b"converters.gate.check_worker" in argv:
                others[int(entry.name)] = (parent, seconds)
        children = {pid: seconds for pid, (parent, seconds) in others.items() if parent in workers}
        return {**workers, **children}

    def stop(self) -> None:
        """End every worker of this folder (the bench started them) and its children, and wait until they are gone."""
        for pid in self.cpu():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 60
        while self.cpu() and time.monotonic() < deadline:
            time.sleep(0.1)

    def timed(self, argv: list[str], env: dict, cold: bool) -> Timing:
        """One run; its CPU includes what the workers spent meanwhile (all of a worker it started, when `cold`)."""
        if cold:
            self.stop()
        before = self.cpu()
        run = run_seconds(argv, {**env, **self.env})
        after = self.cpu()
        spent = sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())
        return Timing(run.wall, run.cpu + spent, run.steps)

    def settle(self, quiet: float = 1.0, limit: float = 60.0) -> None:
        """Wait until the workers and their children have spent no CPU for `quiet` seconds (at most `limit`): a worker
        imports for its next registration after answering one, and starts its second process, for several seconds."""
        deadline, last = time.monotonic() + limit, sum(self.cpu().values())
        quiet_since = time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - quiet_since < quiet:
            time.sleep(0.25)
            spent = sum(self.cpu().values())
            if spent - last > 0.02:
                last, quiet_since = spent, time.monotonic()

    def median(self, make_argv, repeat: int, prepare, cold: bool) -> Timing:
        """Medians of `repeat` runs, each with no worker alive (`cold`) or after two untimed runs warmed it (the first
        starts the worker, the second, its first job, its second process) and the worker settled."""
        if not cold:
            for warming in (-2, -1):
                self.timed(make_argv(warming), prepare(warming), cold=False)
            self.settle()
        times = [self.timed(make_argv(i), prepare(i), cold) for i in range(repeat)]
        if cold:
            self.stop()
        return medians(times)


def normbridge(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args]


class NormbridgeStores:
    """An empty registry home (migrations run once, untimed), copied fresh for every timed run."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.template = folder / "normbridge-template"
        run_seconds(normbridge("models"), {**ENV, "NORMBRIDGE_HOME": str(self.template)})

    def fresh(self, label: str) -> dict:
        home = self.folder / f"normbridge-{label}"
        shutil.rmtree(home, ignore_errors=True)
        shutil.copytree(self.template, home)
        return {**ENV, "NORMBRIDGE_HOME": str(home)}


MLFLOW_SETUP = """
import sys, mlflow
mlflow.set_tracking_uri(f"sqlite:///{sys.argv[1]}/mlflow.db")
mlflow.MlflowClient().create_experiment("bench", artifact_location=(__import__("pathlib").Path(sys.argv[1]) / "artifacts").as_uri())
"""

MLFLOW_TORCH = """
import sys, mlflow, mlflow.pytorch, torch
from safetensors.torch import load_file
from bench.cold_models import bn_stack
model = bn_stack(int(sys.argv[3]))
model.load_state_dict(load_file(sys.argv[2]))
mlflow.set_tracking_uri(f"sqlite:///{sys.argv[1]}/mlflow.db")
mlflow.set_experiment("bench")
with mlflow.start_run():
    info = mlflow.pytorch.log_model(model.eval(), name="model", serialization_format="pickle")  # its cheapest format
    mlflow.register_model(info.model_uri, "bench")
"""

MLFLOW_KERAS = """
import sys, mlflow, mlflow.keras, keras
model = keras.saving.load_model(sys.argv[2])
mlflow.set_tracking_uri(f"sqlite:///{sys.argv[1]}/mlflow.db")
mlflow.set_experiment("bench")
with mlflow.start_run():
    info = mlflow.keras.log_model(model, name="model")
    mlflow.register_model(info.model_uri, "bench")
"""


class MlflowStores:
    """An MLflow tracking store with its experiment (created once, untimed), copied fresh for every timed run."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.template = folder / "mlflow-template"
        self.template.mkdir()
        run_seconds([sys.executable, "-c", MLFLOW_SETUP, str(self.template)])

    def fresh(self, label: str) -> Path:
        store = self.folder / f"mlflow-{label}"
        shutil.rmtree(store, ignore_errors=True)
        shutil.copytree(self.template, store)
        return store  # its runs' artifacts go under the template's artifact folder, where the experiment points


BARE_TORCH_LOAD = "import sys, torch; torch.export.load(sys.argv[1])"
BARE_KERAS_LOAD = "import sys, keras; keras.saving.load_model(sys.argv[1])"
