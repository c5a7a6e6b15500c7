"""`uerl train` and `uerl local` inputs: clear messages and exit codes, no hang, no traceback."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from host_speed import guard
from local_runs import PROJECT_ROOT

from infra.endpoints import EndpointsError
from infra.topology import Topology
from training.local import processes
from training.run.endpoints_source import load_endpoints


def uerl(*args: str, timeout_s: float = guard(300)) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "training.cli", *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_train_without_endpoints_says_how_to_provide_them(tmp_path: Path) -> None:
    with pytest.raises(EndpointsError, match="pass --endpoints FILE") as info:
        load_endpoints(None, head_path=tmp_path / "absent.json")
    assert "pulumi stack output endpoints --json" in str(info.value)


def test_train_reads_the_head_configmap_when_no_file_is_given(tmp_path: Path) -> None:
    mounted = tmp_path / "endpoints.json"
    mounted.write_text(Topology().endpoints().to_json())
    assert load_endpoints(None, head_path=mounted) == Topology().endpoints()


def test_train_accepts_a_whole_pulumi_stack_output(tmp_path: Path) -> None:
    whole = tmp_path / "stack.json"
    whole.write_text('{"endpoints": ' + Topology().endpoints().to_json() + ', "other": 1}')
    assert load_endpoints(whole) == Topology().endpoints()


def test_train_with_an_invalid_endpoints_file_exits_2_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "endpoints.json"
    bad.write_text('{"schema_version": 1, "port": 0}')
    result = uerl("train", "--endpoints", str(bad))
    assert result.returncode == 2
    assert f"{bad} is not a valid endpoints object" in result.stderr
    assert "Traceback" not in result.stderr


def test_train_against_an_unreachable_cluster_exits_1_quickly(tmp_path: Path) -> None:
    dead = f"127.0.0.2:{processes.free_port()}"
    endpoints = (
        Topology()
        .endpoints()
        .model_copy(
            update={"ray": Topology().endpoints().ray.model_copy(update={"gcs_address": dead})}
        )
    )
    path = tmp_path / "endpoints.json"
    path.write_text(endpoints.to_json())
    start = time.monotonic()
    result = uerl(
        "train", "--endpoints", str(path), "--run-dir", str(tmp_path), "--preflight-timeout", "3"
    )
    assert result.returncode == 1
    assert f"Ray GCS {dead} is unreachable within 3s" in result.stderr
    # Its 3 s and the CLI's imports (seconds idle, up to 5x that loaded): not Ray's own
    # retries, which went on for over 150 s.
    assert time.monotonic() - start < 120


def test_unknown_hyperparameter_exits_2_naming_it_and_its_source(tmp_path: Path) -> None:
    hp = tmp_path / "hp.yaml"
    hp.write_text("lr: 0.001\nclip_parm: 0.1\n")
    result = uerl("local", "--hparams", str(hp), "--run-dir", str(tmp_path))
    assert result.returncode == 2
    assert f"{hp}: 'clip_parm' is not a PPO training option" in result.stderr


def test_hyperparameter_of_the_wrong_type_exits_2(tmp_path: Path) -> None:
    result = uerl("local", "--hp", "gamma=high", "--run-dir", str(tmp_path))
    assert result.returncode == 2
    assert "--hp: gamma must be a number, got 'high'" in result.stderr


def test_local_with_an_invalid_topology_override_exits_2_naming_the_path(tmp_path: Path) -> None:
    result = uerl("local", "--workers", "0", "--run-dir", str(tmp_path))
    assert result.returncode == 2
    assert "topology.workers.replicas" in result.stderr


# -- numbers out of range: refused up front, naming the flag ----------------------

OUT_OF_RANGE = [
    ("mock-ue", "--port", "99999"),
    ("mock-ue", "--port", "70000"),
    ("mock-ue", "--port", "-5"),
    ("mock-ue", "--envs", "0"),
    ("local", "--envs", "0"),
    ("local", "--base-port", "70000"),
    ("local", "--game-restarts", "-1"),
    ("local", "--iterations", "0"),
    ("local", "--timesteps", "-100"),
    ("local", "--eval-episodes", "0"),
    ("local", "--checkpoint-every", "0"),
    ("local", "--snapshot-every", "0"),
    ("local", "--window", "0"),
    ("local", "--p-current", "1.5"),
    ("local", "--train-batch-size", "0"),
    ("local", "--minibatch-size", "-1"),
    ("local", "--num-epochs", "0"),
    ("local", "--preflight-timeout", "0"),
    ("local", "--request-timeout", "-1"),
    ("local", "--fault-wait", "0"),
    ("local", "--sample-timeout", "0"),
    ("local", "--game-down-limit", "nan"),
    ("train", "--iterations", "0"),
    ("eval", "--episodes", "0"),
    ("eval", "--timeout", "-1"),
    ("local eval", "--episodes", "0"),
    ("export", "--samples", "0"),
    ("export", "--snapshot", "-1"),
    ("discover", "--timeout", "-1"),
    ("local scale", "--timeout", "0"),
    ("tls-secret", "--days", "0"),
    ("bench", "--envs", "0"),
    ("bench", "--seconds", "0"),
    ("bench-policies", "--iterations", "0"),
    ("bench-faults", "--workers", "0"),
]


@pytest.mark.parametrize(("command", "flag", "value"), OUT_OF_RANGE)
def test_a_number_out_of_range_exits_2_naming_its_flag_before_anything_starts(
    tmp_path: Path, command: str, flag: str, value: str
) -> None:
    result = uerl(*command.split(), f"{flag}={value}", timeout_s=guard(120))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"argument {flag}: {value}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_export_of_a_missing_checkpoint_names_the_checkpoint_flag(tmp_path: Path) -> None:
    result = uerl("export", "--checkpoint", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert f"--checkpoint {tmp_path / 'nope'}: no such checkpoint directory" in result.stderr
    assert "--resume" not in result.stderr


def test_eval_checks_the_checkpoint_before_asking_for_endpoints(tmp_path: Path) -> None:
    result = uerl("eval", "--checkpoint", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"uerl eval: --checkpoint {tmp_path / 'nope'}: no such checkpoint directory"
    ]


@pytest.mark.parametrize(
    "argv", [["train", "--iterations", "0"], ["local", "--envs", "0"], ["eval", "--episodes", "0"]]
)
def test_a_bad_flag_is_refused_before_ray_rllib_or_torch_is_imported(argv: list[str]) -> None:
    # The flags are checked against training.run.options, apart from the driver (RLlib).
    script = (
        "import sys\nfrom training.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit as exc:\n    print('exit', exc.code)\n"
        "print(sorted(m for m in ('ray', 'ray.rllib', 'torch') if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=guard(120),
        check=False,
    )
    assert proc.stdout.splitlines() == ["exit 2", "[]"], proc.stdout + proc.stderr


def test_a_crash_in_native_code_prints_where_every_thread_was() -> None:
    # A segfault after the command started (as in Ray's teardown) is reported by the CLI's
    # fault handler: the Python stack of each thread, then the signal's exit status.
    crash = "\n".join(
        [
            "import ctypes",
            "from training.cli import main",
            "main(['--help'])",
            "ctypes.string_at(0)",
        ]
    )
    proc = subprocess.run(
        [sys.executable, "-c", crash],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=guard(120),
    )
    assert proc.returncode == -11
    assert "Fatal Python error: Segmentation fault" in proc.stderr
    assert 'File "<string>", line 4' in proc.stderr


# ---- the run's name and its place in the run storage ---------------------------------


def claim_endpoints(tmp_path: Path) -> Path:
    """Endpoints whose runs claim is `tmp_path/claim` (here, as the head mounts it)."""
    from infra.endpoints import RunStorage

    (tmp_path / "claim").mkdir()
    runs = RunStorage(uri=f"file://{tmp_path / 'claim'}")
    path = tmp_path / "endpoints.json"
    path.write_text(Topology().endpoints().model_copy(update={"runs": runs}).to_json())
    return path


def test_an_empty_run_name_is_refused_not_replaced_by_a_timestamp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: `--run-name ''` ran as <cluster>-<time>; `uerl supervise` refused it.
    from training.commands import train

    with pytest.raises(SystemExit) as exited:
        train.main(["--endpoints", str(claim_endpoints(tmp_path)), "--run-name", ""])
    assert exited.value.code == 2
    assert "argument --run-name: '': a run name is 1 to 100 letters" in capsys.readouterr().err
    assert list((tmp_path / "claim").iterdir()) == []


def test_resume_auto_with_nothing_stored_says_a_new_run_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from training.commands import train

    monkeypatch.setattr("training.run.outcome.train_and_report", lambda *a, **k: 0)
    endpoints = claim_endpoints(tmp_path)
    assert train.main(["--endpoints", str(endpoints), "--run-name", "r1", "--resume", "auto"]) == 0
    checkpoints = tmp_path / "claim" / "r1" / "checkpoints"
    assert f"--resume auto: no checkpoint in {checkpoints} yet: a new run starts" in (
        capsys.readouterr().out.splitlines()
    )


def _fails_at_preflight(endpoints: object, options: object, **kwargs: object) -> int:
    """What a start refused by the games or by Ray leaves: Ray's log, no iteration."""
    log = options.run_dir / "logs" / "ray.log"  # type: ignore[attr-defined]
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    print("uerl train: Ray GCS 127.0.0.2:1 is unreachable within 2s", file=sys.stderr)
    return 1


