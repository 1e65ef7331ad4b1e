"""The live path around the pure detection core: the watching thread, store writes,
the hand-off to alerts, and ``analyze`` over a stored run."""
