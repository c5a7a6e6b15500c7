"""`uerl tls-secret`: a CA and the games' certificate for a stack's `simulator.tls`.

Writes `ca.crt`, `tls.crt` and `tls.key` for the names the stack's env runners dial
(`localhost` in the sidecar pattern, `*.<name>-ue.<namespace>.svc.cluster.local`
networked) and prints the `kubectl` command that makes the Secret. A throwaway CA for
dev and test clusters; production clusters issue the same three files from their own
CA (cert-manager: a Certificate with usages server auth and client auth).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from training import exit_status
from training.commands.arg_types import positive_float
from training.commands.writable import check_writable_dir

PROG = "uerl tls-secret"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--stack", default="dev", help="read uerl:topology from Pulumi.STACK.yaml")
    source.add_argument("--topology", type=Path, metavar="FILE", help="topology YAML/JSON")
    parser.add_argument(
        "--set", action="append", default=[], metavar="PATH=VALUE", help="as `uerl render --set`"
    )
    parser.add_argument("--out", type=Path, required=True, help="directory for the three files")
    parser.add_argument("--days", type=positive_float, default=365, help="validity (default 365)")
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    from training.local.local_topology import StackConfigError, load_topology
    from training.tls import certificates

    try:
        topology = load_topology(
            stack=None if args.topology else args.stack, topology_file=args.topology, sets=args.set
        )
    except StackConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    if args.days <= 0:
        print(f"{PROG}: --days must be positive, not {args.days:g}", file=sys.stderr)
        return exit_status.BAD_INPUT
    try:
        check_writable_dir(args.out, "--out")
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    for name in (certificates.CA_FILE, certificates.CERT_FILE, certificates.KEY_FILE):
        if (args.out / name).exists():
            print(f"{PROG}: {args.out / name} exists; not overwriting it", file=sys.stderr)
            return exit_status.FAILED
    hosts = topology.game_tls_hosts
    files = certificates.issue(args.out, hosts, days=args.days)
    secret = topology.simulator.tls.secret if topology.simulator.tls else "uerl-game-tls"
    print(f"wrote {files.ca}, {files.cert}, {files.key} (for {', '.join(hosts)})")
    print("create the Secret in the stack's namespace:")
    command = [
        "kubectl",
        "-n",
        topology.namespace,
        "create",
        "secret",
        "generic",
        secret,
        *(f"--from-file={path}" for path in (files.ca, files.cert, files.key)),
    ]
    print("  " + shlex.join(command))
    if topology.simulator.tls is None:
        print(f"then: pulumi config set --path topology.simulator.tls.secret {secret}")
    return exit_status.OK
