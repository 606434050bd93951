"""Controllers to copy: each runs with ``python -m`` and is a whole ``main()`` over the runtime."""
