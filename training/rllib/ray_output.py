"""What a run shows on the console: uerl's own lines and real problems, not Ray's chatter.

Ray and RLlib log routine INFO/WARNING lines in the driver and in every actor (the
new-API-stack notice, RLlib's own use of its deprecated `RLModuleConfig`, Ray
Train's process-group line, ...), and Ray copies the actors' output to the
driver's console. By default (`RayConsole(..., verbose=False)`):

- in the driver, Ray's and RLlib's console handlers let only ERROR and worse
  through; everything they log also goes to the run's log file;
- in every worker process of the job (a `worker_process_setup_hook`), records of
  Ray's loggers below ERROR are tagged; the driver writes every line the actors
  print to the log file and prints only the untagged ones (errors, tracebacks,
  uerl's own warnings, anything printed directly), as Ray would;
- one C++ line of the driver's Ray core, printed while RLlib creates its env
  runners, is moved to the log file (see `CORE_WORKER_NOISE`).

Apart from that one known line, nothing at ERROR or worse is held back, and neither
is any line this module does not recognise. `verbose=True` leaves Ray's output
exactly as Ray prints it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Dotted path Ray imports in each worker process of the job at its start.
WORKER_SETUP_HOOK = "training.rllib.ray_output.quiet_worker"
# Prefixed to every line of a record below ERROR that a worker's Ray logger prints.
QUIET_TAG = "[uerl-quiet] "
# RLlib's own console format (its handler exists only once `ray.rllib` is imported,
# after the setup hook ran): such lines below ERROR are routine too.
RLLIB_ROUTINE_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\s+(DEBUG|INFO|WARNING) \S+:\d+ -- "
)
# Ray's core worker (C++) prints this on the driver's stderr for every env runner
# RLlib creates: RLlib passes the algorithm config as an object reference and asks
# Ray to restart its env runners (ray-project/ray#53727). The object is owned and
# kept alive by this driver on its own node, so the restart it warns about cannot
# fail while the run is alive. It goes to the log file instead of the console.
CORE_WORKER_NOISE = (
    r"core_worker\.cc:\d+: Actor with class name: '[^']*' and ID: '[0-9a-f]*' has "
    r"constructor arguments in the object store and max_restarts > 0"
)
# Where Ray's own handler of the actors' output is registered in the driver.
RAY_PRINT_HANDLER = "ray_print_logs"

_quiet_worker = False


# ---------------------------------------------------------------------- workers


class _TagRoutine(logging.Formatter):
    """Wraps a handler's formatter: every line of a record below ERROR gets QUIET_TAG."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter("%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = self.inner.format(record)
        if record.levelno >= logging.ERROR:
            return text
        return "\n".join(QUIET_TAG + line for line in text.split("\n"))


def _ray_loggers() -> list[logging.Logger]:
    """Ray's loggers in this process that have handlers of their own."""
    existing = logging.root.manager.loggerDict
    names = sorted(name for name in existing if name == "ray" or name.startswith("ray."))
    loggers = [existing[name] for name in names]
    return [lg for lg in loggers if isinstance(lg, logging.Logger) and lg.handlers]


