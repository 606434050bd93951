"""The seeded workload of ``bench/pipeline.py``: a world of pods over parents, the mixed events and
the latency samples.

Go counterpart: none (benchmark workload).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ObjectKey,
    ParentKey,
    SourceEvent,
    UpsertEvent,
)

DRAIN_MARKER_PARENT = "~drained"


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    parent: ParentKey
    version: int


def parent_of(pod: Pod) -> ParentKey:
    return pod.parent


@dataclass(frozen=True)
class Workload:
    world: dict[ObjectKey, Pod]
    parents: set[ParentKey]
    mixed: list[SourceEvent]
    """The mixed events, then one upsert moving the drain marker under ``DRAIN_MARKER_PARENT``."""
    mixed_events: int
    latency: list[UpsertEvent]
    """Updates to pods alive after ``mixed``, one parent each."""


class _Population:
    """Live pods with O(1) random choice and removal."""

    def __init__(self, pods: Mapping[ObjectKey, Pod]) -> None:
        self.pods = dict(pods)
        self._names = list(pods)
        self._slot = {name: i for i, name in enumerate(self._names)}

    def __len__(self) -> int:
        return len(self._names)

    def pick(self, rng: random.Random) -> Pod:
        return self.pods[self._names[rng.randrange(len(self._names))]]

    def put(self, pod: Pod) -> None:
        if pod.name not in self._slot:
            self._slot[pod.name] = len(self._names)
            self._names.append(pod.name)
        self.pods[pod.name] = pod

    def remove(self, name: ObjectKey) -> Pod:
        slot = self._slot.pop(name)
        last = self._names.pop()
        if last != name:
            self._names[slot] = last
            self._slot[last] = slot
        return self.pods.pop(name)


def build_workload(*, pods: int, parents: int, events: int, samples: int, seed: int) -> Workload:
    rng = random.Random(seed)
    parent_names = [f"cell-{i:05d}" for i in range(parents)]
    world = {
        name: Pod(name, parent_names[i % parents], 0)
        for i, name in ((i, f"pod-{i:07d}") for i in range(pods))
    }
    live = _Population(world)
    deleted: list[Pod] = []
    mixed: list[SourceEvent] = []
    for _ in range(events):
        roll = rng.random()
        if (roll < 0.2 and deleted) or not live:
            slot = rng.randrange(len(deleted))
            gone = deleted[slot]
            deleted[slot] = deleted[-1]
            deleted.pop()
            pod = Pod(gone.name, rng.choice(parent_names), gone.version + 1)
            live.put(pod)
            mixed.append(UpsertEvent(pod.name, pod))
        elif roll < 0.4:
            gone = live.remove(live.pick(rng).name)
            deleted.append(gone)
            mixed.append(DeleteEvent(gone.name, gone))
        elif roll < 0.6:
            old = live.pick(rng)
            parent = rng.choice(parent_names)
            while parent == old.parent and parents > 1:
                parent = rng.choice(parent_names)
            pod = Pod(old.name, parent, old.version + 1)
            live.put(pod)
            mixed.append(UpsertEvent(pod.name, pod))
        else:
            old = live.pick(rng)
            pod = Pod(old.name, old.parent, old.version + 1)
            live.put(pod)
            mixed.append(UpsertEvent(pod.name, pod))
    marker = Pod("~marker", DRAIN_MARKER_PARENT, 0)
    mixed.append(UpsertEvent(marker.name, marker))
    latency: list[UpsertEvent] = []
    for _ in range(samples):
        old = live.pick(rng)
        pod = Pod(old.name, old.parent, old.version + 1)
        live.put(pod)
        latency.append(UpsertEvent(pod.name, pod))
    return Workload(
        world=world,
        parents=set(parent_names[: min(pods, parents)]),
        mixed=mixed,
        mixed_events=events,
        latency=latency,
    )
