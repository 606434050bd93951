"""Environment variables that steer the test environment (Go: envtest's KUBEBUILDER_* settings)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

KEEP_ENV = "MILES_K8S_KEEP"
KUBECONFIG_ENV = "MILES_K8S_KUBECONFIG"
REQUIRE_ENV = "MILES_K8S_REQUIRE"
BIN_DIR_ENV = "MILES_K8S_BIN_DIR"
NODE_ENV = "MILES_K8S_NODE"
NODE_CHOICES = ("auto", "real", "kwok")


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class EnvSettings:
    """`keep`: leave the environment up; `kubeconfig`: reuse that cluster; `require`: a missing
    prerequisite fails instead of skipping; `bin_dir`: override of the binary cache folder;
    `node`: where pods run, `real` (containerd + kubelet), `kwok`, or `auto` (the real node when
    its prerequisites are met, else KWOK, saying why)."""

    keep: bool = False
    kubeconfig: Path | None = None
    require: bool = False
    bin_dir: Path | None = None
    node: str = "auto"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EnvSettings:
        env = os.environ if environ is None else environ
        require_raw = env.get(REQUIRE_ENV)
        require = _flag(require_raw) if require_raw is not None else bool(env.get("CI"))
        kubeconfig = env.get(KUBECONFIG_ENV)
        bin_dir = env.get(BIN_DIR_ENV)
        node = (env.get(NODE_ENV) or "auto").strip().lower()
        if node not in NODE_CHOICES:
            raise ValueError(f"{NODE_ENV}={node!r}: expected one of {', '.join(NODE_CHOICES)}")
        return cls(
            keep=_flag(env.get(KEEP_ENV)),
            kubeconfig=Path(kubeconfig) if kubeconfig else None,
            require=require,
            bin_dir=Path(bin_dir) if bin_dir else None,
            node=node,
        )
