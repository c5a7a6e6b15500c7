"""Ray's token authentication, as uerl's clients of a stack's job API use it."""
