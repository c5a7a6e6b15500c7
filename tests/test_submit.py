"""`uerl submit`: bad input in one line with exit 2 (or 1 for a cluster it cannot use),
the relay against a local TCP server, the head pod's choice against fake pod lists, and
the job's log, exit status and Ctrl-C against a fake job client. No cluster here: the
real-pods tier (tests/k8s/test_pods_e2e.py) runs it against a stack's head."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import socketserver
import stat
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fake_kube_api import FakeKubeAPI, serving
from fake_ray_dashboard import FakeDashboard
from host_speed import guard

from infra.topology import Topology
from training.commands.submit import main as submit
from training.rayjobs.log_tail import LogTail
from training.submit import head, job, port_forward, ray_token
from training.submit.head import HeadFinder, ready_head
from training.submit.job import CtrlC, Follower
from training.submit.port_forward import HeadConnection, Relay
from training.submit.submit_error import SubmitError

ENDPOINTS = Topology().endpoints()  # namespace uerl, cluster uerl, dashboard :8265
WHERE = "namespace uerl, labels ray.io/cluster=uerl,ray.io/node-type=head"


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str, code: int) -> str:
    """Run `uerl submit *argv`; assert it exits `code` with one line on stderr."""
    assert submit(list(argv)) == code
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.fixture
def endpoints_file(tmp_path: Path) -> Path:
    path = tmp_path / "endpoints.json"
    path.write_text(ENDPOINTS.to_json())
    return path


# ---- bad input ---------------------------------------------------------------------


def test_an_endpoints_file_that_does_not_exist_is_named_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.json"
    err = one_line_error(capsys, "--endpoints", str(missing), "--", "train", code=2)
    assert err == f"uerl submit: --endpoints: cannot read endpoints file {missing}: " + (
        "No such file or directory"
    )


def test_endpoints_missing_a_field_are_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(ENDPOINTS.to_json())
    del data["namespace"]
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps(data))
    err = one_line_error(capsys, "--endpoints", str(path), "--", "train", code=2)
    assert f"{path} is not a valid endpoints object: namespace: Field required" in err


def test_stack_without_pulumi_on_path_says_pulumi_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no `pulumi`
    err = one_line_error(capsys, "--stack", "dev", "--", "train", code=2)
    assert "--stack needs the Pulumi CLI, and `pulumi` is not on PATH" in err
    assert "--endpoints FILE" in err


def _fake_pulumi(directory: Path, script: str) -> None:
    pulumi = directory / "pulumi"
    pulumi.write_text("#!/bin/sh\n" + script)
    pulumi.chmod(pulumi.stat().st_mode | stat.S_IEXEC)


def test_a_stack_without_the_endpoints_output_is_refused_with_pulumis_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_pulumi(tmp_path, "echo 'error: current stack does not have output property "
                           "\"endpoints\"' >&2\nexit 255\n")  # fmt: skip
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin:/bin")
    err = one_line_error(capsys, "--stack", "dev", "--", "train", code=2)
    assert "`pulumi stack output endpoints --json --stack dev` failed: " in err
    assert 'error: current stack does not have output property "endpoints"' in err


def test_a_stacks_invalid_endpoints_output_names_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_pulumi(tmp_path, """echo '{"schema_version": 1, "port": 0}'\n""")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin:/bin")
    err = one_line_error(capsys, "--stack", "dev", "--", "train", code=2)
    assert "stack dev's output `endpoints` is not a valid endpoints object" in err
    assert "port: Input should be greater than or equal to 1" in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["train", "--iterations", "3"], "no command: end the options with `--`"),
        (["--"], "no command after `--`"),
        (["--", "local"], "unknown command 'local' after `--`: `train` or `eval`"),
    ],
    ids=["no-dashes", "nothing-after-dashes", "unknown-command"],
)
def test_a_missing_or_unknown_command_exits_2(
    endpoints_file: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    err = one_line_error(capsys, "--endpoints", str(endpoints_file), *argv, code=2)
    assert said in err


def test_a_bad_train_flag_is_refused_here_before_anything_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `uerl train`'s own parser, its refusal in one line (not train's usage under submit).
    err = one_line_error(capsys, "--endpoints", str(tmp_path / "unread.json"), "--", "train",
                         "--iterations", "0", code=2)  # fmt: skip
    assert err == "uerl submit: train (after `--`): argument --iterations: 0: must be at least 1"


def test_a_run_name_that_is_not_one_path_segment_is_refused_before_the_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: submitted; the job failed on the head. (The endpoints are never read here.)
    err = one_line_error(capsys, "--endpoints", str(tmp_path / "unread.json"), "--", "train",
                         "--run-name", "../x", code=2)  # fmt: skip
    assert err == (
        "uerl submit: train (after `--`): argument --run-name: '../x': a run name is 1 to 100 "
        "letters, digits, '.', '_' and '-', starting with a letter or digit"
    )


def test_a_hyperparameter_typo_after_the_dashes_is_refused_before_the_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = one_line_error(capsys, "--endpoints", str(tmp_path / "unread.json"), "--", "train",
                         "--hp", "clip_parm=0.1", code=2)  # fmt: skip
    assert err == (
        "uerl submit: train (after `--`): --hp: 'clip_parm' is not a PPO training option "
        "(did you mean clip_param?)"
    )


def test_a_submission_id_with_a_space_is_refused_by_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: sent to Ray, which took it as the name of the job's log file.
    with pytest.raises(SystemExit) as exited:
        submit(["--endpoints", str(tmp_path / "unread.json"), "--submission-id", "my job",
                "--", "train"])  # fmt: skip
    assert exited.value.code == 2
    assert "argument --submission-id: 'my job': a submission id is 1 to 100 letters" in (
        capsys.readouterr().err
    )


def test_max_restarts_below_zero_is_refused_by_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        submit(["--endpoints", str(tmp_path / "unread.json"), "--supervise", "--max-restarts",
                "-1", "--", "train", "--run-name", "r"])  # fmt: skip
    assert exited.value.code == 2
    assert "argument --max-restarts: -1: must be at least 0" in capsys.readouterr().err


def test_max_restarts_without_supervise_is_refused_not_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = one_line_error(capsys, "--endpoints", str(tmp_path / "unread.json"), "--max-restarts",
                         "3", "--", "train", code=2)  # fmt: skip
    assert err == (
        "uerl submit: --max-restarts counts a supervisor's restarts: give it with --supervise"
    )


def test_options_that_do_not_go_together_are_refused_before_the_train_flags_are_parsed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: refused only after the train flags' check, which loads RLlib (5 s and more).
    def parsed(command: object) -> str:
        raise AssertionError("the train flags were parsed first")

    monkeypatch.setattr("training.commands.submit._check_command", parsed)
    err = one_line_error(capsys, "--endpoints", str(tmp_path / "unread.json"), "--max-restarts",
                         "3", "--", "train", code=2)  # fmt: skip
    assert err.startswith("uerl submit: --max-restarts counts a supervisor's restarts")


def test_train_flags_without_hyperparameters_are_checked_without_loading_rllib(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # RLlib's training() options are read only to check a hyperparameter given.
    def loaded(algo: str) -> dict[str, Any]:
        raise AssertionError("RLlib's options were read with no hyperparameter to check")

    monkeypatch.setattr("training.rllib.hparams.training_options", loaded)
    missing = tmp_path / "unread.json"
    err = one_line_error(capsys, "--endpoints", str(missing), "--", "train", "--run-name", "r1",
                         code=2)  # fmt: skip
    assert str(missing) in err


def test_a_submission_id_with_supervise_is_refused_not_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = one_line_error(capsys, "--endpoints", str(tmp_path / "unread.json"), "--supervise",
                         "--submission-id", "mine", "--", "train", code=2)  # fmt: skip
    assert err.startswith("uerl submit: --submission-id: a supervised run's attempts are jobs ")


def test_a_kubeconfig_that_does_not_exist_is_named_with_exit_2(
    endpoints_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "kubeconfig"
    err = one_line_error(capsys, "--endpoints", str(endpoints_file), "--kubeconfig",
                         str(missing), "--", "train", code=2)  # fmt: skip
    assert err == f"uerl submit: --kubeconfig {missing}: no such file"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("hello\n", "not a kubeconfig (a YAML map of clusters, users and contexts)"),
        ("- a\n- b\n", "not a kubeconfig (a YAML map of clusters, users and contexts)"),
        ("clusters: 5\ncurrent-context: x\n", "not a kubeconfig (a YAML map of clusters"),
        ("a: [\n", "while parsing a flow node expected the node content"),
    ],
)
def test_a_kubeconfig_that_is_no_kubeconfig_is_one_line_saying_so(
    endpoints_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    text: str,
    said: str,
) -> None:
    # Before: "'str' object does not support item assignment" and the like.
    config = tmp_path / "kubeconfig"
    config.write_text(text)
    err = one_line_error(capsys, "--endpoints", str(endpoints_file), "--kubeconfig",
                         str(config), "--", "train", code=2)  # fmt: skip
    assert err.startswith(f"uerl submit: cannot load {config}: {said}")


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "k",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "k", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    return path


def test_an_unknown_context_is_named_with_exit_2(
    endpoints_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:1")
    err = one_line_error(capsys, "--endpoints", str(endpoints_file), "--kubeconfig",
                         str(config), "--context", "elsewhere", "--", "train", code=2)  # fmt: skip
    assert f"cannot load {config} (context elsewhere)" in err and "elsewhere" in err


def test_an_unreachable_cluster_exits_1_naming_its_api(
    endpoints_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        server = f"https://127.0.0.1:{probe.getsockname()[1]}"
    config = _kubeconfig(tmp_path / "kubeconfig", server)
    err = one_line_error(capsys, "--endpoints", str(endpoints_file), "--kubeconfig",
                         str(config), "--", "train", code=1)  # fmt: skip
    assert err.startswith(f"uerl submit: cannot reach the Kubernetes API at {server}: ")
    assert "Connection refused" in err


# ---- the relay ---------------------------------------------------------------------


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        prefix: bytes = self.server.prefix  # type: ignore[attr-defined]
        while data := self.request.recv(65536):
            self.request.sendall(prefix + data)


@pytest.fixture
def echo_servers() -> Iterator[list[tuple[str, int]]]:
    """Two TCP echo servers on 127.0.0.1 answering with their prefix: b"a:" and b"b:"."""
    servers = []
    for prefix in (b"a:", b"b:"):
        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
        server.daemon_threads = True
        server.prefix = prefix  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield [s.server_address[:2] for s in servers]  # type: ignore[misc]
    for server in servers:
        server.shutdown()
        server.server_close()


def _exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(data)
        return conn.recv(65536)


def test_the_relay_carries_bytes_both_ways_to_a_tcp_server(
    echo_servers: list[tuple[str, int]],
) -> None:
    with Relay(lambda: socket.create_connection(echo_servers[0])) as relay:
        assert relay.url == f"http://127.0.0.1:{relay.port}"
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as conn:
            for text in (b"hello", b"x" * 50_000):
                conn.sendall(text)
                got = b""  # the server prefixes each piece it reads with b"a:"
                while got.replace(b"a:", b"") != text:
                    got += conn.recv(65536)
                assert got.startswith(b"a:")


def test_each_new_connection_calls_connect_again_so_a_replaced_pod_is_followed(
    echo_servers: list[tuple[str, int]],
) -> None:
    target = [echo_servers[0]]
    with Relay(lambda: socket.create_connection(target[0])) as relay:
        assert _exchange(relay.port, b"one") == b"a:one"
        target[0] = echo_servers[1]  # the head replaced: connect now reaches another
        assert _exchange(relay.port, b"two") == b"b:two"


def test_a_failed_connect_closes_that_connection_only_and_is_remembered(
    echo_servers: list[tuple[str, int]],
) -> None:
    failing = [True]

    def connect() -> socket.socket:
        if failing[0]:
            raise ConnectionError("port-forward to pod uerl-head-x port 8265: 404 Not Found")
        return socket.create_connection(echo_servers[0])

    with Relay(connect) as relay:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as conn:
            assert conn.recv(65536) == b""  # closed at once: the client fails and retries
        assert relay.last_error == "port-forward to pod uerl-head-x port 8265: 404 Not Found"
        failing[0] = False
        assert _exchange(relay.port, b"back") == b"a:back"
        assert relay.last_error is None


def test_the_relay_ends_a_connection_when_the_pod_side_closes() -> None:
    ours, theirs = socket.socketpair()  # the pod side, as the API's port-forward gives it
    with Relay(lambda: ours) as relay:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as conn:
            theirs.sendall(b"answer")
            theirs.close()
            got = b""
            while data := conn.recv(65536):
                got += data
        assert got == b"answer"


def test_what_the_pod_side_said_went_wrong_is_remembered() -> None:
    ours, theirs = socket.socketpair()
    theirs.close()  # the kubelet closed the stream at once

    class Refused:  # the API's port-forward when nothing listens on the pod's port
        def __getattr__(self, name: str) -> Any:
            return getattr(ours, name)

        def error(self) -> str:
            return "port-forward to pod uerl-head-a port 8265: connection refused"

    with Relay(Refused) as relay:  # type: ignore[arg-type]
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as conn:
            assert conn.recv(65536) == b""
        deadline = time.monotonic() + guard(30)
        while relay.last_error is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert relay.last_error == "port-forward to pod uerl-head-a port 8265: connection refused"


def test_head_connection_opens_the_port_of_the_head_found_for_each_connection() -> None:
    heads = iter(["uerl-head-old", "uerl-head-new"])
    opened: list[str] = []

    def open_port(pod: str) -> Any:
        opened.append(pod)
        return SimpleNamespace(pod=pod)

    connection = HeadConnection(lambda: next(heads), open_port)
    assert connection().pod == "uerl-head-old"  # type: ignore[attr-defined]
    assert connection().pod == "uerl-head-new"  # type: ignore[attr-defined]
    assert opened == ["uerl-head-old", "uerl-head-new"] and connection.head == "uerl-head-new"


# ---- the head pod ------------------------------------------------------------------


def _pod(name: str, phase: str = "Running", ready: bool = True, **status: Any) -> dict:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {
        "metadata": {"name": name},
        "status": {"phase": phase, "conditions": conditions, **status},
    }


def test_the_running_and_ready_head_is_chosen() -> None:
    pods = [_pod("uerl-head-a", ready=False), _pod("uerl-head-b")]
    assert ready_head(pods, where=WHERE) == "uerl-head-b"


def test_no_head_pod_asks_whether_the_stack_is_up() -> None:
    with pytest.raises(SubmitError) as info:
        ready_head([], where=WHERE)
    assert info.value.exit_code == 1
    assert str(info.value) == (
        f"no Ray head pod ({WHERE}): is the stack up (`pulumi up`), and is this its "
        "cluster (--kubeconfig, --context)?"
    )


def test_a_pending_head_names_its_phase_and_its_waiting_container() -> None:
    pod = _pod("uerl-head-a", phase="Pending", ready=False, containerStatuses=[
        {"name": "ray-head", "ready": False,
         "state": {"waiting": {"reason": "ImagePullBackOff"}}},
    ])  # fmt: skip
    with pytest.raises(SubmitError) as info:
        ready_head([pod], where=WHERE)
    assert info.value.exit_code == 1
    assert str(info.value) == (
        f"the Ray head pod uerl-head-a ({WHERE}) is not ready: phase Pending; "
        "container ray-head waiting (ImagePullBackOff)"
    )


def test_an_unscheduled_head_says_why_it_is_not_scheduled() -> None:
    pod = {"metadata": {"name": "uerl-head-a"}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available: 1 Insufficient cpu."},
    ]}}  # fmt: skip
    with pytest.raises(SubmitError, match=r"phase Pending; not scheduled: 0/1 nodes are avail"):
        ready_head([pod], where=WHERE)


def test_a_running_head_not_yet_ready_says_which_container() -> None:
    pod = _pod("uerl-head-a", ready=False, containerStatuses=[
        {"name": "ray-head", "ready": False, "state": {"running": {}}},
    ])  # fmt: skip
    with pytest.raises(SubmitError, match=r"phase Running; container ray-head running, not"):
        ready_head([pod], where=WHERE)


def test_a_terminating_head_is_passed_over_for_its_ready_successor() -> None:
    old = _pod("uerl-head-a")
    old["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert ready_head([old, _pod("uerl-head-b")], where=WHERE, prefer="uerl-head-a") == (
        "uerl-head-b"
    )
    with pytest.raises(SubmitError, match=r"uerl-head-a .* is terminating, being replaced"):
        ready_head([old], where=WHERE)


def test_the_finder_lists_by_the_stacks_labels_and_follows_a_replaced_head() -> None:
    listed: list[tuple[str, str]] = []
    pods = [[_pod("uerl-head-a"), _pod("uerl-head-b")], [_pod("uerl-head-b")]]

    def list_pods(namespace: str, selector: str) -> list[dict]:
        listed.append((namespace, selector))
        return pods[0]

    finder = HeadFinder(ENDPOINTS, list_pods)
    assert finder.find() == "uerl-head-a"
    pods[0] = [_pod("uerl-head-0"), _pod("uerl-head-a")]
    assert finder.find() == "uerl-head-a"  # stays with its pod while that one is Ready
    pods[0] = [_pod("uerl-head-b")]
    assert finder.find() == "uerl-head-b"  # the old one gone: its successor
    assert set(listed) == {("uerl", "ray.io/cluster=uerl,ray.io/node-type=head")}


def test_the_pod_lister_asks_the_api_for_the_heads_labels_and_reads_its_pods(
    tmp_path: Path,
) -> None:
    """The official client against a stand-in API server (plain HTTP, a token)."""
    asked: list[tuple[str, str | None]] = []
    pod_list = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [{
        "metadata": {"name": "uerl-head-a", "namespace": "uerl",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }]}  # fmt: skip

    server = _json_server(lambda _path: pod_list, asked)
    try:
        host, port = server.server_address[:2]
        config = _kubeconfig(tmp_path / "kubeconfig", f"http://{host}:{port}")
        finder = HeadFinder(ENDPOINTS, head.kube_pod_lister(head.kube_api_client(config, None)))
        assert finder.find() == "uerl-head-a"
    finally:
        server.shutdown()
        server.server_close()
    path, authorization = asked[0]
    assert urllib.parse.unquote(path) == (
        "/api/v1/namespaces/uerl/pods?labelSelector=ray.io/cluster=uerl,ray.io/node-type=head"
    )
    assert authorization == "Bearer t"


def _json_server(
    answer: Callable[[str], Any], asked: list[tuple[str, str | None]] | None = None
) -> http.server.ThreadingHTTPServer:
    """A loopback HTTP server answering every GET with `answer(path)` as JSON; `asked`
    collects each request's path and Authorization header."""

    class JsonAPI(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if asked is not None:
                asked.append((self.path, self.headers.get("Authorization")))
            body = json.dumps(answer(self.path)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), JsonAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _dashboard() -> http.server.ThreadingHTTPServer:
    """A stand-in for the head's job API: its version, and a job's log."""
    log = {"logs": "iter 1\n" * 5000}
    return _json_server(lambda path: {"ray_version": "2.60.0"} if path == "/api/version" else log)


def _through_the_api(api: FakeKubeAPI, tmp_path: Path) -> tuple[HeadConnection, Relay]:
    """What `uerl submit` builds: the official client, the head finder, the relay."""
    client = head.kube_api_client(_kubeconfig(tmp_path / "kubeconfig", api.url), None)
    finder = HeadFinder(ENDPOINTS, head.kube_pod_lister(client))
    connection = HeadConnection(finder.find, port_forward.pod_port_opener(client, "uerl", 8265))
    return connection, Relay(connection)


def test_a_port_forward_being_opened_takes_no_other_call_of_its_client_with_it(
    tmp_path: Path,
) -> None:
    """kubernetes.stream swaps its ApiClient's `request` for the websocket's while one
    opens: the head's lookup (or another stream: the log's, the status polls) made on
    the same client at that moment went to the port-forward call ("Missing required
    parameter `ports`", seen on real pods)."""
    dashboard = _dashboard()
    api = FakeKubeAPI([_pod("uerl-head-a")], {"uerl-head-a": dashboard.server_address[1]})
    meanwhile: list[Any] = []
    try:
        with serving(api):
            client = head.kube_api_client(_kubeconfig(tmp_path / "kubeconfig", api.url), None)
            lister = head.kube_pod_lister(client)

            def look_up_the_head() -> None:
                try:
                    meanwhile.append([p["metadata"]["name"] for p in lister("uerl", "x=y")])
                except SubmitError as exc:
                    meanwhile.append(str(exc))

            api.on_portforward = look_up_the_head
            port_forward.pod_port_opener(client, "uerl", 8265)("uerl-head-a").close()
    finally:
        dashboard.shutdown()
        dashboard.server_close()
    assert meanwhile == [["uerl-head-a"]]


def test_the_apis_port_forward_reaches_the_heads_port_and_follows_a_new_head(
    tmp_path: Path,
) -> None:
    old, new = _dashboard(), _dashboard()
    api = FakeKubeAPI([_pod("uerl-head-a")], {"uerl-head-a": old.server_address[1],
                                              "uerl-head-b": new.server_address[1]})  # fmt: skip
    try:
        with serving(api), job.no_proxy_to_the_relay():
            connection, relay = _through_the_api(api, tmp_path)
            with relay:
                client = job.connect_client(relay.url, head=lambda: "?", wait_s=0)
                assert client.get_job_logs("s-1") == "iter 1\n" * 5000  # 35 kB, both ways
                assert connection.head == "uerl-head-a"
                api.pods = [_pod("uerl-head-b")]  # KubeRay replaced the head pod
                assert client.get_job_logs("s-1") == "iter 1\n" * 5000
                assert connection.head == "uerl-head-b"
    finally:
        for server in (old, new):
            server.shutdown()
            server.server_close()
    forwarded = [path.split("?")[0] for path in api.asked if "portforward" in path]
    assert forwarded[0] == "/api/v1/namespaces/uerl/pods/uerl-head-a/portforward"
    assert forwarded[-1] == "/api/v1/namespaces/uerl/pods/uerl-head-b/portforward"


def test_the_kubelets_port_forward_error_names_the_pod_and_port(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on: the "pod" serves nothing
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    api = FakeKubeAPI([_pod("uerl-head-a")], {"uerl-head-a": closed})
    with serving(api):
        _, relay = _through_the_api(api, tmp_path)
        with relay, socket.create_connection(("127.0.0.1", relay.port), timeout=10) as conn:
            conn.sendall(b"GET /api/version HTTP/1.1\r\nHost: x\r\n\r\n")
            assert conn.recv(65536) == b""
            deadline = time.monotonic() + guard(30)
            while relay.last_error is None and time.monotonic() < deadline:
                time.sleep(0.05)
    assert (relay.last_error or "").startswith(
        "port-forward to pod uerl-head-a port 8265: error forwarding port 8265: "
    )


# ---- the job: its log, its end, Ctrl-C ---------------------------------------------


@dataclass
class FakeJobs:
    """A job client: each poll answers the next status and log (the last ones repeat);
    an Exception in `statuses` is raised instead (the port-forward failing)."""

    statuses: list[Any]
    logs: list[str]
    message: str = ""
    stop_turns_to: str | None = None  # the status every poll answers once stopped
    on_poll: Callable[[int], None] = lambda _poll: None
    polls: int = 0
    stops: list[str] = field(default_factory=list)
    submitted: list[tuple[str, str | None]] = field(default_factory=list)

    def submit_job(self, *, entrypoint: str, submission_id: str | None = None) -> str:
        self.submitted.append((entrypoint, submission_id))
        return submission_id or "raysubmit_1"

    def get_job_status(self, job_id: str) -> Any:
        self.on_poll(self.polls)
        answer = self.statuses[min(self.polls, len(self.statuses) - 1)]
        self.polls += 1
        if isinstance(answer, Exception):
            raise answer
        return self.stop_turns_to if self.stops and self.stop_turns_to else answer

    def get_job_logs(self, job_id: str) -> str:
        return self.logs[min(self.polls - 1, len(self.logs) - 1)]

    def get_job_info(self, job_id: str) -> Any:
        return SimpleNamespace(message=self.message)

    def stop_job(self, job_id: str) -> bool:
        self.stops.append(job_id)
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _follow(jobs: FakeJobs, ctrl_c: CtrlC | None = None, **kwargs: Any) -> tuple[int, str, str]:
    out, err, clock = StringIO(), StringIO(), Clock()
    follower = Follower(
        jobs, "job-1", head=lambda: "pod uerl-head-a", follow_hint="HINT", out=out, err=err,
        clock=clock, sleep=clock.sleep, **kwargs,
    )  # fmt: skip
    code = follower.run(ctrl_c or CtrlC())
    return code, out.getvalue(), err.getvalue()


def test_the_log_is_printed_as_it_grows_each_line_once() -> None:
    jobs = FakeJobs(
        ["PENDING", "RUNNING", "RUNNING", "SUCCEEDED"],
        ["", "iter 1\n", "iter 1\niter 2\n", "iter 1\niter 2\ndone\n"],
    )
    code, out, _ = _follow(jobs)
    assert code == 0 and out == "iter 1\niter 2\ndone\n"


@pytest.mark.parametrize(("status", "code"), [("SUCCEEDED", 0), ("FAILED", 1), ("STOPPED", 130)])
def test_the_jobs_end_is_the_exit_status(status: str, code: int) -> None:
    assert _follow(FakeJobs(["RUNNING", status], ["a\n"]))[0] == code


def test_a_failed_job_says_the_first_line_of_rays_message_without_its_log_note() -> None:
    # The log the note announces is printed above it already, as `uerl supervise` says too.
    jobs = FakeJobs(["FAILED"], ["boom\n"], message="Job entrypoint command failed with "
                    "exit code 2, last available logs:\nboom\n")  # fmt: skip
    code, _, err = _follow(jobs)
    assert code == 1
    assert err == "uerl submit: job job-1 FAILED: Job entrypoint command failed with exit code 2\n"


def test_ctrl_c_stops_the_job_streams_to_its_end_and_exits_130() -> None:
    ctrl_c = CtrlC()
    jobs = FakeJobs(
        ["RUNNING"],
        ["iter 1\n", "iter 1\niter 2\n", "iter 1\niter 2\ncheckpoint: /home/ray/run\n"],
        stop_turns_to=None,
    )

    def on_poll(poll: int) -> None:
        if poll == 1:
            ctrl_c.press()  # after the first iteration's line
        if poll == 3:
            jobs.statuses = ["STOPPED"]  # Ray's SIGTERM ended it, after its checkpoint

    jobs.on_poll = on_poll
    code, out, err = _follow(jobs, ctrl_c)
    assert code == 130
    assert jobs.stops == ["job-1"]
    assert out.endswith("checkpoint: /home/ray/run\n")
    assert "stopping job job-1: it finishes its iteration and writes a final checkpoint" in err
    assert err.rstrip().endswith("job job-1 STOPPED")


def test_a_second_ctrl_c_leaves_at_once_saying_the_job_may_still_run() -> None:
    ctrl_c = CtrlC()

    def on_poll(poll: int) -> None:
        if poll in (1, 2):
            ctrl_c.press()

    code, _, err = _follow(FakeJobs(["RUNNING"], ["iter 1\n"], on_poll=on_poll), ctrl_c)
    assert code == 130
    assert "left without waiting: job job-1 may still be running. HINT" in err


def test_a_job_that_does_not_stop_in_time_is_left_with_130() -> None:
    ctrl_c = CtrlC()
    ctrl_c.press()
    jobs = FakeJobs(["RUNNING"], ["iter 1\n"])
    code, _, err = _follow(jobs, ctrl_c, stop_wait_s=30)
    assert code == 130 and jobs.stops == ["job-1"]
    assert "job job-1 is still RUNNING 30 s after it was asked to stop. HINT" in err


def test_poll_errors_are_retried_until_an_answer_comes() -> None:
    gone = ConnectionError("Connection aborted")
    jobs = FakeJobs(["RUNNING", gone, gone, gone, "SUCCEEDED"], ["iter 1\n"])
    assert _follow(jobs, no_answer_s=10)[0] == 0


def test_no_answer_for_the_limit_gives_up_with_1_naming_the_head() -> None:
    jobs = FakeJobs(["RUNNING", ConnectionError("Connection refused")], ["iter 1\n"])
    code, _, err = _follow(jobs, no_answer_s=120)
    assert code == 1
    assert err == (
        "uerl submit: no answer about job job-1 from the Ray head (pod uerl-head-a) for 120 s: "
        "Connection refused. HINT\n"
    )


def test_sigint_while_following_is_a_press_not_a_keyboard_interrupt() -> None:
    before = signal.getsignal(signal.SIGINT)
    with CtrlC() as ctrl_c:
        os.kill(os.getpid(), signal.SIGINT)
        assert ctrl_c.presses == 1
    assert signal.getsignal(signal.SIGINT) is before


def test_a_dashboard_traceback_is_said_by_its_last_line() -> None:
    refused = RuntimeError(
        "Request failed with status code 400: Traceback (most recent call last):\n"
        '  File "job_head.py", line 419, in submit_job\n'
        "ValueError: Job with submission_id s-1 already exists. Please use a different "
        "submission_id..\n"
    )
    assert job.reason(refused) == (
        "status 400: ValueError: Job with submission_id s-1 already exists. Please use a "
        "different submission_id."
    )


def test_a_taken_submission_id_is_bad_input_naming_the_flag() -> None:
    class Taken(FakeJobs):
        def submit_job(self, *, entrypoint: str, submission_id: str | None = None) -> str:
            raise RuntimeError("Request failed with status code 400: Traceback (most recent "
                               "call last):\nValueError: Job with submission_id s-1 already "
                               "exists.\n")  # fmt: skip

    with pytest.raises(SubmitError) as info:
        job.submit(Taken([], []), ["train"], "s-1")
    assert info.value.exit_code == 2
    assert str(info.value) == (
        "--submission-id s-1: the cluster has a job with that id already; choose another"
    )


def test_rays_job_client_goes_through_the_relay_whatever_ray_address_or_a_proxy_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real JobSubmissionClient, against a stand-in for the head's job API."""
    asked: list[tuple[str, str | None]] = []
    log = {"logs": "iter 1\n"}
    server = _json_server(
        lambda path: {"ray_version": "2.60.0"} if path == "/api/version" else log, asked
    )
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:1")  # left over from a `ray job`
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:1")  # a proxy for the web, not us
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    try:
        with (
            Relay(lambda: socket.create_connection(server.server_address[:2])) as relay,
            job.no_proxy_to_the_relay(),
        ):
            client = job.connect_client(relay.url, head=lambda: "pod uerl-head-a", wait_s=0)
            assert client.get_job_logs("s-1") == "iter 1\n"
    finally:
        server.shutdown()
        server.server_close()
    paths = [path for path, _ in asked]
    assert paths[-1] == "/api/jobs/s-1/logs" and "/api/version" in paths
    assert os.environ["RAY_ADDRESS"] == "http://127.0.0.1:1" and "no_proxy" not in os.environ


def test_rays_job_client_sends_the_token_on_every_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[str, str | None]] = []
    server = _json_server(
        lambda path: {"ray_version": "2.60.0"} if path == "/api/version" else {"logs": ""}, asked
    )
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)  # the laptop's Ray asks for none
    try:
        with (
            Relay(lambda: socket.create_connection(server.server_address[:2])) as relay,
            job.no_proxy_to_the_relay(),
        ):
            client = job.connect_client(relay.url, head=lambda: "?", token="t0ken", wait_s=0)
            client.get_job_logs("s-1")
    finally:
        server.shutdown()
        server.server_close()
    assert [header for _, header in asked] == ["Bearer t0ken"] * len(asked) and len(asked) >= 2


