"""A level-triggered controller runtime for asyncio, after client-go and controller-runtime."""
