"""The HTTP status a GET gets, for the checks that a token is asked for (Ray's job API
on a local head and on a stack's pods)."""

from __future__ import annotations

import urllib.error
import urllib.request


def http_status(url: str, headers: dict[str, str], *, timeout_s: float = 30) -> int | None:
    """The answer's status, an error status included; None when nothing answers."""
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None  # nothing listening (yet)
