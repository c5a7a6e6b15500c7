"""`uerl submit`: a `uerl train` (or `uerl eval`) submitted from this machine as a Ray job
on a stack's cluster, reached through the Kubernetes API: the stack's endpoints, its Ray
head pod, a port-forward to the head's job API that follows the head when it is
replaced, and the job followed to its end."""