def test_a_start_that_fails_leaves_no_run_in_the_storage_and_frees_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: claim/r1 with logs/ray.log stayed: `uerl runs list` showed run r1, and
    # `--run-name r1` again was refused ("holds a run already").
    from training.commands import train
    from training.commands.runs import main as runs_main

    monkeypatch.setattr("training.run.outcome.train_and_report", _fails_at_preflight)
    endpoints = str(claim_endpoints(tmp_path))
    for _ in range(2):  # the second start, under the same name, is not refused
        assert train.main(["--endpoints", endpoints, "--run-name", "r1"]) == 1
        assert "holds a run already" not in capsys.readouterr().err
        assert list((tmp_path / "claim").iterdir()) == []
    assert runs_main(["list", "--dir", str(tmp_path / "claim")]) == 0
    assert capsys.readouterr().err.strip() == f"0 run(s) in {tmp_path / 'claim'}"


def test_a_start_refused_after_the_storage_was_opened_leaves_no_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: an empty claim/r1 stayed (the lease's directory), listed as a run.
    from training.commands import train

    endpoints = str(claim_endpoints(tmp_path))
    assert train.main(["--endpoints", endpoints, "--run-name", "r1", "--resume", "latest"]) == 2
    assert "--resume: no checkpoint in" in capsys.readouterr().err
    assert list((tmp_path / "claim").iterdir()) == []


def test_a_start_that_fails_removes_the_run_dir_it_made_and_keeps_one_made_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from training.commands import train

    monkeypatch.setattr("training.run.outcome.train_and_report", _fails_at_preflight)
    endpoints = str(claim_endpoints(tmp_path))
    made, mine = tmp_path / "new-run", tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert train.main(["--endpoints", endpoints, "--run-dir", str(made)]) == 1
    assert train.main(["--endpoints", endpoints, "--run-dir", str(mine)]) == 1
    assert not made.exists()
    assert (mine / "notes.txt").read_text() == "mine"


def test_a_refusal_a_command_lets_through_is_one_line_and_its_status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from types import SimpleNamespace

    from training import cli, exit_status

    def refuses(argv: list[str]) -> int:
        raise exit_status.UserError("--checkpoint x:\n  no such directory", exit_status.FAILED)

    monkeypatch.setattr(cli.importlib, "import_module", lambda name: SimpleNamespace(main=refuses))
    assert cli.main(["export"]) == exit_status.FAILED
    assert capsys.readouterr().err == "uerl export: --checkpoint x: no such directory\n"
