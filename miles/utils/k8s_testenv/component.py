"""A part of the environment that `with` starts and stops (Go: envtest's Start, deferred Stop)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Self


class Component(ABC):
    """start() brings it up, stop() takes it down; `with` does both around its block."""

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
