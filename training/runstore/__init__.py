"""Where a training run's artefacts live: the stack's durable run storage (endpoints
`runs`), named runs in it, and writes that leave either a whole file or none."""
