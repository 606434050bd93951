"""examples/colocate_pairing: the reconciler's patches, its events, its refusals and its
configuration, through the write client over a recording stand-in transport (no cluster; the e2e
tests run it on a kubelet layer and as a Deployment on the real node)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from miles.utils.workers.k8s_types import Pod
from miles.utils.workers.reconcile.client import Client, RawResponse
from miles.utils.workers.reconcile.examples.colocate_pairing import (
    ColocatePairing,
    ConfigError,
    NotLeadingError,
    PairingConfig,
    PairingForbiddenError,
    identity_of,
    load_config,
    without_traceback,
)
from tests.fast.utils.workers.reconcile.fake_transport import RecordingTransport, Sent

CONFIG = PairingConfig(trainer_label="t", role_label="r", gate="g")


_REASONS = {403: "Forbidden", 409: "Conflict", 422: "Invalid"}


@dataclass
class Patches(RecordingTransport):
    """Records each pod PATCH it accepts in ``patched`` as (namespace, name, JSON patch) and
    answers it with the pod, or refuses every one with ``refuse_with``'s Status."""

    patched: list[tuple[str, str, list[dict[str, Any]]]] = field(default_factory=list)
    refuse_with: int | None = None

    def answer(self, sent: Sent) -> RawResponse:
        assert (sent.method, sent.content_type) == ("PATCH", "application/json-patch+json")
        _, _, _, _, namespace, _, name = sent.path.split("/")
        if self.refuse_with is not None:
            status = {
                "kind": "Status",
                "code": self.refuse_with,
                "reason": _REASONS[self.refuse_with],
                "message": f'pods "{name}" is forbidden: no patch',
            }
            return RawResponse(self.refuse_with, json.dumps(status).encode())
        assert sent.body is not None
        self.patched.append((namespace, name, sent.body))
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
        }
        return RawResponse(200, json.dumps(pod).encode())


@dataclass
class Recorded:
    events: list[tuple[str, str, str, str]] = field(default_factory=list)

    def record(self, obj: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        self.events.append((obj["metadata"]["name"], event_type, reason, message))


@dataclass
class Leading:
    leading: bool

    def is_leader(self) -> bool:
        return self.leading

    async def wait_until_leading(self) -> None:
        raise AssertionError("the reconciler never waits")


def pod(name: str, role: str, *, gates: tuple[str, ...] = (), node: str | None = None) -> Pod:
    return Pod.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": "ns",
                "resourceVersion": "7",
                "labels": {"t": "trainer-0", "r": role},
            },
            "spec": {
                "nodeName": node,
                "schedulingGates": [{"name": g} for g in gates],
                "nodeSelector": {"zone": "a"},
            },
        }
    )


TRAINER = pod("trainer-0", "trainer", node="node-1")


def controller(
    patches: Patches, leading: bool | None = None, recorder: Recorded | None = None
) -> ColocatePairing:
    return ColocatePairing(
        client=Client(transport=patches),
        recorder=recorder,
        namespace="ns",
        config=CONFIG,
        leadership=None if leading is None else Leading(leading),
    )


async def test_one_guarded_patch_pins_and_ungates_only_gated_inference_pods() -> None:
    patches = Patches()
    members = [
        TRAINER,
        pod("infer-0", "inference", gates=("g",)),
        pod("held", "inference", gates=("g", "other")),
        pod("foreign", "inference", gates=("other",)),
    ]
    recorded = Recorded()
    pairing = await controller(patches, recorder=recorded).pair("trainer-0", members)
    assert pairing.released == ("infer-0", "held")
    assert recorded.events == [
        (name, "Normal", "Paired", "released onto node node-1, beside trainer trainer-0")
        for name in ("infer-0", "held")
    ]
    assert pairing.node == "node-1"
    test = {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    pinned = {"zone": "a", "kubernetes.io/hostname": "node-1"}
    selector = {"op": "add", "path": "/spec/nodeSelector", "value": pinned}
    assert patches.patched == [
        ("ns", "infer-0", [test, selector, {"op": "remove", "path": "/spec/schedulingGates"}]),
        (
            "ns",
            "held",
            [
                test,
                selector,
                {"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": "other"}]},
            ],
        ),
    ]


