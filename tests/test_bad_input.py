"""Bad input as a new user gives it: one line naming the field, file or endpoint, a
non-zero exit, and nothing started where the arguments already show the mistake.

Commands run in-process (`training.cli.main`), so each test costs no interpreter start."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from host_speed import guard
from local_runs import PROJECT_ROOT

from training.cli import main as uerl


class Started(AssertionError):
    """A command went past its checks: it would have started games, Ray or training."""


@pytest.fixture(autouse=True)
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def started(*args: object, **kwargs: object) -> int:
        raise Started("the command went on to start its work")

    monkeypatch.setattr("training.commands.local._run", started)
    monkeypatch.setattr("training.run.outcome.train_and_report", started)
    monkeypatch.setattr("training.run.eval_outcome.eval_and_report", started)


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 2) -> str:
    """Run `uerl *argv`; assert it exits `code` with one line on stderr; return the line."""
    assert uerl(list(argv)) == code
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


# -- hyperparameters out of range ------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--lr", "-1"), "--lr: lr=-1.0: input should be greater than 0"),
        (("--lr", "nan"), "--lr: lr=nan: input should be a finite number"),
        (("--gamma", "7"), "--gamma: gamma=7.0: input should be less than or equal to 1"),
        (("--entropy-coeff", "-0.1"), "--entropy-coeff: entropy_coeff=-0.1: input should be"),
        (("--hp", "lambda_=2"), "--hp: lambda_=2: input should be less than or equal to 1"),
        (("--hp", "num_epochs=2.5"), "--hp: num_epochs=2.5: input should be a valid integer"),
    ],
)
def test_a_hyperparameter_out_of_range_is_refused_naming_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], named: str
) -> None:
    err = one_line_error(capsys, "local", *args, "--run-dir", str(tmp_path / "run"))
    assert err.startswith("uerl local: ") and named in err
    assert not (tmp_path / "run").exists()


def test_a_hyperparameter_file_out_of_range_is_refused_naming_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hparams = tmp_path / "hp.yaml"
    hparams.write_text("lr: 0.001\ntrain_batch_size: -5\n")
    err = one_line_error(capsys, "local", "--hparams", str(hparams), "--run-dir", str(tmp_path))
    assert f"{hparams}: train_batch_size=-5: input should be greater than or equal to 1" in err


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("lamda=0.9", "lambda_"), ("clip_parm=0.1", "clip_param"), ("lambda=0.9", "lambda_")],
)
def test_a_misspelt_hyperparameter_is_told_the_option_it_meant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], typed: str, meant: str
) -> None:
    # Before: only an option the typed key is part of was offered (lambda, not lamda).
    err = one_line_error(capsys, "local", "--hp", typed, "--run-dir", str(tmp_path / "run"))
    assert err.endswith(f"is not a PPO training option (did you mean {meant}?)")


# -- topology and stack files ----------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Pulumi project directory (cwd) with a dev stack asking for 3 workers."""
    (tmp_path / "Pulumi.yaml").write_text("name: uerl\nruntime: python\n")
    (tmp_path / "Pulumi.dev.yaml").write_text("config:\n  uerl:topology:\n    workers:\n"
                                              "      replicas: 3\n")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_misspelt_topology_key_in_a_stack_file_is_refused_naming_it(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "Pulumi.typo.yaml").write_text("config:\n  uerl:topolgy:\n    workers: {}\n")
    for command in ("render", "local"):
        err = one_line_error(capsys, command, "--stack", "typo")
        assert "Pulumi.typo.yaml: config key 'uerl:topolgy' is not one uerl reads" in err
        assert "did you mean uerl:topology?" in err


def test_other_namespaces_of_a_stack_file_are_left_alone(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "Pulumi.k.yaml").write_text("config:\n  kubernetes:context: kind\n")
    assert uerl(["render", "--stack", "k"]) == 0


