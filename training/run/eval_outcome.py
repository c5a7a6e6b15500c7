"""How an evaluation run ends for the user: the report, or one clear message, and an exit code."""

from __future__ import annotations

import sys

from infra.endpoints import Endpoints
from training.run.evaluation import EvalError, EvalOptions


def eval_and_report(endpoints: Endpoints, options: EvalOptions, *, prog: str) -> int:
    """Run the evaluation code path; print the report table and where the JSON went."""
    from training.run.evaluation import run_eval
    from training.run.failures import describe

    try:
        report = run_eval(endpoints, options)
    except KeyboardInterrupt:
        print(f"{prog}: aborted", file=sys.stderr)
        return 130
    except EvalError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        traceback_file = options.report_path.with_name("eval-traceback.txt")
        print(f"{prog}: {describe(exc, traceback_file=traceback_file)}", file=sys.stderr)
        return 1
    print(report.table(), flush=True)
    print(f"  report: {options.report_path}", flush=True)
    return 0
