"""The guard of every module that tests the compiled client (`native/`)."""

from __future__ import annotations

import shutil

import pytest

from training.clients import native


def require_compiled_client() -> None:
    """Fail where cargo could have built it and did not; skip only without Rust."""
    if native.available():
        return
    if shutil.which("cargo"):
        pytest.fail("cargo is here but the compiled client is not built: run `make setup`")
    pytest.skip("no Rust toolchain: the compiled client is not built", allow_module_level=True)