def test_a_stack_file_given_as_a_topology_is_explained(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in ("render", "local"):
        err = one_line_error(capsys, command, "--topology", "Pulumi.dev.yaml")
        assert "Pulumi.dev.yaml is a Pulumi stack file (it has `config:`), not a topology" in err
        assert "pass --stack dev" in err


def test_a_topology_file_that_is_not_utf8_is_one_line_naming_it(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "t.yaml").write_bytes(b"workers:\n  replicas: \xff\xfe\n")
    for command in ("render", "local"):
        err = one_line_error(capsys, command, "--topology", "t.yaml")
        assert "t.yaml is not UTF-8 text (byte 0xff at offset 21)" in err


def test_a_hyperparameter_file_that_is_not_utf8_is_one_line_naming_it(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "hp.yaml").write_bytes(b"lr: \xff\n")
    err = one_line_error(capsys, "local", "--hparams", "hp.yaml", "--run-dir", "run")
    assert "hyperparameter file hp.yaml is not UTF-8 text" in err


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("workers.replicas=true", "topology.workers.replicas: expected a number, got true"),
        ("learners.memory=0", "topology.learners.memory: '0' is zero"),
        ("workers.cpus=1e9", "topology.workers.cpus: Input should be less than or equal to 1024"),
    ],
)
def test_a_topology_value_out_of_range_is_refused_naming_its_path(
    project: Path, capsys: pytest.CaptureFixture[str], value: str, named: str
) -> None:
    for command in ("render", "local"):
        assert uerl([command, "--set", f"topology.{value}"]) == 2
        err = capsys.readouterr().err
        assert named in err and "Traceback" not in err


