"""A level-triggered controller runtime for asyncio, ported from client-go and controller-runtime."""