# ---- the Ray API's token, from the stack's Secret ------------------------------------

TOKEN_SECRET = {"auth_token": "dDBrZW4="}  # base64 of "t0ken"


def _read_token(tmp_path: Path, api: FakeKubeAPI, endpoints: Any = ENDPOINTS) -> str | None:
    with serving(api):
        client = head.kube_api_client(_kubeconfig(tmp_path / "kubeconfig", api.url), None)
        return ray_token.read(client, endpoints)


def test_the_token_is_read_from_the_secret_the_endpoints_name(tmp_path: Path) -> None:
    api = FakeKubeAPI([], {}, secrets={"uerl": TOKEN_SECRET})
    assert ENDPOINTS.ray.token_secret == "uerl"  # KubeRay's Secret, named as the cluster
    assert _read_token(tmp_path, api) == "t0ken"
    assert api.asked == ["/api/v1/namespaces/uerl/secrets/uerl"]


def test_endpoints_that_name_no_token_secret_read_nothing(tmp_path: Path) -> None:
    api = FakeKubeAPI([], {})
    open_api = Topology.parse({"ray": {"auth": {"mode": "disabled"}}}).endpoints()
    assert _read_token(tmp_path, api, open_api) is None
    assert api.asked == []


def test_a_missing_token_secret_is_bad_input_naming_it(tmp_path: Path) -> None:
    with pytest.raises(SubmitError) as info:
        _read_token(tmp_path, FakeKubeAPI([], {}))
    assert info.value.exit_code == 2
    assert str(info.value).startswith(
        "the Ray API's token: no Secret uerl in namespace uerl (endpoints ray.token_secret)."
    )


