"""The tier starts each module once its pieces are built (tests/k8s/build_wait.py): a
module waits for its own pieces, or the build's end, and nothing waits without a build."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

K8S = Path(__file__).resolve().parent / "k8s"


def _load_build_wait():
    spec = importlib.util.spec_from_file_location("build_wait", K8S / "build_wait.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_wait", module)
    spec.loader.exec_module(module)
    return module


build_wait = _load_build_wait()


class Build:
    """A build in progress: pieces complete one per poll, in build.sh's order."""

    def __init__(self, rc_file: Path, order: list[str], end_after: int | None = None) -> None:
        self.rc_file, self.order, self.end_after = rc_file, order, end_after
        self.done: set[str] = set()
        self.polls = 0

    def is_complete(self, piece: str) -> bool:
        return piece in self.done

    def sleep(self, _seconds: float) -> None:
        self.polls += 1
        if self.polls <= len(self.order):
            self.done.add(self.order[self.polls - 1])
        if self.end_after is not None and self.polls >= self.end_after:
            self.rc_file.write_text("0\n")


ORDER = ["kubernetes", "kine", "kwok", "kuberay", "pulumi", "pulumi-language-python",
         "pulumi-kubernetes", "kubernetes-node", "seaweedfs"]  # fmt: skip


def test_every_tier_module_says_what_it_waits_for() -> None:
    modules = {path.name for path in K8S.glob("test_*.py")}
    assert modules == set(build_wait.MODULE_NEEDS)


def test_a_control_plane_module_starts_once_its_four_pieces_are_built(tmp_path: Path) -> None:
    build = Build(tmp_path / "build-rc", ORDER)
    build_wait.wait_for_pieces(
        "test_controlplane.py", build.is_complete, rc_file=build.rc_file, sleep=build.sleep
    )
    assert build.polls == 4 and not build.rc_file.exists()


def test_a_module_of_real_pods_waits_for_the_whole_build(tmp_path: Path) -> None:
    build = Build(tmp_path / "build-rc", ORDER, end_after=12)
    build_wait.wait_for_pieces(
        "test_pods_e2e.py", build.is_complete, rc_file=build.rc_file, sleep=build.sleep
    )
    assert build.polls == 12  # every piece was there after 9: the images come last


def test_a_build_that_ends_without_the_pieces_ends_the_wait(tmp_path: Path) -> None:
    build = Build(tmp_path / "build-rc", [], end_after=3)  # failed: nothing complete
    build_wait.wait_for_pieces(
        "test_pulumi_up.py", build.is_complete, rc_file=build.rc_file, sleep=build.sleep
    )
    assert build.polls == 3


def test_without_a_build_running_nothing_waits() -> None:
    def never(_seconds: float) -> None:
        raise AssertionError("waited")

    assert (
        build_wait.wait_for_pieces("test_node.py", lambda _: False, rc_file=None, sleep=never) == 0
    )


def test_a_status_file_in_no_directory_is_an_error_not_a_wait(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"UERL_K8S_BUILD_RC=.*does not exist"):
        build_wait.wait_for_pieces(
            "test_node.py", lambda _: False, rc_file=tmp_path / "nowhere" / "rc"
        )
