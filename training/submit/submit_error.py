"""What `uerl submit` stops on: one line naming what is wrong, and its exit status."""

from __future__ import annotations

from training import exit_status

# Exit statuses: the input names something that is not there or not valid, or the
# cluster it names cannot be used right now (unreachable, head not ready).
BAD_INPUT = exit_status.BAD_INPUT
CLUSTER_UNUSABLE = exit_status.FAILED


class SubmitError(exit_status.UserError):
    """A clear one-line reason `uerl submit` cannot go on, and the status it exits with."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message, exit_code)

    @property
    def exit_code(self) -> int:
        return self.status
