"""uerl infrastructure: topology spec, endpoints contract and the Pulumi program.

`infra.topology` and `infra.endpoints` import only pydantic, and `infra.contract`
nothing, so the training side can use them without Pulumi installed.
"""
