"""The token a stack's Ray API asks for, read by `uerl submit` from the Secret the
endpoints name (`ray.token_secret`), through the Kubernetes API it already uses."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from infra.endpoints import Endpoints
from training.ray_auth.token_client import RAY_AUTH_TOKEN_KEY
from training.submit.head import API_TIMEOUT_S, api_failure
from training.submit.submit_error import BAD_INPUT, CLUSTER_UNUSABLE, SubmitError


def where(endpoints: Endpoints) -> str:
    """The Secret, as a message names it."""
    return (
        f"Secret {endpoints.ray.token_secret} in namespace {endpoints.namespace} "
        "(endpoints ray.token_secret)"
    )


def read(api_client: Any, endpoints: Endpoints) -> str | None:
    """The token; None when the stack's Ray asks for none."""
    name = endpoints.ray.token_secret
    if name is None:
        return None
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    try:
        secret = CoreV1Api(api_client).read_namespaced_secret(
            name, endpoints.namespace, _request_timeout=API_TIMEOUT_S
        )
    except ApiException as exc:
        if exc.status == 404:
            raise SubmitError(
                f"the Ray API's token: no {where(endpoints)}. KubeRay makes it with the "
                "RayCluster (KubeRay >= 1.5); with ray.auth.secret_name, it is yours to make",
                BAD_INPUT,
            ) from None
        if exc.status == 403:
            raise SubmitError(
                f"the Ray API's token: this kubeconfig may not read the {where(endpoints)}; "
                f"`get` on secrets there is needed to submit ({api_failure(api_client, exc)})",
                BAD_INPUT,
            ) from None
        raise SubmitError(api_failure(api_client, exc), CLUSTER_UNUSABLE) from None
    except Exception as exc:  # urllib3's errors, a TLS failure
        raise SubmitError(api_failure(api_client, exc), CLUSTER_UNUSABLE) from None
    encoded = (secret.data or {}).get(RAY_AUTH_TOKEN_KEY)
    try:
        token = base64.b64decode(encoded or "", validate=True).decode().strip()
    except (binascii.Error, UnicodeDecodeError):
        token = ""
    if not token:
        raise SubmitError(
            f"the Ray API's token: the {where(endpoints)} has no {RAY_AUTH_TOKEN_KEY!r} key "
            "holding it",
            BAD_INPUT,
        )
    return token