def _stream_handlers(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers of `logger` that print (Ray's PlainRayHandler prints through an
    inner handler in workers), not files."""
    out: list[logging.Handler] = []
    for handler in logger.handlers:
        if isinstance(handler, logging.FileHandler) or not isinstance(
            handler, logging.StreamHandler
        ):
            continue
        out.append(handler)
        inner = getattr(handler, "plain_handler", None)
        if isinstance(inner, logging.Handler):
            out.append(inner)
    return out


def tag_routine_records() -> None:
    """In a worker process: tag what Ray's loggers print below ERROR (idempotent)."""
    for logger in _ray_loggers():
        for handler in _stream_handlers(logger):
            if not isinstance(handler.formatter, _TagRoutine):
                handler.setFormatter(_TagRoutine(handler.formatter))


def quiet_worker() -> None:
    """The `worker_process_setup_hook`: runs in each worker process of the job."""
    global _quiet_worker
    _quiet_worker = True
    tag_routine_records()


def retag_if_quiet() -> None:
    """Tag loggers created since the hook ran (RLlib's, once imported), if it ran here."""
    if _quiet_worker:
        tag_routine_records()


def is_routine(line: str) -> bool:
    """A line an actor printed that only goes to the log file."""
    return line.startswith(QUIET_TAG) or RLLIB_ROUTINE_LINE.match(line) is not None


# ---------------------------------------------------------------------- driver


class _BelowError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def _submitted_setup_hook() -> bool:
    """Whether `ray job submit` already gave this job a worker setup hook (ray.init
    refuses to merge a second one)."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return False
    try:
        runtime_env = json.loads(raw).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return False
    return "worker_process_setup_hook" in runtime_env


class RayConsole:
    """Keeps Ray's and RLlib's routine output off the console for one run (see above).

    Use as a context manager around the run: `runtime_env(address)` for `ray.init`,
    `capture_worker_output()` once Ray is connected, `filtered_stderr()` around
    `build_algo()`. Everything it changes is undone on exit.
    """

    def __init__(self, log_path: Path, *, verbose: bool = False) -> None:
        self.log_path = log_path
        self.verbose = verbose
        # Two handles on one file (appends): the driver's Ray loggers (Ray sets the
        # format of the handlers on its logger), and the actors' lines.
        self._file: logging.FileHandler | None = None
        self._actor_file: logging.FileHandler | None = None
        self._undo: list[Callable[[], None]] = []
        self._workers = logging.getLogger("uerl.ray_output")

    # -- context

    def __enter__(self) -> RayConsole:
        if self.verbose:
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._file = logging.FileHandler(self.log_path, encoding="utf-8")
        self._file.setFormatter(
            logging.Formatter("%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s")
        )
        self._actor_file = logging.FileHandler(self.log_path, encoding="utf-8")
        self._actor_file.setFormatter(logging.Formatter("%(asctime)s\t%(message)s"))
        self._workers.propagate = False
        self._workers.setLevel(logging.INFO)
        self._add_handler(self._workers, self._actor_file)
        self.quiet_driver_loggers()
        return self

    def __exit__(self, *exc: object) -> None:
        while self._undo:
            self._undo.pop()()
        for handler in (self._file, self._actor_file):
            if handler is not None:
                handler.close()
        self._file = self._actor_file = None

    def _add_handler(self, logger: logging.Logger, handler: logging.Handler) -> None:
        logger.addHandler(handler)
        self._undo.append(lambda: logger.removeHandler(handler))

    # -- the driver's own Ray/RLlib loggers

    def quiet_driver_loggers(self) -> None:
        """Ray's loggers in this process: console ERROR+, all to the file (idempotent;
        call again once more of Ray is imported)."""
        if self.verbose or self._file is None:
            return
        for logger in _ray_loggers():
            for handler in _stream_handlers(logger):
                if not any(isinstance(f, _BelowError) for f in handler.filters):
                    below = _BelowError()
                    handler.addFilter(below)
                    self._undo.append(lambda h=handler, f=below: h.removeFilter(f))
            if not logger.propagate and self._file not in logger.handlers:
                self._add_handler(logger, self._file)

    # -- the actors

    def runtime_env(self, address: str) -> dict[str, Any] | None:
        """For `ray.init`: the setup hook that tags the workers' routine lines. Not over
        Ray Client (`ray://`), whose driver prints the actors' lines itself."""
        if self.verbose or address.startswith("ray://") or _submitted_setup_hook():
            return None
        return {"worker_process_setup_hook": WORKER_SETUP_HOOK}

    def capture_worker_output(self) -> bool:
        """Once Ray is connected: every line the actors print goes to the file, the
        untagged ones also to the console as Ray prints them. False if Ray prints no
        actor output here (log_to_driver off, Ray Client)."""
        if self.verbose or self._file is None:
            return False
        try:
            from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
        except ImportError:
            return False
        with dispatcher._lock:
            handlers = list(dispatcher.handlers)
            for i, (name, handle) in enumerate(handlers):
                if name == RAY_PRINT_HANDLER and not isinstance(handle, _WorkerLines):
                    handlers[i] = (name, _WorkerLines(handle, self._workers))
                    dispatcher.handlers = handlers
                    return True
        return False

    # -- the driver's C++ stderr

    @contextlib.contextmanager
    def filtered_stderr(self) -> Iterator[None]:
        """While RLlib builds the algorithm: CORE_WORKER_NOISE lines on this process's
        stderr (file descriptor 2, where Ray's C++ core prints) go to the file; every
        other line passes through unchanged."""
        if self.verbose or self._file is None:
            yield
            return
        with _StderrFilter(CORE_WORKER_NOISE, self.log_path):
            yield


class _WorkerLines:
    """Replaces Ray's printer of the actors' output in the driver; calls it for the
    lines the console should show."""

    def __init__(self, print_lines: Callable[[dict[str, Any]], None], log: logging.Logger):
        self.print_lines = print_lines
        self.log = log

    def __call__(self, data: dict[str, Any]) -> None:
        pid = data.get("pid")
        if pid in ("autoscaler", "raylet"):
            self.print_lines(data)  # Ray's own events: Ray picks what to print
            return
        lines: list[str] = data.get("lines") or []
        who = data.get("actor_name") or data.get("task_name") or ""
        prefix = f"({who + ' ' if who else ''}pid={pid}, ip={data.get('ip')})"
        for line in lines:
            self.log.info("%s %s", prefix, line.removeprefix(QUIET_TAG))
        shown = [line for line in lines if not is_routine(line)]
        if shown:
            self.print_lines({**data, "lines": shown})


# The filter process: copies stdin to stdout line by line, noise to the log file. A
# process, not a thread: it drains what is left even if the driver dies abruptly.
_FILTER_PROGRAM = """
import re, signal, sys
# Signals meant for the driver's process group: this ends when the driver's end closes.
for name in ("SIGINT", "SIGTERM", "SIGHUP"):
    signal.signal(getattr(signal, name), signal.SIG_IGN)
noise = re.compile(sys.argv[1])
out = sys.stdout.buffer
with open(sys.argv[2], "ab") as log:
    for raw in sys.stdin.buffer:
        if noise.search(raw.decode("utf-8", "replace")):
            log.write(raw)
            log.flush()
        else:
            out.write(raw)
            out.flush()
"""


class _StderrFilter:
    """File descriptor 2 through a filter process for the duration of a `with`."""

    DRAIN_TIMEOUT_S = 5.0

    def __init__(self, pattern: str, log_path: Path) -> None:
        self.pattern = pattern
        self.log_path = log_path
        self._saved: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> _StderrFilter:
        sys.stderr.flush()
        saved = os.dup(2)
        read_end, write_end = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    _FILTER_PROGRAM,
                    self.pattern,
                    str(self.log_path),
                ],
                stdin=read_end,
                stdout=saved,
                stderr=saved,
            )
        except OSError:
            os.close(read_end)
            os.close(write_end)
            os.close(saved)
            return self  # no filter: everything stays on the console
        os.close(read_end)
        os.dup2(write_end, 2)
        os.close(write_end)
        self._saved = saved
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is None:
            return
        sys.stderr.flush()
        os.dup2(self._saved, 2)  # the pipe's last writer closes: the filter drains, exits
        os.close(self._saved)
        self._saved = None
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=self.DRAIN_TIMEOUT_S)