def test_a_kubeconfig_that_may_not_read_the_secret_is_told_what_it_needs(
    tmp_path: Path,
) -> None:
    with pytest.raises(SubmitError) as info:
        _read_token(tmp_path, FakeKubeAPI([], {}, secrets_status=403))
    assert info.value.exit_code == 2
    assert "may not read the Secret uerl in namespace uerl" in str(info.value)
    assert "`get` on secrets there is needed" in str(info.value)
    assert 'answered 403 Forbidden: secrets "uerl" is forbidden' in str(info.value)


def test_a_secret_without_the_token_key_is_bad_input_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(SubmitError) as info:
        _read_token(tmp_path, FakeKubeAPI([], {}, secrets={"uerl": {"token": "dDBrZW4="}}))
    assert info.value.exit_code == 2
    assert str(info.value).endswith("has no 'auth_token' key holding it")


def test_no_token_where_the_job_api_asks_for_one_names_the_endpoints_field() -> None:
    refusal = RuntimeError("Authentication required: Unauthorized: Missing authentication token")
    said = job.refused(refusal, None, "")
    assert said.startswith("the Ray head's job API asks for a token and the endpoints name none")
    assert "(ray.token_secret)" in said


def test_the_entrypoint_is_the_uerl_command_shell_quoted() -> None:
    assert job.entrypoint(["train", "--run-dir", "/runs/a b", "--iterations", "2"]) == (
        "uerl train --run-dir '/runs/a b' --iterations 2"
    )


