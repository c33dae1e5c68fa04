"""`normbridge`: convert and check layers, inspect, port, export and monitor whole models, and run the registry.

Every command is a thin shell over the library (converters, registry); failures print one line
naming the layer and setting and exit non-zero (see schemas.errors.EXIT_CODES). Command modules are
imported here explicitly: tests/cli/test_cli.py::test_every_command_module_is_registered fails when a
module in cli/commands/ is missing from COMMAND_MODULES.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import sys


def _interrupted_while_starting(signum: int, frame) -> None:
    """Ctrl-C while the commands' modules import (a few tenths of a second) says so and exits 130, instead of printing
    the traceback of whichever import it stopped."""
    sys.stderr.write("interrupted while starting\n")
    raise SystemExit(128 + signum)


if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # a caller that ignores Ctrl-C keeps ignoring it
    signal.signal(signal.SIGINT, _interrupted_while_starting)

from .app import app  # noqa: E402

# each registers its commands on `app`, in this order
from .commands import inspect, layers, mlflow_commands, monitoring, port, pull, registry, layer_export, service, serving  # noqa: E402,F401

if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # commands see Ctrl-C as KeyboardInterrupt, as before

COMMAND_MODULES = (layers, inspect, port, serving, monitoring, registry, pull, layer_export, service, mlflow_commands)


def main() -> None:
    """The console script: run the command, then leave without tearing the interpreter down.

    Why: once a command has imported torch, TensorFlow or onnxruntime, Python's finalization (freeing every module's
    objects one by one) took about 1.1 s of a cold `normbridge register`'s 8 s, after the last line was printed; the
    operating system frees the memory at once. Everything an exit owes still runs first: Python joins the threads and
    runs the atexit handlers registered after this one (private workers reaped, connections closed), then `_leave`
    flushes the logs and standard streams. A command that crashed (not a SystemExit) exits as Python does.

    The objects the imports above left are frozen first (`gc.freeze`): Python's full collections, which the command's
    own data triggers, then skip them. Parsing the shared worker's 435 kB answer for a 53-BatchNorm registration took 36
    ms with them scanned, 4 ms without; they live until the process ends anyway. (converters/heap.py settles a worker's
    heap the same way; importing it here would import the converters package before the command needs it.)"""
    gc.freeze()
    finished: list = []
    atexit.register(_leave, finished)  # registered before anything the command imports: it runs last
    _install_stop_handlers()
    try:
        app()
    except SystemExit as stop:
        if _INTERRUPTED and stop.code == 130:  # Typer ends a KeyboardInterrupt with 130 and prints nothing
            sys.stderr.write(interrupted_message(sys.argv[1:]) + "\n")
        finished.append(stop.code)
        raise
    finished.append(0)


_INTERRUPTED: list = []


def _install_stop_handlers() -> None:
    """Ctrl-C and SIGTERM unwind the command (`_interrupt`, `_terminated`), and a stop that Python swallowed is given
    again (`_stops_not_swallowed`)."""
    signal.signal(signal.SIGTERM, _terminated)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)
    sys.unraisablehook = _stops_not_swallowed(sys.unraisablehook)


def _stops_not_swallowed(hook):
    """`sys.unraisablehook` that delivers a stop again when it landed where Python cannot raise: a signal handler runs
    in whatever Python code the main thread is in, and when that was a weakref callback or a `__del__` of a garbage
    collection (SQLAlchemy's, seen), its KeyboardInterrupt was printed as "Exception ignored" and the registration
    went on to commit. The signal is simulated again for the main thread (`_thread.interrupt_main`), from another
    thread a moment later so that its handler runs in the main thread's code after this hook (called from the main
    thread, it would run in the hook, and be swallowed again); one landing in another finalizer comes back here."""
    import _thread
    import time

    def again(signum: int) -> None:
        def later() -> None:
            time.sleep(0.05)  # this hook and the finalizer that called it have returned by then
            _thread.interrupt_main(signum)

        _thread.start_new_thread(later, ())  # not threading.Thread: its start() waits, and the handler would run there

    def unraisable(info) -> None:
        stop = info.exc_value
        if isinstance(stop, KeyboardInterrupt):
            again(signal.SIGINT)
        elif isinstance(stop, SystemExit) and stop.code == 128 + signal.SIGTERM:
            again(signal.SIGTERM)
        else:
            hook(info)

    return unraisable


def _interrupt(signum: int, frame) -> None:
    """Ctrl-C: remembered (so the exit can say what stopped), then Python's own KeyboardInterrupt."""
    _INTERRUPTED.append(signum)
    raise KeyboardInterrupt


def interrupted_message(args: list[str]) -> str:
    """What a Ctrl-C stopped, and what it left: every file and registry write of normbridge appears whole or not at
    all."""
    commands = {command.name or command.callback.__name__ for command in app.registered_commands}
    commands |= {group.name for group in app.registered_groups if group.name}
    command = next((arg for arg in args if arg in commands), None)
    what = f"`normbridge {command}`" if command else "normbridge"
    return (
        f"interrupted: {what} stopped before it finished (Ctrl-C); nothing is half written: a file or registry "
        "version it was writing appears whole or not at all."
    )


def _terminated(signum: int, frame) -> None:
    """SIGTERM (`kill`, a supervisor stopping the command) unwinds like Ctrl-C, so half-written temporary files are
    removed by the writers' own cleanup; Python's default would end the process where it stood. Exit 143 (128 + 15)."""
    raise SystemExit(128 + signum)


def _leave(finished: list) -> None:
    if not finished:
        return  # an uncaught error: Python's own exit (traceback printed, status 1)
    code = finished[0]
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(
        code if isinstance(code, int) else (0 if code is None else 1)
    )  # a message code was printed by Python already


if __name__ == "__main__":  # pragma: no cover
    main()
