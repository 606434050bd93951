"""KWOK start-up checks that need no apiserver: a missing binary or an unreadable kubeconfig fails
at once with a message naming it, and kwok is always given the explicit Stage configuration."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from miles.utils.k8s_testenv import PrerequisiteError
from miles.utils.k8s_testenv.kwok import STAGES_PATH, ApiAccess, Kwok, kwok_argv

STAGE_NAMES = [
    "node-initialize",
    "pod-ready",
    "pod-container-restart",
    "pod-complete",
    "pod-delete",
]


def test_missing_kwok_binary_fails_naming_the_path_and_the_build_command(tmp_path: Path) -> None:
    missing = tmp_path / "bin" / "kwok"
    kwok = Kwok(binary=missing, kubeconfig=tmp_path / "kubeconfig", work_dir=tmp_path / "work")
    with pytest.raises(PrerequisiteError) as failed:
        kwok.start()
    assert str(missing) in str(failed.value)
    assert "python -m miles.utils.k8s_testenv build" in str(failed.value)
    assert kwok.failure() is None


def test_kubeconfig_without_a_token_is_refused_by_name(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(PrerequisiteError, match=re.escape(str(kubeconfig))):
        ApiAccess.from_kubeconfig(kubeconfig)


def test_kwok_always_gets_the_explicit_stage_configuration(tmp_path: Path) -> None:
    argv = kwok_argv(binary=tmp_path / "kwok", kubeconfig=tmp_path / "kc", stages=STAGES_PATH)
    assert f"--config={STAGES_PATH}" in argv
    assert "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake" in argv


def test_stage_configuration_covers_every_transition_the_tests_need() -> None:
    """kwok v0.8.0 has no default stages: the file must name each one, once."""
    text = STAGES_PATH.read_text()
    assert re.findall(r"^  name: (\S+)$", text, re.MULTILINE) == STAGE_NAMES
    delete_stage = text.split("name: pod-delete", 1)[1]
    assert "expression: '.metadata.deletionTimestamp'" in delete_stage
    assert "jitter" not in delete_stage
