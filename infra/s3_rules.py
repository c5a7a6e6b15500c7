"""What an S3-compatible store accepts for the values a topology's `runs.s3` names: a
bucket, a key prefix, a region and an endpoint URL; and where an endpoint is, as a
NetworkPolicy can admit it. AWS's rules (MinIO refuses the same names), beside
k8s_rules.py's for Kubernetes. Each check returns its value or raises ValueError.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from infra import k8s_rules

# An S3 bucket name: AWS's rules (MinIO refuses the same names).
BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
BUCKET_RESERVED = (("xn--", "sthree-", "amzn-s3-demo-"), ("-s3alias", "--ol-s3", ".mrap", "--x-s3"))
# One part of a host name (RFC 1123 labels). A region is one: the AWS SDK puts it in host
# names and request signatures.
HOST_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def _bucket_reason(value: str) -> str | None:
    if not 3 <= len(value) <= 63:
        return f"it is {len(value)} characters long"
    if any("A" <= c <= "Z" for c in value):
        return "it has upper-case letters"
    bad = sorted({c for c in value if not (c.isascii() and (c.isalnum() or c in ".-"))})
    if bad:
        return "it contains " + ", ".join(repr(c) for c in bad)
    if not BUCKET.fullmatch(value):
        return f"it starts or ends with {value[0] if value[0] in '.-' else value[-1]!r}"
    for pair in ("..", ".-", "-."):
        if pair in value:
            return f"it contains {pair!r}"
    if re.fullmatch(r"[0-9]+(\.[0-9]+){3}", value):
        return "it is formatted as an IP address"
    prefixes, suffixes = BUCKET_RESERVED
    if value.startswith(prefixes) or value.endswith(suffixes):
        return (
            "AWS reserves names starting "
            + ", ".join(map(repr, prefixes))
            + (" or ending " + ", ".join(map(repr, suffixes)))
        )
    return None


def bucket_name(value: str) -> str:
    reason = _bucket_reason(value)
    if reason is not None:
        raise ValueError(
            f"{value!r} is not an S3 bucket name: {reason} (3 to 63 lower-case letters, "
            "digits, '.' and '-', starting and ending with a letter or digit, no '..', not "
            "an IP address)"
        )
    return value


def key_prefix(value: str) -> str:
    if value.startswith("/") or value.endswith("/") or "//" in value:
        raise ValueError(f"{value!r}: a key prefix has no leading, trailing or double '/'")
    dots = [part for part in value.split("/") if part in (".", "..")]
    if dots:
        raise ValueError(
            f"{value!r}: a key prefix has no {dots[0]!r} part (a path reading it would leave "
            "the prefix)"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{value!r}: a key prefix has no control characters")
    return value


def region_name(value: str) -> str:
    if not HOST_LABEL.fullmatch(value):
        reason = k8s_rules.why_not_host_label(value)
        raise ValueError(
            f"{value!r} is not an S3 region: {reason} (at most 63 letters, digits and '-', "
            "starting and ending with a letter or digit, e.g. us-east-1)"
        )
    return value


def _endpoint_reason(value: str) -> str | None:
    if any(c.isspace() for c in value):
        return "it contains whitespace"
    try:
        url = urlsplit(value)
    except ValueError as exc:  # an unclosed '[' of an IPv6 address
        return str(exc)
    if url.scheme not in ("http", "https") or not value.startswith(f"{url.scheme}://"):
        return "it does not start with http:// or https://"
    if url.path not in ("", "/") or "?" in value or "#" in value:
        return "it has more than a host and a port"
    if "@" in url.netloc:
        return "it holds credentials: give them in runs.s3.credentials_secret"
    host_port = url.netloc
    if host_port.endswith(":"):
        return "its port is empty"
    try:
        port = url.port
    except ValueError:
        return f"port {host_port.rpartition(':')[2]!r} is not a port number (1 to 65535)"
    if port == 0:
        return "port 0 is not a port a store listens on (1 to 65535)"
    host = url.hostname or ""
    if not host:
        return "it has no host"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        if host_port.startswith("["):
            return f"[{host}] is not an IPv6 address"
    labels = host.removesuffix(".").split(".")
    bad = [label for label in labels if not HOST_LABEL.fullmatch(label)]
    if bad or len(host) > 253:
        return f"host {host!r} is not a host name (letters, digits and '-', in '.'-separated parts)"
    return None


def endpoint_url(value: str) -> str:
    """The URL without a trailing '/'."""
    reason = _endpoint_reason(value)
    if reason is not None:
        raise ValueError(
            f"{value!r} is not an S3 endpoint URL: {reason} (http:// or https://, a host and "
            "an optional port, no path, e.g. https://s3.example.com:9000)"
        )
    return value.rstrip("/")


# An in-cluster Service's DNS name: `<service>.<namespace>.svc[.<cluster domain>]`.
_SERVICE_HOST = re.compile(r"^[a-z0-9-]+\.([a-z0-9-]+)\.svc(\.[a-z0-9.-]+)?$")


@dataclass(frozen=True)
class StoreAddress:
    """Where the head's traffic to the run store goes, as a NetworkPolicy can admit it:
    an address and port, or an in-cluster Service's namespace (any port: a Service's
    port is translated to its pods', which the endpoint does not say)."""

    ip: str | None = None
    port: int | None = None
    namespace: str | None = None


def store_address(endpoint: str | None) -> StoreAddress | None:
    """The run store's address at `endpoint`; None: a host name out of the cluster (or
    AWS S3), which no NetworkPolicy can name."""
    if endpoint is None:
        return None
    url = urlsplit(endpoint)
    host = url.hostname or ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        service = _SERVICE_HOST.fullmatch(host)
        return StoreAddress(namespace=service.group(1)) if service else None
    return StoreAddress(ip=str(ip), port=url.port or (443 if url.scheme == "https" else 80))
