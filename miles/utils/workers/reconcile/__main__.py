"""``python -m miles.utils.workers.reconcile``: the ``miles-reconcile`` command."""

from __future__ import annotations

import gc

from miles.utils.workers.reconcile import cli


def main() -> int:
    try:
        return cli.main()
    finally:
        # The process ends next: freezing the heap spares the collector a pass over every object
        # at interpreter shutdown, measured at 0.6-0.9 s of a Ctrl-C's 1 s budget (0.08 s frozen).
        gc.freeze()


if __name__ == "__main__":
    raise SystemExit(main())
