"""TLS for `uerl local`: a throwaway CA and certificate in the run directory, the mock
games' server arguments and the endpoints' client side, as a stack's Secret gives
them on Kubernetes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from infra.endpoints import GameTLS
from training.local.games import HOST
from training.tls import certificates

TLSMode = Literal["server", "mutual"]


@dataclass(frozen=True)
class LocalGameTLS:
    mode: TLSMode
    files: certificates.TLSFiles

    @property
    def server_args(self) -> list[str]:
        """`uerl mock-ue` arguments: serve TLS (and require client certificates)."""
        args = ["--tls-cert", str(self.files.cert), "--tls-key", str(self.files.key)]
        if self.mode == "mutual":
            args += ["--tls-client-ca", str(self.files.ca)]
        return args

    @property
    def client(self) -> GameTLS:
        return GameTLS.in_directory(str(self.files.directory), mutual=self.mode == "mutual")


def throwaway(run_dir: Path, mode: TLSMode) -> LocalGameTLS:
    """A CA made for this run only; the games' certificate names 127.0.0.1 and localhost."""
    files = certificates.issue(run_dir / "tls", [HOST, "localhost"], days=7)
    return LocalGameTLS(mode, files)
