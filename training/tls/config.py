"""The PEM files a client presents and trusts when it talks TLS to a game."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from infra.endpoints import GameTLS

if TYPE_CHECKING:
    import grpc

# gRPC speaks HTTP/2, which over TLS is negotiated with ALPN: gRPC clients refuse a
# server that selects nothing, so every TLS endpoint (game or forwarder) offers it.
ALPN_PROTOCOLS = ["h2"]


@dataclass(frozen=True)
class TLSConfig:
    """Paths to PEM files. `ca_path` alone = server-authenticated TLS; add cert+key for mTLS."""

    ca_path: str | None = None
    cert_path: str | None = None
    key_path: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_path is None) != (self.key_path is None):
            raise ValueError("TLS client certificate and key must be given together")

    @property
    def mutual(self) -> bool:
        return self.cert_path is not None

    def _read(self, path: str | None, what: str) -> bytes | None:
        if path is None:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read the TLS {what} {path}: {exc.strerror}") from None

    def credentials(self) -> grpc.ChannelCredentials:
        import grpc  # only where a channel is made (grpc_tuning must run first)

        return grpc.ssl_channel_credentials(
            root_certificates=self._read(self.ca_path, "CA bundle"),
            private_key=self._read(self.key_path, "client key"),
            certificate_chain=self._read(self.cert_path, "client certificate"),
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The same trust and identity as `credentials()`, for the standard library."""
        ca = self._read(self.ca_path, "CA bundle")
        try:
            context = ssl.create_default_context(
                ssl.Purpose.SERVER_AUTH, cadata=ca.decode("ascii", "replace") if ca else None
            )
        except (ssl.SSLError, ValueError) as exc:
            raise ValueError(
                f"the TLS CA bundle {self.ca_path} holds no PEM certificate: {exc}"
            ) from None
        if self.cert_path is not None and self.key_path is not None:
            try:
                context.load_cert_chain(self.cert_path, self.key_path)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(
                    f"cannot load the TLS client certificate {self.cert_path} with key "
                    f"{self.key_path}: {exc}"
                ) from None
        context.set_alpn_protocols(ALPN_PROTOCOLS)
        return context


def for_games(tls: GameTLS | None) -> TLSConfig | None:
    """The client side of the games' TLS, as the endpoints object says (None: plaintext)."""
    return None if tls is None else TLSConfig(tls.ca_path, tls.cert_path, tls.key_path)
