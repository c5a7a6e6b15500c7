"""Live rescale: games and env runners join and leave while a training runs.

Between two iterations the driver re-reads the endpoints (the file it was given, or
the ConfigMap mounted on the Ray head), plans which runners go and which game slots
need one (`plan`), admits new games once they answer with the run's spaces and a
Ray node has a free unit of the custom resource (`admission`), and applies the plan
with RLlib's own EnvRunnerGroup means (`runner_pool`). `Rescaler` ties it together
for the driver; `uerl local scale N` changes a local session's topology the same way
`pulumi up` changes a cluster's.
"""
