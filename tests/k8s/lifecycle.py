"""The context-manager half the tier's long-lived pieces share (control plane, node)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class StartStop(ABC):
    """`with X() as x:` runs `start()`; `stop()` runs on every exit path, also when
    `start()` itself fails half-way (KeyboardInterrupt included), with `_failed` set so
    the piece keeps its logs."""

    _failed: bool = False

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:  # also KeyboardInterrupt: undo what was done
            self._failed = True
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._failed = self._failed or exc_type is not None
        self.stop()
