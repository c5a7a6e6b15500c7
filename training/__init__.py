"""uerl training package: Schola protocol client, RLlib env/env runner, discovery, driver, CLI.

Kept import-light: heavy dependencies (ray, torch, grpc) are imported by the
submodules that need them, never here.
"""
