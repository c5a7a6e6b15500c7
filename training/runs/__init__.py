"""A stack's stored runs from this machine (`uerl runs`): listed and pulled from the runs
claim (through the Ray head pod, by the Kubernetes API) or straight from the bucket."""
