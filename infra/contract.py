"""The constants training and infra agree on at run time, beside the endpoints object.

The Ray head's ports, the grace a stopping job is given, the supervisor's app label and
where Ray's token is read: what `uerl train`, `uerl submit` and the head's preStop hook
need without reading a topology. Imports nothing.
"""

# KubeRay's head Service ports (fixed by the operator).
GCS_PORT = 6379
CLIENT_PORT = 10001
DASHBOARD_PORT = 8265
# How long Ray gives a job after `ray job stop`'s SIGTERM before it SIGKILLs it (Ray's
# default is 3 s): `uerl train` finishes its iteration and writes a final checkpoint,
# which on a loaded cluster takes longer than that. Set on the Ray head.
JOB_STOP_GRACE_S = 120
JOB_STOP_GRACE_ENV = "RAY_JOB_STOP_WAIT_TIME_S"
# The pods of `uerl submit --supervise` (`uerl supervise`, keeping a run going across a
# lost head) carry this app name and the stack's instance label; the stack's
# NetworkPolicies let them reach the head's job API, nothing else.
SUPERVISOR_APP = "uerl-supervisor"
# Ray's token authentication (Ray >= 2.52, KubeRay >= 1.5): the variable every Ray
# process and client reads the token from, and the Secret's key KubeRay reads it under.
RAY_AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"
RAY_AUTH_TOKEN_KEY = "auth_token"
