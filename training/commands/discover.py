"""`uerl discover HOST:PORT [--json]`: print a game's environments, agents, spaces and policies."""

from __future__ import annotations

import argparse
import sys

from training import exit_status
from training.commands.arg_types import positive_float


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="uerl discover",
        description="Connect to a Schola game once, print its training definition, disconnect.",
    )
    parser.add_argument("endpoint", help="HOST:PORT of the game")
    parser.add_argument("--json", action="store_true", help="print the GameSpec as JSON")
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=45.0,
        help="seconds to wait for the game (default 45)",
    )
    parser.add_argument("--tls-ca", help="CA bundle (PEM): use TLS")
    parser.add_argument("--tls-cert", help="client certificate (PEM), with --tls-key")
    parser.add_argument("--tls-key", help="client key (PEM), with --tls-cert")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from training.preflight.discovery import discover
    from training.protocol.errors import UEError
    from training.tls.config import TLSConfig

    try:
        tls = None
        if args.tls_ca or args.tls_cert or args.tls_key:
            tls = TLSConfig(args.tls_ca, args.tls_cert, args.tls_key)
        game = discover(args.endpoint, timeout_s=args.timeout, tls=tls)
    except ValueError as exc:  # unreadable or mismatched TLS files: named in the message
        print(f"uerl discover: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    except UEError as exc:
        print(f"uerl discover: {exc}", file=sys.stderr)
        return exit_status.FAILED
    if args.json:
        print(game.to_json())
        return exit_status.OK
    print(f"game at {args.endpoint}: {game.num_envs} environment(s), {len(game.agents)} agent(s)")
    mapping = game.policy_mapping()
    for aid, spec in sorted(game.agents.items()):
        print(f"  agent {aid!r} type={spec.agent_type!r} policy={mapping[aid]!r}")
        print(f"    observation: {spec.observation_space}")
        print(f"    action:      {spec.action_space}")
    print(f"policies: {', '.join(game.policy_ids())}")
    return exit_status.OK