def test_render_without_a_stack_reads_the_dev_stack_as_local_does_and_says_so(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert uerl(["render"]) == 0
    out = capsys.readouterr().out
    assert f"# Topology from: {project / 'Pulumi.dev.yaml'} (the default stack" in out
    assert "replicas: 3" in out


def test_render_outside_a_project_renders_the_defaults_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert uerl(["render"]) == 0
    assert "# Topology from: the defaults (no Pulumi.yaml here" in capsys.readouterr().out


def _checkpoint(tmp_path: Path) -> Path:
    """A checkpoint directory as far as `--checkpoint` checks it (no modules)."""
    path = tmp_path / "checkpoints" / "checkpoint_000001"
    path.mkdir(parents=True)
    (path / "uerl.json").write_text('{"iteration": 1, "env_steps_total": 10, "algo": "PPO"}')
    (path.parent / "latest").write_text(path.name)
    return path.parent


# -- where a command writes: checked before anything starts ----------------------------


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("")
    return path


@pytest.mark.parametrize("flag", ["--run-dir", "--checkpoint-dir"])
def test_a_run_directory_that_cannot_be_made_is_one_line_naming_the_flag(
    a_file: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    # Before: --checkpoint-dir failed at the first save, after training; --run-dir with a
    # traceback. (`uerl train` reads its endpoints first: `uerl local` shows the same check.)
    err = one_line_error(capsys, "local", flag, str(a_file / "run"))
    assert err == f"uerl local: {flag} {a_file / 'run'}: {a_file} is not a directory"


def test_tls_secret_out_that_cannot_be_written_is_one_line(
    a_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = one_line_error(capsys, "tls-secret", "--out", str(a_file / "tls"))
    assert err == f"uerl tls-secret: --out {a_file / 'tls'}: {a_file} is not a directory"


def test_eval_output_that_cannot_be_written_is_one_line(
    tmp_path: Path, a_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = _checkpoint(tmp_path)
    err = one_line_error(
        capsys, "eval", "--checkpoint", str(checkpoint), "--output", str(a_file / "r.json")
    )
    assert err == f"uerl eval: --output {a_file / 'r.json'}: {a_file} is not a directory"
    err = one_line_error(capsys, "eval", "--checkpoint", str(checkpoint), "--output", str(tmp_path))
    assert err == f"uerl eval: --output {tmp_path}: is a directory (give a file name)"


def test_a_directory_without_write_permission_is_refused_naming_it(tmp_path: Path) -> None:
    # Root writes anywhere: where the tests are root, the check runs without the
    # capabilities that override file permissions (still root: it reads the project and
    # its virtualenv wherever the clone is, a 0700 directory too).
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    code = (
        "import sys; from pathlib import Path; from training.commands.writable import "
        "check_writable_dir as check\n"
        "try: check(Path(sys.argv[1]), '--run-dir')\n"
        "except ValueError as exc: print(exc); sys.exit(2)\n"
    )
    argv = [sys.executable, "-c", code, str(locked / "run")]
    if os.geteuid() == 0:
        argv = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", *argv]
    result = subprocess.run(
        argv, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=guard(180)
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout.strip() == (
        f"--run-dir {locked / 'run'}: cannot write in {locked} (Permission denied)"
    )
    assert list(locked.iterdir()) == []


def test_the_write_check_leaves_nothing_behind(tmp_path: Path) -> None:
    from training.commands.writable import check_writable_dir

    check_writable_dir(tmp_path / "a" / "b", "--run-dir")
    check_writable_dir(tmp_path, "--run-dir")
    assert list(tmp_path.iterdir()) == []


# -- damaged checkpoints ---------------------------------------------------------------


@pytest.fixture
def trained(tmp_path: Path) -> Path:
    """A single-agent checkpoint (modules, uerl.json, game.json) in tmp/checkpoints."""
    from test_env_runner_path import single_agent_checkpoint

    return single_agent_checkpoint(tmp_path)


def _truncate(checkpoint: Path) -> Path:
    (state,) = (checkpoint / "learner_group").rglob("default_policy/module_state.pkl")
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    return state


def _files(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*"))


@pytest.mark.parametrize("command", ["export", "eval"])
def test_a_truncated_module_state_is_one_line_naming_the_file(
    trained: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # Before: RLlib's unpickling traceback naming no file; eval wrote its traceback into
    # the checkpoint folder.
    state = _truncate(trained)
    before = _files(trained.parent)
    err = one_line_error(capsys, command, "--checkpoint", str(trained))
    assert err.startswith(f"uerl {command}: --checkpoint: {state} cannot be loaded (")
    assert "the checkpoint is damaged" in err
    assert _files(trained.parent) == before


def test_resuming_a_truncated_checkpoint_is_one_line_naming_the_file(
    trained: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _truncate(trained)
    run = trained.parent.parent
    err = one_line_error(capsys, "local", "--run-dir", str(run), "--resume")
    assert err.startswith(f"uerl local: --resume: {state} cannot be loaded (")


@pytest.mark.parametrize("command", ["export", "eval"])
def test_a_damaged_uerl_json_names_the_file_and_the_fields_missing(
    trained: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # Before: "<checkpoint> is not a uerl checkpoint (uerl.json: CheckpointMeta.__init__()
    # missing 2 required positional arguments: ...)": the directory and a class's name.
    meta = trained / "uerl.json"
    meta.write_text('{"iteration": 1, "env_runner": "single"}')
    err = one_line_error(capsys, command, "--checkpoint", str(trained))
    assert err == (
        f"uerl {command}: {meta}: missing env_steps_total, algo; env_runner is 'single', not "
        "single_agent or multi_agent: the checkpoint is damaged; use another one (an earlier "
        "checkpoint_* beside it)"
    )


@pytest.mark.parametrize("command", ["export", "eval"])
def test_a_single_agent_checkpoint_without_its_game_says_game_json_is_missing(
    trained: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    (trained / "game.json").unlink()
    err = one_line_error(capsys, command, "--checkpoint", str(trained))
    assert err == (
        f"uerl {command}: {trained} was trained on the single-agent path but has no "
        "game.json: it cannot say which of the game's policies its module is"
    )


# -- `uerl discover` -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "named"),
    [
        ("127.0.0.1", "endpoint '127.0.0.1' is not HOST:PORT"),
        ("127.0.0.1:99999", "endpoint '127.0.0.1:99999': port 99999 is not from 1 to 65535"),
        (":50051", "endpoint ':50051' is not HOST:PORT"),
    ],
)
def test_discover_of_a_malformed_endpoint_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], endpoint: str, named: str
) -> None:
    # Before: a traceback from the compiled client ("bad address").
    assert one_line_error(capsys, "discover", endpoint) == f"uerl discover: {named}"


def test_discover_of_a_name_that_does_not_resolve_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = one_line_error(capsys, "discover", "no-such-game.invalid:50051", "--timeout", "0.5",
                         code=1)  # fmt: skip
    assert "did not answer StartGymConnector within 0.5 s (the name 'no-such-game.invalid' " in err
    assert "does not resolve" in err


def test_discover_of_an_http_server_says_what_answers(
    web_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The discovery's wait, after which what answers is named: 0.5 s was too short for
    # gRPC's connection attempt itself on a cold CI's loaded host.
    err = one_line_error(capsys, "discover", web_server, "--timeout", "3", code=1)
    assert err.endswith("(an HTTP/1 server answers there (a web server?), not a gRPC game)")


def test_discover_of_a_closed_port_says_nothing_listens(
    closed_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    err = one_line_error(capsys, "discover", f"127.0.0.1:{closed_port}", "--timeout", "0.5",
                         code=1)  # fmt: skip
    assert err.endswith("(nothing listens there (connection refused))")


# -- contradictions the arguments show, found before Ray or a game starts --------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--policies", "ctde", "--algo", "APPO"), "--policies ctde trains with PPO"),
        (("--policies", "ctde", "--learners", "2"), "set topology.learners.replicas to 0 or 1"),
    ],
)
def test_ctde_with_another_algorithm_or_two_learners_is_refused_before_ray_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], named: str
) -> None:
    # Before: found 13-19 s in, after Ray and the games started.
    err = one_line_error(capsys, "local", *args, "--run-dir", str(tmp_path / "run"))
    assert named in err


def test_ctde_on_a_deployed_topology_with_two_learners_is_refused_before_ray_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra.topology import Topology

    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(Topology.parse({"learners": {"replicas": 2}}).endpoints().to_json())
    err = one_line_error(capsys, "train", "--endpoints", str(endpoints), "--policies", "ctde",
                         "--run-dir", str(tmp_path / "run"))  # fmt: skip
    assert "the topology has 2 learners" in err


def test_resuming_an_empty_directory_is_refused_before_ray_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    err = one_line_error(capsys, "local", "--resume", str(empty), "--run-dir", str(tmp_path))
    assert err.startswith(f"uerl local: {empty} is not a uerl checkpoint (uerl.json: ")


def test_resume_without_a_checkpoint_fails_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--resume` alone is `--resume latest`: the newest checkpoint of a run that has none.
    err = one_line_error(capsys, "local", "--run-dir", str(tmp_path), "--resume")
    checkpoints = tmp_path / "checkpoints"
    assert err.startswith(f"uerl local: --resume: no checkpoint in {checkpoints} (no latest file)")


@pytest.mark.parametrize(
    ("flag", "value", "field"),
    [("--workers", "1", "workers.replicas=3"), ("--pattern", "sidecar", "pattern=networked")],
)
def test_a_flag_and_a_set_that_disagree_are_refused_as_a_conflict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, field: str
) -> None:
    # Before: --workers 1 silently beat --set topology.workers.replicas=3.
    err = one_line_error(capsys, "local", flag, value, "--set", f"topology.{field}",
                         "--run-dir", str(tmp_path))  # fmt: skip
    path = field.partition("=")[0]
    assert err == (
        f"uerl local: {flag} {value} and --set topology.{field} both set topology.{path}: "
        "give one of them"
    )


def test_a_flag_and_a_set_that_agree_are_one_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(Started):
        uerl(["local", "--workers", "3", "--set", "topology.workers.replicas=3",
              "--run-dir", str(tmp_path)])  # fmt: skip


@pytest.mark.parametrize("transport", ["grpcio", "native"])
def test_mock_ue_on_a_port_in_use_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], transport: str
) -> None:
    if transport == "native":
        pytest.importorskip("uerl_native")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        err = one_line_error(capsys, "mock-ue", "--port", str(port), "--transport", transport,
                             code=1)  # fmt: skip
    assert err == f"mock-ue: cannot bind 127.0.0.1:{port}: Address already in use"


def test_bench_runner_on_a_game_of_two_agents_is_one_line_and_leaves_no_temp_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    err = one_line_error(capsys, "bench-runner", "--env", "uerl/Sumo-v0")
    assert err.startswith("uerl bench-runner: --env uerl/Sumo-v0: a game of 2 agents")
    assert list(tmp_path.iterdir()) == []


def test_bare_uerl_prints_its_usage_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert uerl([]) == 2
    assert capsys.readouterr().err.startswith("usage: uerl <command> [options]")
