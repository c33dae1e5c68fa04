"""Running one cold command and measuring it as a user would feel it: wall seconds, and the peak resident memory of
every process it started, together (its children, and the shared gate worker it leaves behind, which is not its child
once it exits), by polling /proc (Linux)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Run:
    """One command: wall seconds, its exit code and output, and memory in bytes: `peak` is the largest sum of the
    resident memory of all its processes seen at one poll; `peaks` each process's own peak (VmHWM), by pid."""

    argv: list[str]
    seconds: float = 0.0
    returncode: int = 0
    stdout: str = ""
    stderr: str = ""
    peak: int = 0
    peaks: dict[int, int] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    parents: dict[int, int] = field(default_factory=dict)
    peak_anon: int = 0  # the largest sum of anonymous resident memory (RssAnon: not file pages mapped) at one poll
    cli_maxrss: int = 0  # from /usr/bin/time: the peak of the command's process or of a child it waited for, exact

    def processes(self) -> str:
        """'name peak' of every process seen, biggest first."""
        order = sorted(self.peaks, key=self.peaks.get, reverse=True)
        return ", ".join(f"{self.names.get(pid, pid)} {self.peaks[pid] / 2**20:.0f} MiB" for pid in order)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, resident bytes) of `pid`, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[21]) * PAGE


def _hwm(pid: int) -> tuple[int, int]:
    """(VmHWM, RssAnon) of `pid` in bytes, zeros once it is gone."""
    found = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmHWM:", "RssAnon:")):
                found[line.split(":")[0]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return found.get("VmHWM", 0), found.get("RssAnon", 0)


def _name(pid: int) -> str:
    """The part of a command line that says what a process is: `-m MODULE`, the script, or the program."""
    try:
        argv = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return str(pid)
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1]
    scripts = [a for a in argv[1:3] if a.endswith(".py") or "/bin/" in a]
    return Path(scripts[0] if scripts else argv[0]).name if argv else str(pid)


class TreePoller:
    """Polls the processes of one command: its own, every descendant (kept once seen, also after a parent exits and
    it is re-parented), and any process whose command line names `marker` (the run's shared-worker folder)."""

    def __init__(self, root: int, marker: str | None, run: Run, interval: float = 0.1):
        self.root, self.marker, self.run, self.interval = root, marker, run, interval
        self.tracked: set[int] = {root}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _scan(self) -> None:
        parents: dict[int, int] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                got = _stat(int(entry.name))
                if got:
                    parents[int(entry.name)] = got[0]
        grew = True
        while grew:
            found = {pid for pid, parent in parents.items() if parent in self.tracked} - self.tracked
            if self.marker:
                for pid in set(parents) - self.tracked - {os.getpid()}:
                    try:
                        if self.marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                            found.add(pid)
                    except OSError:
                        pass
            grew = bool(found)
            self.tracked |= found

    @staticmethod
    def _unexecuted(pid: int, parent: int) -> bool:
        """A child forked but not yet running its program: its pages are its parent's (counted there), so is its
        command line."""
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes() == Path(f"/proc/{parent}/cmdline").read_bytes()
        except OSError:
            return False

    def sample(self) -> None:
        self._scan()
        total = anon = 0
        for pid in list(self.tracked):
            got = _stat(pid)
            if got is None or self._unexecuted(pid, got[0]):
                continue
            total += got[1]
            hwm, anonymous = _hwm(pid)
            anon += anonymous
            self.run.peaks[pid] = max(self.run.peaks.get(pid, 0), hwm, got[1])
            name = _name(pid)  # again each time: a forked child shows its parent's until it execs
            if name != str(pid) or pid not in self.run.names:
                self.run.names[pid] = name
            self.run.parents.setdefault(pid, got[0])
        self.run.peak = max(self.run.peak, total)
        self.run.peak_anon = max(self.run.peak_anon, anon)

    def _loop(self) -> None:
        while not self.done.is_set():
            self.sample()
            self.done.wait(self.interval)

    def __enter__(self) -> TreePoller:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()


def run_cold(argv: list[str], env: dict, marker: str | None = None, cwd: Path | None = None) -> Run:
    """Start `argv` and wait for it; wall seconds from start to exit and the memory of its whole process tree.

    The command runs under /usr/bin/time for its own exact peak: the ru_maxrss wait4 gives for a child of this
    process would count this process's memory too (Linux keeps the pre-exec peak of the forked copy)."""
    run = Run(argv)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile("r") as peak:
        began = time.perf_counter()
        process = subprocess.Popen(
            ["/usr/bin/time", "-f", "%M", "-o", peak.name, *argv],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
        with TreePoller(process.pid, marker, run):
            run.returncode = process.wait()
            run.seconds = time.perf_counter() - began
        lines = peak.read().split()
        run.cli_maxrss = int(lines[-1]) * 1024 if lines and lines[-1].isdigit() else 0
        for pid in [process.pid, *(pid for pid, parent in run.parents.items() if parent == os.getpid())]:
            run.peaks.pop(pid, None)  # /usr/bin/time itself: a few hundred kB
            run.names.pop(pid, None)
        run.peak = max(run.peak, run.cli_maxrss)
        out.seek(0)
        err.seek(0)
        run.stdout, run.stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    return run
