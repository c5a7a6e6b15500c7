"""Asking the stack's games before training: are they there and speaking the protocol
(`checks`, the preflight), and what do they host (`discovery`), from the driver or, for
sidecar games only a worker pod can reach, from a task on a game's node
(`on_worker_node`)."""
