"""One `uerl train` run: endpoints source, preflight, discovery, the driver loop,
checkpoints, metrics, stop handling and failure messages."""
