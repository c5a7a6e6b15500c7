"""The RLlib side: the vector env over one game, the env runner, the algorithm config,
hyperparameters. Imports Ray, torch and gymnasium only in the modules that need them."""
