"""One module per `uerl` subcommand, each exposing `main(argv) -> int`."""
