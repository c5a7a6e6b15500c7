"""Policy configurations: which policy each of a game's agents acts with.

`by_type` (Schola's convention, the default), `shared` and `independent`; the chosen one
travels with the game spec into the algorithm, the checkpoint, `uerl eval` and
`uerl export`, so a policy is always run the way it was trained.
"""
