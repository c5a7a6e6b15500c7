"""`uerl watch`'s view: scrapes (training.telemetry.scrape) kept over a window and drawn
as one frame of at most 80 columns: the run's last iterations, each env runner's
throughput, step latency and game health.

Ray's metrics agents take a process's figures every few seconds (10 s by default), so a
counter scraped every second moves in steps: a runner's env steps per second is the
counter's change between the first and the last scrape that saw it change within the
window, over the time between those two scrapes (shown once two changes are seen). The
step latency's percentiles are those of the steps in the same span, from the
histogram's buckets (all the runner's steps until then). The iterations are those the
driver's gauges showed: one quicker than Ray's export can go unseen.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from training.telemetry import ray_metrics as rm
from training.telemetry.scrape import DriverState, RunnerState, Scrape, drivers, quantile, runners

WIDTH = 80
WINDOW_S = 60.0  # the span a rate and the percentiles are taken over
ITERATIONS_SHOWN = 5


@dataclass
class _Point:
    at: float  # monotonic seconds
    env_steps: float
    buckets: dict[float, float]


@dataclass
class _Runner:
    state: RunnerState
    changes: deque[_Point] = field(default_factory=deque)  # when its counter moved

    def rate(self) -> float | None:
        if len(self.changes) < 2:
            return None
        first, last = self.changes[0], self.changes[-1]
        return (last.env_steps - first.env_steps) / max(last.at - first.at, 1e-9)

    def latency(self, q: float) -> float | None:
        if not self.changes:
            return quantile(q, self.state.buckets)
        first, last = self.changes[0], self.changes[-1]
        span = {le: last.buckets.get(le, 0.0) - first.buckets.get(le, 0.0) for le in last.buckets}
        if len(self.changes) < 2 or not any(span.values()):
            span = last.buckets  # all its steps until now
        return quantile(q, span)


@dataclass(frozen=True)
class IterationRow:
    iteration: int
    env_steps: float | None
    steps_per_s: float | None
    episode_return: float | None
    healthy: float | None
    runners: float | None


class WatchState:
    """What `uerl watch` has seen: fed one scrape at a time (`add`), drawn by `frame`."""

    def __init__(self, *, run: str | None = None, window_s: float = WINDOW_S) -> None:
        self.run = run  # the run to show; None: the one the driver reports, else any
        self.window_s = window_s
        self.scrapes = 0
        self.targets: dict[str, str | None] = {}
        self._runners: dict[tuple[str, str], _Runner] = {}
        self._drivers: dict[str, DriverState] = {}
        self.iterations: dict[str, dict[int, IterationRow]] = {}

    def add(self, scrape: Scrape, at: float | None = None) -> None:
        at = time.monotonic() if at is None else at
        self.scrapes += 1
        self.targets = dict(scrape.targets)
        seen = runners(scrape.samples)
        for key, state in seen.items():
            runner = self._runners.get(key)
            if runner is None:
                runner = self._runners[key] = _Runner(state)
                runner.changes.append(_Point(at, state.env_steps, dict(state.buckets)))
            else:
                moved = state.env_steps != runner.changes[-1].env_steps
                runner.state = state
                if moved:
                    runner.changes.append(_Point(at, state.env_steps, dict(state.buckets)))
                    while len(runner.changes) > 2 and runner.changes[0].at < at - self.window_s:
                        runner.changes.popleft()
        for run, driver in drivers(scrape.samples).items():
            self._drivers[run] = driver
            figures = driver.figures
            if rm.ITERATION.name not in figures:
                continue
            iteration = int(figures[rm.ITERATION.name])
            self.iterations.setdefault(run, {})[iteration] = IterationRow(
                iteration,
                figures.get(rm.RUN_ENV_STEPS.name),
                figures.get(rm.RUN_STEPS_PER_S.name),
                figures.get(rm.EPISODE_RETURN.name),
                figures.get(rm.RUNNERS_HEALTHY.name),
                figures.get(rm.RUNNERS.name),
            )

    def shown_run(self) -> str | None:
        if self.run is not None:
            return self.run
        if self.iterations:  # the run whose driver reports the most recent iteration
            return max(self.iterations, key=lambda run: max(self.iterations[run]))
        runs = sorted({key[0] for key in self._runners})
        return runs[-1] if runs else None

    def rates_known(self) -> bool:
        """Whether every runner of the shown run that samples has a rate."""
        run = self.shown_run()
        sampling = [r for key, r in self._runners.items() if key[0] == run and r.state.up != 0]
        return bool(sampling) and all(r.rate() is not None for r in sampling)

    # ---- the frame ---------------------------------------------------------------------

    def frame(self, *, now: float | None = None, width: int = WIDTH) -> list[str]:
        """The view as lines of at most `width` columns. `now`: wall-clock seconds (a game
        down since when)."""
        now = time.time() if now is None else now
        run = self.shown_run()
        driver = self._drivers.get(run or "")
        lines = [self._title(run, driver, now)]
        lines += self._iteration_lines(run)
        lines.append("")
        lines += self._runner_lines(run, now, width)
        lines.append("")
        lines += self._target_lines(width)
        return [fit(line, width) for line in lines]

    def _title(self, run: str | None, driver: DriverState | None, now: float) -> str:
        stack = f" (stack {driver.stack})" if driver and driver.stack else ""
        clock = time.strftime("%H:%M:%S", time.localtime(now))
        return f"uerl watch: run {run or '-'}{stack}  {clock}  scrape {self.scrapes}"

    def _iteration_lines(self, run: str | None) -> list[str]:
        rows = sorted(self.iterations.get(run or "", {}).values(), key=lambda r: r.iteration)
        header = f"{'iteration':>9}  {'env steps':>12}  {'steps/s':>9}  {'return':>9}  runners"
        if not rows:
            return [header, f"{'-':>9}  (no iteration reported yet)"]
        out = [header]
        for row in rows[-ITERATIONS_SHOWN:][::-1]:
            healthy = "-" if row.healthy is None else f"{row.healthy:.0f}"
            total = "-" if row.runners is None else f"{row.runners:.0f}"
            out.append(
                f"{row.iteration:>9}  {_num(row.env_steps, ',.0f'):>12}  "
                f"{_num(row.steps_per_s, ',.0f'):>9}  {_num(row.episode_return, '.1f'):>9}  "
                f"{healthy}/{total}"
            )
        return out

    def _runner_lines(self, run: str | None, now: float, width: int) -> list[str]:
        mine = sorted(
            (r for key, r in self._runners.items() if key[0] == run),
            key=lambda r: (len(r.state.runner), r.state.runner),
        )
        # runner 6, game (elided to fit), steps/s 8, p50 7, p99 7, health 11, faults 6,
        # reconnects 6: two spaces between.
        fixed = 6 + 8 + 7 + 7 + 11 + 6 + 6 + 2 * 7
        game_w = max(8, width - fixed)
        header = (
            f"{'runner':<6}  {'game':<{game_w}}  {'steps/s':>8}  {'p50 ms':>7}  {'p99 ms':>7}  "
            f"{'health':<11}  {'faults':>6}  {'reconn':>6}"
        )
        if not mine:
            return [header, "(no env runner reported yet)"]
        out = [header]
        total = 0.0
        for r in mine:
            s = r.state
            rate = r.rate()
            total += rate or 0.0
            p50, p99 = r.latency(0.5), r.latency(0.99)
            if s.up is None or s.up:
                health = "up"
            elif s.down_since:
                health = f"down {_ago(now - s.down_since)}"
            else:
                health = "down"
            out.append(
                f"{s.runner:<6}  {elide(s.game, game_w):<{game_w}}  "
                f"{_num(rate, ',.0f', '...'):>8}  {_ms(p50):>7}  {_ms(p99):>7}  {health:<11}  "
                f"{s.faults:>6.0f}  {s.reconnects:>6.0f}"
            )
        if len(mine) > 1:
            out.append(f"{'all':<6}  {'':<{game_w}}  {total:>8,.0f}")
        return out

    def _target_lines(self, width: int) -> list[str]:
        if not self.targets:
            return ["targets: none"]
        parts = [f"{target} {why or 'ok'}," for target, why in self.targets.items()]
        parts[-1] = parts[-1].rstrip(",")
        out, line = [], "targets:"
        for part in parts:
            if len(line) + 1 + len(part) > width and line != "targets:":
                out.append(line)
                line = " " * len("targets:")
            line += " " + part
        out.append(line)
        return out


def _num(value: float | None, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1000
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def elide(text: str, width: int) -> str:
    """`text` in `width` columns: its middle replaced by `~` when too long (a game's
    host:port keeps its port)."""
    if len(text) <= width:
        return text
    keep = width - 1
    head = keep // 2
    return text[:head] + "~" + text[len(text) - (keep - head) :]


def fit(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + "~"
