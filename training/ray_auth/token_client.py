"""The client side of Ray's token authentication (Ray >= 2.52): the header a call to the
dashboard or job API carries, the token a pod is given, and a refusal told apart from a
head that does not answer (a refusal is not retried: the same token would be refused
again).

A stack's RayCluster asks for the token on every call (`ray.auth`, KubeRay's
`authOptions`); the endpoints name the Secret holding it (`ray.token_secret`). Ray's
own processes in the stack's pods get it from KubeRay as RAY_AUTH_TOKEN; uerl's clients
outside them send it themselves: `uerl submit` reads it from the Secret through the
Kubernetes API, `uerl supervise` reads it from the Secret its Job mounts (RAY_AUTH_TOKEN_FILE),
at each connection, so a rotated token is followed."""

from __future__ import annotations

import os

from infra.contract import RAY_AUTH_TOKEN_ENV, RAY_AUTH_TOKEN_KEY

__all__ = [
    "RAY_AUTH_TOKEN_ENV",
    "RAY_AUTH_TOKEN_FILE_ENV",
    "RAY_AUTH_TOKEN_KEY",
    "headers",
    "is_refusal",
    "token_from_env",
]

# What Ray's job client says on a 401 (no token) or 403 (another token): its
# AuthenticationError's message starts so (ray/_private/authentication).
REFUSALS = ("Authentication required", "Authentication failed")


def headers(token: str | None) -> dict[str, str]:
    """HTTP headers for Ray's dashboard and job API: none without a token."""
    return {"Authorization": f"Bearer {token}"} if token else {}


# A file holding the token (a mounted Secret, which the kubelet keeps up to date when the
# Secret is rotated): read at each use, so a long-lived client follows a rotation.
RAY_AUTH_TOKEN_FILE_ENV = "RAY_AUTH_TOKEN_FILE"


def token_from_env() -> str | None:
    """The token this process was given: the file RAY_AUTH_TOKEN_FILE names, read now,
    else RAY_AUTH_TOKEN; None if neither (or the file cannot be read)."""
    path = os.environ.get(RAY_AUTH_TOKEN_FILE_ENV)
    if path:
        try:
            with open(path) as fh:
                return fh.read().strip() or None
        except OSError:
            return None
    return os.environ.get(RAY_AUTH_TOKEN_ENV) or None


def is_refusal(exc: BaseException) -> bool:
    """Ray's job API refused the call's token (or its lack of one)."""
    return type(exc).__name__ == "AuthenticationError" or str(exc).startswith(REFUSALS)
