"""The harness's membership changes, the same for a pod and an engine pool: which parent its
label names (moved, dropped, restored) and whether the selector takes it (left, re-entered).

Go counterpart: none. Each change is applied to the writer's model of the object and answered
with the labels that write it; a new parent is drawn by the writer's seeded ``new_parent``, so a
seed replays the same draws.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol

from miles.utils.k8s_testenv.testing.differential.config import SELECT_LABEL
from miles.utils.k8s_testenv.testing.differential.ours import PARENT_LABEL


class Member(Protocol):
    parent: str | None
    selected: bool


class Membership(enum.Enum):
    MOVE = enum.auto()
    LEAVE = enum.auto()
    REENTER = enum.auto()
    ORPHAN = enum.auto()
    ADOPT = enum.auto()

    @classmethod
    def of(cls, op: enum.Enum) -> Membership | None:
        """The membership change a writer's operation of the same name is, if it is one."""
        return cls.__members__.get(op.name)

    def apply(
        self, member: Member, new_parent: Callable[[str | None], str]
    ) -> dict[str, str | None]:
        """Changes ``member`` and returns the labels that write the change."""
        if self in (Membership.LEAVE, Membership.REENTER):
            member.selected = self is Membership.REENTER
            return {SELECT_LABEL: "in" if member.selected else "out"}
        if self is Membership.MOVE:
            member.parent = new_parent(member.parent)
        elif self is Membership.ADOPT:
            member.parent = new_parent(None)
        else:
            member.parent = None
        return {PARENT_LABEL: member.parent}