# ---- the command, with the cluster faked ---------------------------------------------


@pytest.fixture
def fake_cluster(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The command's cluster side replaced: a pod list, a job client; no API, no Ray."""
    state: dict[str, Any] = {
        "pods": [_pod("uerl-head-a")],
        "jobs": FakeJobs(["RUNNING", "SUCCEEDED"], ["iter 1\n", "iter 1\niter 2\n"]),
    }
    monkeypatch.setattr(head, "kube_api_client", lambda kubeconfig, context: object())
    monkeypatch.setattr(head, "kube_pod_lister", lambda api: lambda ns, sel: state["pods"])
    monkeypatch.setattr(port_forward, "pod_port_opener", lambda api, ns, port: None)
    state["token"] = "t0ken"
    state["sent_token"] = []

    def connect_client(url: str, head: Callable[[], str], **auth: Any) -> Any:
        state["sent_token"].append(auth.get("token"))
        return state["jobs"]

    monkeypatch.setattr(ray_token, "read", lambda api, endpoints: state["token"])
    monkeypatch.setattr(job, "connect_client", connect_client)
    return state


def test_submit_runs_the_command_as_a_job_and_streams_it_to_its_end(
    fake_cluster: dict[str, Any], endpoints_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = submit(["--endpoints", str(endpoints_file), "--submission-id", "s-1", "--",
                   "train", "--iterations", "2"])  # fmt: skip
    assert code == 0
    assert fake_cluster["jobs"].submitted == [("uerl train --iterations 2", "s-1")]
    captured = capsys.readouterr()
    assert captured.out == "iter 1\niter 2\n"
    assert "job s-1 submitted to the Ray head pod uerl-head-a (namespace uerl)" in captured.err


def test_submit_sends_the_token_from_the_stacks_secret(
    fake_cluster: dict[str, Any], endpoints_file: Path
) -> None:
    assert submit(["--endpoints", str(endpoints_file), "--", "train"]) == 0
    assert fake_cluster["sent_token"] == ["t0ken"]


def test_no_wait_prints_the_submission_id_and_how_to_follow_it(
    fake_cluster: dict[str, Any], endpoints_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = submit(["--endpoints", str(endpoints_file), "--no-wait", "--", "eval",
                   "--checkpoint", "/home/ray/runs/a/checkpoints"])  # fmt: skip
    assert code == 0 and fake_cluster["jobs"].polls == 0
    captured = capsys.readouterr()
    assert captured.out == "raysubmit_1\n"
    assert "kubectl -n uerl port-forward pod/uerl-head-a 8265:8265" in captured.err
    assert "ray job logs --address http://127.0.0.1:8265 --follow raysubmit_1" in captured.err
    assert (
        "with `export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(kubectl -n uerl get secret uerl "
        "-o jsonpath='{.data.auth_token}' | base64 -d)` first" in captured.err
    )


def test_a_head_not_ready_exits_1_before_anything_is_submitted(
    fake_cluster: dict[str, Any], endpoints_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_cluster["pods"] = [_pod("uerl-head-a", phase="Pending", ready=False)]
    err = one_line_error(capsys, "--endpoints", str(endpoints_file), "--", "train", code=1)
    assert err.startswith("uerl submit: the Ray head pod uerl-head-a (")
    assert "is not ready: phase Pending" in err
    assert fake_cluster["jobs"].submitted == []


def test_a_job_a_new_head_does_not_have_is_said_at_once_with_what_to_do() -> None:
    # Ray's job client on a head that has no such job (the head pod was replaced).
    gone = RuntimeError("Request failed with status code 404: Job job-1 does not exist..")
    jobs = FakeJobs(["RUNNING", gone], ["iter 1\n"])
    code, _, err = _follow(jobs, no_answer_s=120)
    assert code == 1
    assert err == (
        "uerl submit: job job-1 is gone: the Ray head (pod uerl-head-a) was replaced, and a "
        "new head has none of the old one's jobs. Submit the training again with `--resume "
        "auto` and the same --run-name to go on from its last stored checkpoint, or with "
        "--supervise to have that done whenever the head is lost\n"
    )


def test_the_log_is_fetched_once_not_again_at_every_poll() -> None:
    """Ray's real job client, against a head serving a long run's log (20 kB so far)
    that grows a line at a time: each part of it crosses the network once, then the
    whole log once more at the end (it is whole once the job has ended)."""
    from ray.job_submission import JobSubmissionClient

    preamble = "earlier output\n" * 1500
    with FakeDashboard("job-1", preamble=preamble, lines=20, line_every_s=0.05) as head:
        out, err = StringIO(), StringIO()
        follower = Follower(
            JobSubmissionClient(head.url), "job-1", head=lambda: "pod uerl-head-a",
            follow_hint="HINT", out=out, err=err, poll_s=0.02,
        )  # fmt: skip
        assert follower.run(CtrlC()) == 0, err.getvalue()
        whole, _ = head.log()
    assert out.getvalue() == whole
    # Each part streamed at most once, and the whole log fetched at most once, at the end
    # (what the stream had not passed when the job ended, on a busy host, comes with it).
    # Fetching the whole log at every poll would have served it about 50 times.
    assert head.served["tail"] <= len(whole)
    assert head.served["logs"] <= len(whole)


def test_a_log_stream_cut_short_is_opened_again_passing_each_part_once() -> None:
    class CutOnce:
        opened = 0

        async def tail_job_logs(self, job_id: str) -> AsyncIterator[str]:
            self.opened += 1
            yield "line 1\n"
            if self.opened == 1:
                raise RuntimeError("WebSocket connection closed unexpectedly")  # the relay
            yield "line 2\n"  # Ray sends the log from its start again

        def get_job_logs(self, job_id: str) -> str:
            return "line 1\nline 2\nline 3\n"

    client, passed = CutOnce(), []
    tail = LogTail(lambda: client, "job-1", passed.append, retry_s=0.01)
    deadline = time.monotonic() + guard(30)
    while client.opened < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    tail.finish()
    assert "".join(passed) == "line 1\nline 2\nline 3\n"
