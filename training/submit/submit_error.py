"""What `uerl submit` stops on: one line naming what is wrong, and its exit status."""

from __future__ import annotations

# Exit statuses: the input names something that is not there or not valid, or the
# cluster it names cannot be used right now (unreachable, head not ready).
BAD_INPUT = 2
CLUSTER_UNUSABLE = 1


class SubmitError(Exception):
    """A clear one-line reason `uerl submit` cannot go on, and the status it exits with."""

    def __init__(self, message: str, exit_code: int) -> None:
        # One line: a multi-line cause (a pulumi or API error body) is folded.
        super().__init__(" ".join(message.split()))
        self.exit_code = exit_code
