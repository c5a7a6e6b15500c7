"""How an evaluation run ends for the user: the report, or one clear message, and an exit code."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from infra.endpoints import Endpoints
from training import exit_status
from training.run.evaluation import EvalError, EvalOptions


def traceback_file(options: EvalOptions) -> Path:
    """Beside the report, unless that is in the checkpoint (the default): the user's
    checkpoint folder gets no files of ours but the report; the temp directory then."""
    report_dir = options.report_path.parent.resolve()
    if report_dir.is_relative_to(options.checkpoint.resolve()):
        return Path(tempfile.gettempdir()) / f"uerl-eval-traceback-{os.getpid()}.txt"
    return options.report_path.with_name("eval-traceback.txt")


def eval_and_report(endpoints: Endpoints, options: EvalOptions, *, prog: str) -> int:
    """Run the evaluation code path; print the report table and where the JSON went."""
    from training.run.evaluation import run_eval
    from training.run.failures import describe

    try:
        report = run_eval(endpoints, options)
    except KeyboardInterrupt:
        print(f"{prog}: aborted", file=sys.stderr)
        return exit_status.INTERRUPTED
    except EvalError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exit_status.FAILED
    except Exception as exc:
        message = describe(exc, traceback_file=traceback_file(options), what="evaluation")
        print(f"{prog}: {message}", file=sys.stderr)
        return exit_status.FAILED
    print(report.table(), flush=True)
    print(f"  report: {options.report_path}", flush=True)
    return exit_status.OK
