"""`uerl mock-ue`: serve Schola's GymService for N copies of a gymnasium environment."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from training import exit_status
from training.commands.arg_types import non_negative_float, port_or_any, positive_int


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="uerl mock-ue",
        description="Serve Schola's GymService for gymnasium environments (a stand-in UE game).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=port_or_any, default=50051, help="port (0 = any free port)")
    parser.add_argument(
        "--envs", type=positive_int, default=1, help="environments hosted (default 1)"
    )
    parser.add_argument(
        "--env",
        default="CartPole-v1",
        help="CartPole-v1 (default), Pendulum-v1, uerl/TwoTeams-v0, uerl/Sumo-v0 (two players, "
        "zero-sum), uerl/Relay-v0 (two players, one shared reward) or any gymnasium id",
    )
    parser.add_argument("--stats-file", type=Path, help="write session/step counters here on exit")
    parser.add_argument("--tls-cert", help="serve TLS with this certificate (PEM), with --tls-key")
    parser.add_argument("--tls-key", help="private key (PEM) for --tls-cert")
    parser.add_argument(
        "--tls-client-ca", help="mutual TLS: accept only clients whose certificate this CA signed"
    )
    parser.add_argument(
        "--transport",
        choices=("grpcio", "native"),
        default="grpcio",
        help="serve with gRPC Python (default) or uerl's compiled server (plaintext only)",
    )
    parser.add_argument(
        "--step-delay", type=non_negative_float, default=0.0, help=argparse.SUPPRESS
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from training.clients.grpc_tuning import apply_low_latency_defaults

    apply_low_latency_defaults()  # before grpc loads
    from training.mock_ue import MockUEServer  # grpc/gymnasium only when actually serving

    if (args.tls_cert is None) != (args.tls_key is None):
        print("mock-ue: --tls-cert and --tls-key go together", file=sys.stderr)
        return exit_status.BAD_INPUT
    if args.tls_client_ca is not None and args.tls_cert is None:
        print("mock-ue: --tls-client-ca (mutual TLS) needs --tls-cert, --tls-key", file=sys.stderr)
        return exit_status.BAD_INPUT
    try:
        server = MockUEServer(
            args.host,
            args.port,
            args.env,
            args.envs,
            step_delay_s=args.step_delay,
            tls_cert_path=args.tls_cert,
            tls_key_path=args.tls_key,
            tls_client_ca_path=args.tls_client_ca,
            transport=args.transport,
        )
        port = server.start()
    except (OSError, ValueError) as exc:
        print(f"mock-ue: {exc}", file=sys.stderr)
        return exit_status.FAILED
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    tls = "mutual TLS" if args.tls_client_ca else "TLS" if args.tls_cert else "plaintext"
    print(f"mock-ue listening on {args.host}:{port} ({args.env} x{args.envs}, {tls})", flush=True)
    while not stop.wait(0.5):
        pass
    server.stop(grace=1.0)
    stats = server.stats.to_dict()
    if args.stats_file is not None:
        args.stats_file.write_text(json.dumps(stats))
    print(f"mock-ue stopped: {json.dumps(stats)}", flush=True)
    return 0
