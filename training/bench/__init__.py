"""The benchmarks behind `uerl bench` and its kin: what stepping, a runner, a game fault,
a policy configuration and self-play cost or give, printed as figures (never asserted)."""
