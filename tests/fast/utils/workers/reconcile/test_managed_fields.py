"""Managed fields cut from the bytes before validation (``managed_fields``), on bytes a real
apiserver wrote; what the cut changes in a decode is ``test_k8s_wire``'s property."""

from __future__ import annotations

import json
from pathlib import Path

from miles.utils.workers.reconcile import managed_fields

RECORDED = Path(__file__).parent / "wire"


def test_the_cut_removes_exactly_each_pods_managed_fields_from_recorded_bytes() -> None:
    """On bytes a 1.36 apiserver wrote (``wire/``): a LIST body and each watch line, cut, read as
    the same JSON with every ``metadata.managedFields`` removed, and nothing else."""
    samples = [(RECORDED / "list.json").read_bytes()]
    samples += (RECORDED / "watch.jsonl").read_bytes().splitlines()
    cut_any = False
    for data in samples:
        expected = json.loads(data)
        for pod in expected.get("items") or [expected.get("object") or {}]:
            cut_any |= pod.get("metadata", {}).pop("managedFields", None) is not None
        assert json.loads(managed_fields.without_managed_fields(data)) == expected
    assert cut_any
