"""`uerl watch`: the frame drawn from real scrapes and the command around it.

tests/metrics_scrapes/ holds three rounds of scrapes of a real `uerl local` run (two
workers; Ray's and uerl's samples of each node, Ray's others cut but one family): `a`
and `b` while it trained, `c` after runner 2's game was killed and came back. The frame's
figures are checked against the same files read here by Prometheus' own parser.
"""

from __future__ import annotations

import http.server
import json
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from host_speed import guard
from proc_tree import Deadline, StartedProcesses
from prometheus_client.parser import text_string_to_metric_families

from training.commands import watch
from training.telemetry import scrape
from training.telemetry.scrape import Sample, Scrape, quantile
from training.telemetry.watch_view import WIDTH, WatchState, elide

ROOT = Path(__file__).resolve().parent.parent
SCRAPES = Path(__file__).parent / "metrics_scrapes"
NODES = ("head", "learner1", "worker1", "worker2")


def text(round_: str) -> str:
    return "".join((SCRAPES / f"{round_}-{node}.txt").read_text() for node in NODES)


def round_scrape(round_: str) -> Scrape:
    samples = [
        s for node in NODES for s in scrape.parse((SCRAPES / f"{round_}-{node}.txt").read_text())
    ]
    return Scrape(samples, {node: None for node in NODES})


