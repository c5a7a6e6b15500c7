"""uerl's exit statuses: one meaning each, the same for every command (docs/kubernetes.md
and each command's --help say which it gives).

A supervised run reads them back (training.supervise): 2 is never worth a retry, 1 may
be, 130 and 143 were asked for.
"""

from __future__ import annotations

OK = 0
# The work failed: training, the games, an outage outlasting its wait, a lost lease.
FAILED = 1
# Refused before anything started: the message names the flag, field or endpoint.
BAD_INPUT = 2
# Stopped when asked (Ctrl-C, SIGTERM, a job stopped), after a final checkpoint.
INTERRUPTED = 130
# Ended by SIGTERM at once (a supervisor whose pod is deleted): 128 + 15, as a shell says.
TERMINATED = 143


class UserError(Exception):
    """What a command stops on: one line naming what is wrong (a flag, a field, an
    endpoint) and the status it exits with. `uerl` prints it as `uerl <command>: ...`
    should a command let one through, never a traceback."""

    def __init__(self, message: str, status: int = BAD_INPUT) -> None:
        # One line: a multi-line cause (a pulumi or API error body) is folded.
        super().__init__(" ".join(message.split()))
        self.status = status