async def test_nothing_is_sent_without_a_trainer_on_a_node() -> None:
    patches = Patches()
    unbound = pod("trainer-0", "trainer")
    pairing = await controller(patches).pair(
        "trainer-0", [unbound, pod("i", "inference", gates=("g",))]
    )
    assert (pairing.node, pairing.released, patches.patched) == (None, (), [])


async def test_no_patch_is_sent_while_not_leading() -> None:
    patches = Patches()
    with pytest.raises(NotLeadingError, match="ns/infer-0 was not patched"):
        await controller(patches, leading=False).pair(
            "trainer-0", [TRAINER, pod("infer-0", "inference", gates=("g",))]
        )
    assert patches.patched == []
    await controller(patches, leading=True).pair(
        "trainer-0", [TRAINER, pod("infer-0", "inference", gates=("g",))]
    )
    assert [name for _, name, _ in patches.patched] == ["infer-0"]


async def test_a_forbidden_patch_is_one_line_and_fails_readiness_until_one_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    patches = Patches(refuse_with=403)
    pairing = controller(patches)
    members = [TRAINER, pod("infer-0", "inference", gates=("g",))]
    with pytest.raises(PairingForbiddenError) as raised:
        await pairing.pair("trainer-0", members)
    assert str(raised.value) == (
        'patch of pod ns/infer-0 forbidden: pods "infer-0" is forbidden: no patch; '
        "the Role needs pods: patch"
    )
    assert pairing.check() is not None
    patches.refuse_with = None
    await pairing.pair("trainer-0", members)
    assert pairing.check() is None


def test_the_loops_line_for_a_refusal_carries_no_stack() -> None:
    refusal = PairingForbiddenError("patch of pod ns/p forbidden")
    other = RuntimeError("boom")
    records = [
        logging.LogRecord("loop", logging.ERROR, "", 0, "failed", (), (type(e), e, None))
        for e in (refusal, other)
    ]
    assert [without_traceback(r) for r in records] == [True, True]
    assert records[0].exc_info is None
    assert records[1].exc_info is not None


@pytest.mark.parametrize("status", [409, 422])
async def test_a_pod_changed_since_read_is_left_to_the_next_reconcile(status: int) -> None:
    patches = Patches(refuse_with=status)
    pairing = await controller(patches).pair(
        "trainer-0", [TRAINER, pod("infer-0", "inference", gates=("g",))]
    )
    assert pairing.released == ()


async def test_the_older_core_v1_api_argument_still_builds_its_client() -> None:
    async with k8s.ApiClient(k8s.Configuration(host="https://127.0.0.1:9")) as api:
        pairing = ColocatePairing(core_v1_api=k8s.CoreV1Api(api), namespace="ns", config=CONFIG)
        assert pairing.patches_sent == 0
    with pytest.raises(ValueError, match="needs a client"):
        ColocatePairing(namespace="ns", config=CONFIG)


def test_a_bad_config_file_is_one_line_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "pairing.json"
    path.write_text(json.dumps({"leader_election": {"enabled": "sometimes"}, "gates": []}))
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert "\n" not in message
    assert "leader_election.enabled" in message
    assert "gates: Extra inputs" in message
    path.write_text("{")
    with pytest.raises(ConfigError, match="not JSON"):
        load_config(path)
    with pytest.raises(ConfigError, match="No such file"):
        load_config(tmp_path / "absent.json")


def test_a_config_file_reads_into_the_model(tmp_path: Path) -> None:
    path = tmp_path / "pairing.json"
    path.write_text(json.dumps({"selector": "a=b", "leader_election": {"enabled": True}}))
    config = load_config(path)
    assert (config.selector, config.leader_election.enabled) == ("a=b", True)
    assert config.leader_election.lease_duration == 15.0


def test_the_identity_is_configured_else_the_pod_name_else_unique() -> None:
    assert identity_of("me", {"POD_NAME": "pod-a"}) == "me"
    assert identity_of(None, {"POD_NAME": "pod-a"}) == "pod-a"
    first, second = identity_of(None, {}), identity_of(None, {})
    assert first != second
    assert "_" in first