def by_runner(round_: str, name: str) -> dict[str, float]:
    """Prometheus' parser, summed over Ray's labels (as `sum by (runner)`)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text(round_)):
        for s in family.samples:
            if s.name == name:
                out[s.labels["runner"]] = out.get(s.labels["runner"], 0.0) + s.value
    return out


def buckets(round_: str, runner: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(text(round_)):
        for s in family.samples:
            if s.name == "ray_uerl_game_step_seconds_bucket" and s.labels["runner"] == runner:
                le = float(s.labels["le"])
                out[le] = out.get(le, 0.0) + s.value
    return out


def row(frame: list[str], first: str) -> list[str]:
    (line,) = [line for line in frame if line.split() and line.split()[0] == first]
    return line.split()


def test_the_scrapes_hold_two_runners_that_sampled_between_rounds() -> None:
    a, b = by_runner("a", "ray_uerl_env_steps_total"), by_runner("b", "ray_uerl_env_steps_total")
    assert set(a) == set(b) == {"1", "2"}
    assert all(b[r] > a[r] for r in a)


def test_each_runners_rate_is_its_counters_change_over_the_time_between_scrapes() -> None:
    state = WatchState()
    state.add(round_scrape("a"), at=100.0)
    state.add(round_scrape("b"), at=110.0)
    frame = state.frame(now=0.0)
    a, b = by_runner("a", "ray_uerl_env_steps_total"), by_runner("b", "ray_uerl_env_steps_total")
    for runner in ("1", "2"):
        assert row(frame, runner)[2] == f"{(b[runner] - a[runner]) / 10:,.0f}", frame
    total = sum(b[r] - a[r] for r in a) / 10
    assert row(frame, "all")[1] == f"{total:,.0f}"


def test_a_runners_rate_waits_for_a_second_change_of_its_counter() -> None:
    state = WatchState()
    state.add(round_scrape("a"), at=100.0)
    state.add(round_scrape("a"), at=102.0)  # Ray's agent has not exported anew
    assert row(state.frame(now=0.0), "1")[2] == "..."
    assert not state.rates_known()


def test_step_latency_percentiles_are_those_of_the_steps_between_the_scrapes() -> None:
    state = WatchState()
    state.add(round_scrape("a"), at=100.0)
    state.add(round_scrape("b"), at=110.0)
    frame = state.frame(now=0.0)
    for runner in ("1", "2"):
        early, late = buckets("a", runner), buckets("b", runner)
        between = {le: late[le] - early.get(le, 0.0) for le in late}
        for column, q in ((3, 0.5), (4, 0.99)):
            expected = quantile(q, between)
            assert expected is not None
            assert abs(float(row(frame, runner)[column]) / 1000 - expected) <= expected * 0.01


def test_quantile_interpolates_inside_the_bucket_as_histogram_quantile_does() -> None:
    cumulative = {0.001: 50.0, 0.002: 100.0, float("inf"): 100.0}
    assert quantile(0.5, cumulative) == pytest.approx(0.001)
    assert quantile(0.99, cumulative) == pytest.approx(0.001 + 0.001 * 49 / 50)
    assert quantile(0.5, {0.001: 0.0, float("inf"): 4.0}) == 0.001  # all past the last bound
    assert quantile(0.5, {}) is None and quantile(0.5, {float("inf"): 0.0}) is None


def test_a_killed_game_shows_its_fault_and_reconnect_and_the_iterations_the_driver_reported() -> (
    None
):
    state = WatchState()
    for at, round_ in ((100.0, "a"), (110.0, "b"), (112.0, "c")):
        state.add(round_scrape(round_), at=at)
    frame = state.frame(now=0.0)
    faults = by_runner("c", "ray_uerl_game_faults_total")
    reconnects = by_runner("c", "ray_uerl_game_reconnects_total")
    assert faults["2"] >= 1 and reconnects["2"] >= 1
    cells = row(frame, "2")
    assert cells[5:] == ["up", f"{faults['2']:.0f}", f"{reconnects['2']:.0f}"], frame
    assert row(frame, "1")[6] == "0"
    iterations = sorted(
        {
            int(s.value)
            for r in "abc"
            for f in text_string_to_metric_families(text(r))
            for s in f.samples
            if s.name == "ray_uerl_training_iteration"
        },
        reverse=True,
    )
    shown = [int(line.split()[0]) for line in frame[2 : 2 + len(iterations)]]
    assert shown == iterations[:5], frame
    assert frame[0].startswith("uerl watch: run run (stack uerl)")


def test_a_game_down_says_since_when() -> None:
    tags = {"run": "r", "runner": "3", "game": "g:1", "stack": "s"}
    state = WatchState()
    state.add(
        Scrape(
            [
                Sample("uerl_game_up", tags, 0.0),
                Sample("uerl_game_down_since_timestamp_seconds", tags, 1000.0),
                Sample("uerl_game_faults_total", tags, 2.0),
            ],
            {"x": None},
        )
    )
    assert row(state.frame(now=1075.0), "3")[5:8] == ["down", "1m15s", "2"]


def test_every_line_fits_80_columns_and_a_long_game_name_keeps_its_port() -> None:
    game = "uerl-ue-12.uerl-ue.a-rather-long-namespace-name.svc.cluster.local:50051"
    tags = {"run": "r", "runner": "12", "game": game, "stack": "s"}
    state = WatchState()
    for at, steps in ((0.0, 100.0), (10.0, 20_000_100.0), (20.0, 40_000_100.0)):
        state.add(
            Scrape(
                [Sample("uerl_env_steps_total", tags, steps)]
                + [
                    Sample(f"uerl_{n}", {"run": "r", "stack": "s"}, 123456789.5)
                    for n in (
                        "training_iteration",
                        "training_env_steps",
                        "episode_return_mean",
                        "env_runners_healthy",
                        "env_runners",
                        "training_env_steps_per_second",
                    )
                ],
                {f"very-long-target-name-{i}.example.internal:8080": "refused" for i in range(9)},
            ),
            at=at,
        )
    frame = state.frame(now=0.0)
    assert all(len(line) <= WIDTH for line in frame), "\n".join(frame)
    game_cell = row(frame, "12")[1]
    assert game_cell.endswith(":50051") and "~" in game_cell and game_cell == elide(game, 15)
    for round_ in ("a", "b", "c"):
        state.add(round_scrape(round_))
        assert all(len(line) <= WIDTH for line in state.frame())


# ---- against endpoints -----------------------------------------------------------------


@pytest.fixture
def endpoint() -> Iterator[str]:
    """An HTTP endpoint serving the `a` then `b` then `c` round of worker1's and the
    head's scrape, one a request, as a Ray node's metrics agent does."""
    rounds = iter(["a", "b", "c"])
    last = ["a"]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            last[0] = next(rounds, last[0])
            body = "".join(
                (SCRAPES / f"{last[0]}-{node}.txt").read_text() for node in ("head", "worker1")
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def refused_target() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"  # closed again: nothing listens there


def test_once_prints_one_frame_with_both_runners_rate_and_exits_0(
    endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = refused_target()
    code = watch.main(["--targets", f"{endpoint},{dead}", "--once", "--interval", "0.1"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert row(out, "1")[2] not in ("...", "0"), out
    assert f"{endpoint} ok," in out[-1] and f"{dead} refused" in out[-1], out


def test_a_target_that_refuses_is_said_in_the_frame_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    dead = refused_target()
    assert scrape.scrape_targets([dead]).targets == {dead: "refused"}
    code = watch.main(["--targets", dead, "--once"])
    captured = capsys.readouterr()
    assert code == 1  # nothing answered
    assert f"targets: {dead} refused" in captured.out
    assert "Traceback" not in captured.err


def test_run_dir_without_targets_file_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert watch.main(["--run-dir", str(tmp_path), "--once"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "metrics_targets.json" in line


def test_the_newest_local_run_is_the_default(tmp_path: Path) -> None:
    for name, mtime in (("old", 1000), ("new", 2000)):
        (tmp_path / name).mkdir()
        path = tmp_path / name / watch.TARGETS_FILE
        path.write_text("[]")
        os.utime(path, (mtime, mtime))
    assert watch.newest_run_dir(tmp_path) == tmp_path / "new"
    with pytest.raises(watch.SourceError, match="--run-dir, --targets or --prometheus"):
        watch.newest_run_dir(tmp_path / "none")


def test_ctrl_c_ends_a_live_watch_at_once_with_exit_0_and_the_cursor_shown(
    endpoint: str, started: StartedProcesses, deadline: Deadline
) -> None:
    """On a terminal (a pty): frames drawn in place (cursor home, lines cleared), and
    after Ctrl-C the cursor shown again."""
    master, slave = pty.openpty()
    proc = started.popen(
        [sys.executable, "-m", "training.cli", "watch", "--targets", endpoint, "--interval", "0.5"],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(slave)
    seen = b""
    try:
        while seen.count(watch.HOME.encode()) < 3:  # the first frames drawn
            ready, _, _ = select.select([master], [], [], min(1.0, deadline.left()))
            if ready:
                seen += os.read(master, 65536)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=guard(10))
        took = time.monotonic() - sent
        while True:
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the pty's other end closed
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert code == 0, err
    assert took < guard(3), took
    assert "Traceback" not in err
    assert seen.startswith(watch.HIDE_CURSOR.encode())
    assert seen.endswith(watch.SHOW_CURSOR.encode())
    assert b"uerl watch: run run" in seen


def test_a_prometheus_servers_series_are_read_as_the_endpoints_are() -> None:
    """One instant query (`/api/v1/query`), its vector read as the same samples."""
    reply = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {
                    "metric": {"__name__": "ray_uerl_env_steps_total", "runner": "1",
                               "game": "g:1", "run": "r", "instance": "pod:8080"},
                    "value": [1.0, "1500"],
                },
            ],
        },
    }  # fmt: skip
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        got = scrape.scrape_prometheus(url)
    finally:
        server.shutdown()
        server.server_close()
    assert got.targets == {url: None}
    (sample,) = got.samples
    assert (sample.name, sample.labels["runner"], sample.value) == (
        "uerl_env_steps_total",
        "1",
        1500,
    )
    assert asked[0].startswith("/api/v1/query?query=")
