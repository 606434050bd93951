"""``python -m miles.utils.workers.reconcile``: the ``miles-reconcile`` command."""

from __future__ import annotations

from miles.utils.workers.reconcile import cli


def main() -> int:
    return cli.main()


if __name__ == "__main__":
    raise SystemExit(main())
