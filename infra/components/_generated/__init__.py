"""Code written by a generator, never by hand: `python -m infra.package.generate` writes
it again from `infra/topology/`, and tests/test_component_package.py checks it is
current."""
