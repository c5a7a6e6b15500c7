"""A seeded fault schedule for a supervised run on real pods, and a checker that holds the
run to its invariants the whole time it runs, not only at its end (test_pods_e2e.py).

- `Schedule`: each fault once, in an order drawn from a seed; each strikes once the run
  has shown `Fault.after` more iterations since the fault before it was over. The seed
  is UERL_FAULT_SEED's, else drawn: printed either way, so a failure can be replayed.
- The invariants, as pure functions of what was read: the stored run (`StoredRun`,
  read by `read_stored` through a pyarrow filesystem: the claim's volume as a local
  directory, or the bucket), the head's jobs of the run (`JobState`), the supervisor's
  log (`LogView`), the faults that struck (`Struck`) and, at the end, the supervisor's
  Job and its pods.
- `Checker`: two threads (the job API, the store) reading all of that every few seconds
  while the schedule runs, and at once after each fault,
  keeping each broken invariant once, with when it was first seen.

Nothing here reaches a cluster: the tier passes the readers in, and
tests/test_fault_schedule.py feeds the checks snapshots that break each invariant.
"""

from __future__ import annotations

import calendar
import contextlib
import csv
import io
import json
import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from run_events import event_lines, events  # tests/, on the path via its conftest

# ---- the stored run's layout, read here on its own ------------------------------------
# The names are the stored run's contract (docs/kubernetes.md; tests/test_fault_schedule.py
# checks them against the product's); the readers are the checker's own, not the
# product's, so that a fault in those cannot pass unseen.
CHECKPOINTS = "checkpoints"
LATEST = "latest"  # checkpoints/latest: the name of the checkpoint to resume
META = "uerl.json"  # a checkpoint's own record, written last: its iteration, its files
METRICS = "metrics.csv"
ATTEMPTS_FILE = "attempts.jsonl"
LEASE_DIR = "lease"  # lease/NNNNNNNNN.json, one file a generation
PARTIAL_PREFIX = ".partial-"  # a write in progress (a file or directory so named)
CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d{6,})$")


def iteration_of(name: str) -> int | None:
    """checkpoint_000012 -> 12; None for any other name."""
    found = CHECKPOINT_NAME.match(name)
    return int(found[1]) if found else None


def hidden(relative: str) -> bool:
    """A write in progress, or one a dead writer left: no reader may take it."""
    return any(part.startswith(PARTIAL_PREFIX) for part in relative.split("/"))


def lease_generation(relative: str) -> int | None:
    """lease/000000003.json -> 3; None for any other path."""
    found = re.fullmatch(rf"{LEASE_DIR}/(\d+)\.json", relative)
    return int(found[1]) if found else None


def read_checkpoint_meta(text: str) -> tuple[int | None, int | None]:
    """(iteration, env steps) a checkpoint's META says; Nones if it does not read."""
    try:
        meta = json.loads(text)
        return int(meta["iteration"]), int(meta["env_steps_total"])
    except (ValueError, KeyError, TypeError):
        return None, None


def holds_whole(
    name: str, meta_text: str | None, sizes: Mapping[str, int] | Collection[str]
) -> bool:
    """Checkpoint `name` is whole in `sizes` (each stored file's path in the run -> its
    bytes; or the paths only, sizes not known): its META reads and names its files, and
    each is stored (at that size). A checkpoint this uerl writes always names them: one
    without is not whole here."""
    if meta_text is None or read_checkpoint_meta(meta_text)[0] is None:
        return False
    try:
        files = json.loads(meta_text)["files"]
    except (ValueError, KeyError, TypeError):
        return False
    if not isinstance(files, dict) or not files:
        return False
    for relative, size in files.items():
        key = f"{CHECKPOINTS}/{name}/{relative}"
        if key not in sizes or (isinstance(sizes, Mapping) and sizes[key] != size):
            return False
    return True


SEED_VARIABLE = "UERL_FAULT_SEED"

# The faults, and what each does on the tier.
HEAD = "head"
HEAD_DURING_UPLOAD = "head-during-upload"
SUPERVISOR = "supervisor-pod"
LEARNER = "learner-pod"
WORKER = "worker-pod"
OPERATOR = "operator-pod"
STORE = "store-killed"
NEW_IMAGE = "new-image"
CONTENDER = "second-writer"
KINDS = {
    HEAD: "the Ray head pod force-deleted (--grace-period=0 --force)",
    HEAD_DURING_UPLOAD: "the store stopped once a checkpoint is stored, then the head pod "
    "force-deleted while the next checkpoint's upload hangs on it",
    SUPERVISOR: "the supervisor's own pod deleted",
    LEARNER: "the learner pod deleted",
    WORKER: "a worker pod deleted",
    OPERATOR: "the KubeRay operator's pod deleted",
    STORE: "the object store killed (SIGKILL), started again on its data 20 s later",
    NEW_IMAGE: "`pulumi up` with a new Ray image (every Ray pod recreated)",
    CONTENDER: "a second `uerl train` of the run started on the head while it trains",
}
# Faults that end the running attempt (its driver ran on the head, or its learner is
# gone): the supervisor submits the next, which resumes from the stored run.
ENDS_THE_ATTEMPT = frozenset({HEAD, HEAD_DURING_UPLOAD, LEARNER, NEW_IMAGE})

# Ray's job statuses of a job that holds the run (the supervisor submits the next attempt
# only once the last is over or gone).
ACTIVE = ("PENDING", "RUNNING")

# The invariants, as the checker names them.
LATEST_WHOLE = "latest names a whole checkpoint"
ONE_JOB = "at most one job of the run running"
METRICS_ONCE = "every iteration in metrics.csv once"
ATTEMPTS_APART = "attempts consecutive and never overlapping"
REDONE = "at most one checkpoint interval redone per fault (in a bucket two)"
RETENTION = "retention held"
NO_PARTIAL = "no write in progress stored"
LEASE_FENCED = "the lease's generations only grow, one holder each"
READ_GAPS = "no gap in the checker's reads of the store outside an outage of the schedule"
CHECKER = "the checker itself"


# ---- the schedule ---------------------------------------------------------------------


# A fault strikes this long (drawn from the seed) after the iteration it is due at: the
# moment within an iteration replays too, not only the order.
DELAY_S = (0.0, 2.0)


@dataclass(frozen=True)
class Fault:
    kind: str
    after: int  # iterations the run shows after the fault before is over (the first: its start)
    delay_s: float = 0.0  # then this long before it strikes


@dataclass(frozen=True)
class Schedule:
    seed: int
    faults: tuple[Fault, ...]

    def describe(self) -> str:
        steps = "; ".join(
            f"{index}. {fault.kind} after {fault.after} more iteration(s) and {fault.delay_s} s"
            for index, fault in enumerate(self.faults, 1)
        )
        return f"fault schedule, seed {self.seed} ({SEED_VARIABLE}={self.seed} replays it): {steps}"


def seed_from_environment(environ: Mapping[str, str] | None = None) -> int:
    """UERL_FAULT_SEED's seed (a failed run printed it), else a new one."""
    env = os.environ if environ is None else environ
    raw = env.get(SEED_VARIABLE, "").strip()
    if not raw:
        return random.SystemRandom().randrange(2**32)
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{SEED_VARIABLE}={raw!r}: give the integer seed a run printed") from None


def make_schedule(
    seed: int,
    kinds: Sequence[str],
    *,
    first: tuple[int, int],
    gap: tuple[int, int],
    salt: str = "",
) -> Schedule:
    """Each of `kinds` once, in an order drawn from `seed`; the first strikes after
    `first` iterations of the run (a range, both ends in), each next after `gap` more
    once the one before is over. `salt` (the run's name) gives two runs of one seed
    schedules of their own."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"no such fault: {', '.join(unknown)} (known: {', '.join(KINDS)})")
    rng = random.Random(f"{seed}:{salt}")  # a str seed: the same draw on every host
    order = list(kinds)
    rng.shuffle(order)
    afters = [rng.randint(*(first if index == 0 else gap)) for index in range(len(order))]
    delays = [round(rng.uniform(*DELAY_S), 1) for _ in order]
    return Schedule(seed, tuple(Fault(*drawn) for drawn in zip(order, afters, delays, strict=True)))


@dataclass(frozen=True)
class Struck:
    """A fault as it struck, read right before it did."""

    index: int  # its place in the schedule, from 1
    kind: str
    at_s: float  # since the checker started
    attempt: int  # the attempt the supervisor's log was showing
    lost_after: int  # the last iteration that attempt had shown
    stored_before: int | None  # the newest checkpoint stored whole (its iteration), as last read
    store_down: bool = False  # the store was stopped: what it had not taken is lost by design
    what: str = ""  # what it acted on (a pod's name, an image)

    def describe(self) -> str:
        down = "; the store stopped" if self.store_down else ""
        return (
            f"{self.index}. {self.kind} at {self.at_s:.1f} s, after iteration {self.lost_after} "
            f"of attempt {self.attempt} (newest whole checkpoint stored: iteration "
            f"{self.stored_before}{down}): {self.what}"
        )


# ---- the supervisor's log ---------------------------------------------------------------

# The run's events (tests/run_events.py): `attempt` (the supervisor's: the attempt whose
# log follows), `iteration` and `checkpoint_written` (the driver's).


def attempt_progress(log: str) -> list[tuple[int, int]]:
    """(attempt, iteration) of each `iteration` event of one supervisor pod's log, in
    order: the supervisor says which attempt it submits or follows before passing its
    log on."""
    pairs: list[tuple[int, int]] = []
    attempt = 0
    for _, event in event_lines(log):
        if event.get("event") == "attempt":
            attempt = int(event["attempt"])
        elif attempt and event.get("event") == "iteration":
            pairs.append((attempt, int(event["iteration"])))
    return pairs


def written_checkpoints(log: str) -> list[str]:
    """The checkpoints the driver said it wrote, in order."""
    return [str(event["checkpoint"]) for event in events(log, "checkpoint_written")]


@dataclass(frozen=True)
class LogView:
    """Every pod's log of the supervisor's Job, oldest pod first: a replaced pod's log is
    kept (its replacement's begins with its own start, and passes the running attempt's
    log on again from its beginning)."""

    pods: tuple[tuple[str, str], ...] = ()  # (pod name, its log)

    @cached_property
    def text(self) -> str:
        return "\n".join(log for _, log in self.pods)

    @cached_property
    def pod_pairs(self) -> dict[str, frozenset[tuple[int, int]]]:
        return {pod: frozenset(attempt_progress(log)) for pod, log in self.pods}

    @cached_property
    def pairs(self) -> frozenset[tuple[int, int]]:
        """(attempt, iteration) shown by any pod, each once."""
        return frozenset().union(*self.pod_pairs.values())

    @cached_property
    def attempt(self) -> int:
        """The newest attempt the log names (0: none yet)."""
        said = [int(event["attempt"]) for event in events(self.text, "attempt")]
        return max([*said, *(attempt for attempt, _ in self.pairs)], default=0)

    def last_shown(self) -> dict[int, int]:
        """Each attempt's last iteration shown."""
        out: dict[int, int] = {}
        for attempt, iteration in self.pairs:
            out[attempt] = max(out.get(attempt, 0), iteration)
        return out

    @property
    def last_iteration(self) -> int:
        """The newest attempt's last iteration shown (0: none yet)."""
        return self.last_shown().get(self.attempt, 0)

    @property
    def last_line(self) -> str:
        """The last `iteration` event's line of the log (a marker: what follows it came
        later)."""
        lines = event_lines(self.text, "iteration")
        return lines[-1][0] if lines else ""


class SupervisorLogs:
    """The supervisor Job's pod logs, each kept as last read: a deleted pod's log goes
    with it. Safe to refresh from the schedule's thread and the checker's at once."""

    def __init__(
        self, pods: Callable[[], Sequence[str]], log_of: Callable[[str], str | None]
    ) -> None:
        self._pods = pods  # the Job's pods, oldest first
        self._log_of = log_of  # a pod's log; None if it cannot be read (gone)
        self._texts: dict[str, str] = {}  # in the order first seen
        self._lock = threading.Lock()

    def refresh(self) -> LogView:
        try:
            names = list(self._pods())
        except Exception:  # the API server busy for a moment: what was read stands
            names = []
        fetched: dict[str, str] = {}
        for name in names:
            try:
                text = self._log_of(name)
            except Exception:
                text = None
            if text is not None:
                fetched[name] = text
        with self._lock:
            for name, text in fetched.items():
                if len(text) >= len(self._texts.get(name, "")):  # a log only grows
                    self._texts[name] = text
            return LogView(tuple(self._texts.items()))

    def view(self) -> LogView:
        with self._lock:
            return LogView(tuple(self._texts.items()))


# ---- the stored run ---------------------------------------------------------------------


@dataclass(frozen=True)
class StoredRun:
    """What the store held of the run at one moment."""

    files: frozenset[str] = frozenset()  # every file's path in the run, hidden ones too
    latest: str | None = None  # what checkpoints/latest says
    latest_meta: str | None = None  # the uerl.json of the checkpoint it names; None: absent
    metrics: tuple[int, ...] | None = None  # metrics.csv's rows' iterations; None: no file
    attempts: tuple[dict[str, Any], ...] = ()  # attempts.jsonl's entries
    # Each file's bytes, as listed (None: not known, `files` only): a checkpoint is whole
    # when each file its uerl.json names is stored at its size (listing.holds_whole).
    sizes: Mapping[str, int] | None = None
    # The run's lease files' texts by generation (training.runstore.lease), as read.
    leases: Mapping[int, str | None] = field(default_factory=dict)

    def checkpoints(self) -> dict[str, bool]:
        """Each checkpoint with a file stored, and whether it is whole (its uerl.json,
        stored after its other files, is there)."""
        out: dict[str, bool] = {}
        for relative in self.files:
            parts = relative.split("/")
            if len(parts) < 3 or parts[0] != CHECKPOINTS or iteration_of(parts[1]) is None:
                continue
            out[parts[1]] = out.get(parts[1], False) or (len(parts) == 3 and parts[2] == META)
        return out

    def latest_iteration(self) -> int | None:
        """The iteration of the checkpoint `latest` names, when it is whole."""
        if self.latest is None or latest_problems(self):
            return None
        return iteration_of(self.latest)


def metrics_iterations(text: str) -> tuple[int, ...]:
    """The iteration of each row of metrics.csv's text (-1 for a row that has none)."""
    out = []
    for row in csv.DictReader(io.StringIO(text)):
        try:
            out.append(int(float(row["iteration"])))
        except (KeyError, TypeError, ValueError):
            out.append(-1)
    return tuple(out)


def parse_attempts(text: str) -> tuple[dict[str, Any], ...]:
    """attempts.jsonl's entries; a line that does not read is kept as {"line": ...}."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        out.append(entry if isinstance(entry, dict) else {"line": line})
    return tuple(out)


def read_stored(filesystem: Any, root: str) -> StoredRun:
    """The run under `root` in `filesystem` (pyarrow's: a local directory or a bucket).
    `latest` is read first: the checkpoint it names was stored before it, so the listing
    taken after holds it. OSError when the store does not answer."""
    from pyarrow import fs

    root = root.rstrip("/")

    def text(relative: str) -> str | None:
        try:
            with filesystem.open_input_stream(f"{root}/{relative}") as stream:
                return str(stream.read().decode(errors="replace"))
        except FileNotFoundError:
            return None

    latest = (text(f"{CHECKPOINTS}/{LATEST}") or "").strip() or None
    selector = fs.FileSelector(root, recursive=True, allow_not_found=True)
    sizes = {
        info.path[len(root) + 1 :]: info.size or 0
        for info in filesystem.get_file_info(selector)
        if info.type == fs.FileType.File
    }
    metrics = text(METRICS)
    leases = {
        generation: text(relative)
        for relative in sizes
        if (generation := lease_generation(relative)) is not None
    }
    return StoredRun(
        files=frozenset(sizes),
        sizes=sizes,
        leases=leases,
        latest=latest,
        latest_meta=text(f"{CHECKPOINTS}/{latest}/{META}") if latest else None,
        metrics=None if metrics is None else metrics_iterations(metrics),
        attempts=parse_attempts(text(ATTEMPTS_FILE) or ""),
    )


# ---- the invariants: each a list of what breaks it ---------------------------------


def latest_problems(stored: StoredRun) -> list[str]:
    """`checkpoints/latest` names a checkpoint stored whole (its uerl.json there, and
    saying that checkpoint's iteration); no `latest` yet is no problem."""
    name = stored.latest
    if name is None:
        return []
    if iteration_of(name) is None:
        return [f"checkpoints/latest says {name!r}, not a checkpoint's name"]
    if f"{CHECKPOINTS}/{name}/{META}" not in stored.files or stored.latest_meta is None:
        return [f"checkpoints/latest names {name}, whose {META} the store does not hold"]
    iteration, _ = read_checkpoint_meta(stored.latest_meta)
    if iteration is None:
        return [f"checkpoints/latest names {name}, whose {META} does not read"]
    if iteration != iteration_of(name):
        return [f"checkpoints/latest names {name}, whose {META} says iteration {iteration}"]
    # Whole: every file its uerl.json names, at its size (the checker's own reading).
    if not holds_whole(
        name, stored.latest_meta, stored.sizes if stored.sizes is not None else stored.files
    ):
        return [f"checkpoints/latest names {name}, a file of which the store does not hold whole"]
    return []


def lease_problems(stored: StoredRun, holders: dict[int, str], newest: int) -> list[str]:
    """The run's lease as the fence needs it: its newest generation never below one seen
    before (`newest`), each generation's file naming its own number and keeping the
    holder it was first seen with (`holders`, updated here)."""
    problems = []
    if stored.leases and max(stored.leases) < newest:
        problems.append(
            f"the lease's newest generation is {max(stored.leases)}, after {newest} was seen"
        )
    for generation, text in sorted(stored.leases.items()):
        try:
            record = json.loads(text or "")
        except ValueError:
            continue  # read mid-creation (a volume without hard links): the next round
        if not isinstance(record, dict):
            continue
        if record.get("generation") != generation:
            problems.append(f"lease {generation}'s file says generation {record.get('generation')}")
        holder = str(record.get("holder"))
        if holders.setdefault(generation, holder) != holder:
            problems.append(
                f"lease {generation} was held by {holders[generation]}, then by {holder}"
            )
    return problems


def newest_kept_problems(stored: StoredRun, ever_whole: set[str], keep: int | None) -> list[str]:
    """Retention keeps the newest `keep` checkpoints: of those seen stored whole (in
    `ever_whole`, updated here) up to the one `latest` names, none of the newest `keep`
    is gone."""
    whole = {name for name, is_whole in stored.checkpoints().items() if is_whole}
    ever_whole |= whole
    if keep is None or stored.latest is None:
        return []
    upto = sorted(name for name in ever_whole if name <= stored.latest)[-keep:]
    return [f"{name}, among the newest {keep}, is gone" for name in upto if name not in whole]


def metrics_problems(iterations: Sequence[int] | None) -> list[str]:
    """metrics.csv holds each iteration once, consecutive from 1."""
    if iterations is None:
        return []
    problems = [
        f"metrics.csv holds iteration {iteration} {count} times"
        for iteration, count in sorted(Counter(iterations).items())
        if count > 1
    ]
    for row, iteration in enumerate(iterations, 1):
        if iteration != row:
            problems.append(f"metrics.csv's row {row} is iteration {iteration}, not {row}")
            break  # the first one says it
    return problems


def _epoch(started: Any) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(str(started), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def attempts_problems(
    entries: Sequence[Mapping[str, Any]], last_running: Mapping[str, float], run: str
) -> list[str]:
    """attempts.jsonl numbers its attempts 1..n, each starting after the one before:
    not before it started, not while its job was still seen RUNNING (`last_running`:
    when each job of the run was last seen RUNNING, seconds since the epoch), and not
    from an older checkpoint than it resumed from."""
    problems = []
    for line, entry in enumerate(entries, 1):
        attempt = entry.get("attempt")
        if attempt != line:
            problems.append(f"attempts.jsonl's line {line} is attempt {attempt!r}, not {line}")
            break  # the numbering is off from here: the rest compares nothing
        if line == 1:
            continue
        previous = entries[line - 2]
        started, before = _epoch(entry.get("started")), _epoch(previous.get("started"))
        if started is None:
            problems.append(f"attempt {line}'s start {entry.get('started')!r} does not read")
            continue
        if before is not None and started < before:
            problems.append(
                f"attempt {line} started ({entry['started']}) before attempt {line - 1} did "
                f"({previous['started']})"
            )
        job = f"uerl-{run}-{line - 1}"
        # `started` is cut to the second: only a start a whole second before the job was
        # seen RUNNING certainly overlaps it.
        seen = last_running.get(job)
        if seen is not None and started + 1 <= seen:
            problems.append(
                f"attempt {line} started ({entry['started']}) while job {job} was still RUNNING"
            )
        resumed, earlier = entry.get("iteration") or 0, previous.get("iteration") or 0
        if resumed < earlier:
            problems.append(
                f"attempt {line} resumed from iteration {resumed}, older than attempt "
                f"{line - 1}'s {earlier}"
            )
    return problems


@dataclass(frozen=True)
class JobState:
    """A job on the head, as its job API lists it."""

    submission_id: str
    status: str
    metadata: Mapping[str, str] = field(default_factory=dict)


def is_attempt(job: JobState, run: str) -> bool:
    """One of the run's attempts (`uerl-RUN-N`: not its record jobs, not another run's)."""
    return re.fullmatch(rf"uerl-{re.escape(run)}-\d+", job.submission_id) is not None


def one_job_problems(jobs: Collection[JobState], run: str) -> list[str]:
    """At most one of the run's jobs holds it (PENDING or RUNNING) at once."""
    active = sorted(
        f"{job.submission_id} {job.status}"
        for job in jobs
        if is_attempt(job, run) and job.status in ACTIVE
    )
    if len(active) > 1:
        return [f"{len(active)} jobs of run {run} at once: {', '.join(active)}"]
    return []


def redone_problems(
    entries: Sequence[Mapping[str, Any]],
    faults: Sequence[Struck],
    last_shown: Mapping[int, int],
    bound: int,
) -> list[str]:
    """Each attempt after the first follows a fault that ended the one before (the k-th
    such fault, attempt k+1), and resumed from no older a checkpoint than the store held
    whole when it struck; with the store up, at most `bound` of the lost attempt's
    iterations are done again (a claim: one checkpoint interval; a bucket: two, as the
    checkpoint on its way to it when the head went is lost too). What the lost attempt showed: the
    later of the iteration read right before the fault and its log's last (both as the
    supervisor's log shows them, a second or two behind the driver)."""
    ending = [fault for fault in faults if fault.kind in ENDS_THE_ATTEMPT]
    problems = []
    for entry in entries[1:]:
        attempt = entry.get("attempt")
        if not isinstance(attempt, int) or attempt < 2:
            continue  # attempts_problems says so
        if attempt - 2 >= len(ending):
            problems.append(
                f"attempt {attempt} began ({entry.get('reason')!r}) with no fault to end "
                f"attempt {attempt - 1}"
            )
            continue
        fault = ending[attempt - 2]
        resumed = entry.get("iteration") or 0
        lost = max(fault.lost_after, last_shown.get(attempt - 1, 0))
        if fault.stored_before is not None and resumed < fault.stored_before:
            problems.append(
                f"attempt {attempt} resumed from iteration {resumed}, older than the "
                f"checkpoint of iteration {fault.stored_before} stored whole when fault "
                f"{fault.index} ({fault.kind}) struck"
            )
        if not fault.store_down and lost - resumed > bound:
            problems.append(
                f"attempt {attempt} did {lost - resumed} iterations again after fault "
                f"{fault.index} ({fault.kind}): attempt {attempt - 1} showed iteration "
                f"{lost}, the next resumed from {resumed} (at most {bound} redone)"
            )
    return problems


def retention_excess(stored: StoredRun, keep: int | None) -> list[str]:
    """The checkpoints stored when there are more than retention keeps: the newest `keep`,
    the best, and one in progress (stored, the oldest not deleted yet); [] otherwise."""
    names = sorted(stored.checkpoints())
    if keep is None or len(names) <= keep + 2:
        return []
    return names


def partial_files(stored: StoredRun) -> list[str]:
    """Files of a write in progress (`.partial-...`): a store readers take from (a bucket)
    never holds one; on a claim they are its writer's, renamed into place when whole."""
    return sorted(relative for relative in stored.files if hidden(relative))


def supervisor_end_problems(
    status: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], deleted: Collection[str]
) -> list[str]:
    """The supervisor's Job ended Complete, with exactly one pod that Succeeded, and no
    pod that failed but those the schedule deleted (`deleted`: their uids): a failed
    supervisor run again would pass `succeeded == 1` too. (A pod deleted is counted
    failed by the Job; it may be gone from the list by now.)"""
    problems = []
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    if conditions.get("Complete") != "True":
        problems.append(f"the Job did not complete: its conditions are {conditions}")
    succeeded, failed = int(status.get("succeeded") or 0), int(status.get("failed") or 0)
    if succeeded != 1:
        problems.append(f"{succeeded} of the Job's pods succeeded, not 1")
    if failed > len(deleted):
        problems.append(
            f"{failed} of the Job's pods failed and the schedule deleted {len(deleted)}: a "
            "supervisor failed and was run again"
        )
    phases = [(p["metadata"]["name"], p["metadata"].get("uid"), p["status"]["phase"]) for p in pods]
    done = [name for name, _, phase in phases if phase == "Succeeded"]
    if len(done) != 1:
        problems.append(f"pods Succeeded: {done}, not exactly one")
    problems += [
        f"pod {name} {phase}: not one the schedule deleted"
        for name, uid, phase in phases
        if phase != "Succeeded" and uid not in deleted
    ]
    return problems


# ---- the checker --------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    at_s: float  # since the checker started
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.at_s:7.1f} s  [{self.invariant}] {self.detail}"


class Checker:
    """Beside a supervised run, every `interval_s` (and at once when woken): the stored
    run, the head's jobs of the run and the supervisor's log read and checked, the job
    API and the store each on a thread of its own (a hung request to a head delays no
    read of the store; a gap in those over `gap_limit_s` outside an outage is reported);
    each broken invariant kept once with when it was first seen (and printed then). A
    reader that fails (a store stopped on purpose, no head) skips its checks for that
    round. Two invariants need time to tell:
    retention, over its limit for `settle_s` of rounds that read the store (a round
    after an outage uploads what waited, then deletes the oldest); and the job API,
    unanswered for `unanswered_limit_s` while a head is Running and Ready (the one-job
    invariant would go unchecked)."""

    def __init__(
        self,
        run: str,
        *,
        keep: int | None,
        checkpoint_every: int,
        read_store: Callable[[], StoredRun],
        read_jobs: Callable[[], Sequence[JobState]],
        head_ready: Callable[[], bool],
        logs: Callable[[], LogView],
        interval_s: float,
        settle_s: float,
        unanswered_limit_s: float,
        partials_allowed: bool,
        redo_bound: int | None = None,
        gap_limit_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.run = run
        self.keep = keep
        self.every = checkpoint_every
        # Iterations a fault that ended an attempt may have done again (REDONE).
        self.redo_bound = checkpoint_every if redo_bound is None else redo_bound
        self.read_store = read_store
        self.read_jobs = read_jobs
        self.head_ready = head_ready
        self.logs = logs
        self.interval_s = interval_s
        self.settle_s = settle_s
        self.unanswered_limit_s = unanswered_limit_s
        self.partials_allowed = partials_allowed  # a claim: its writer's own partial writes
        self.clock = clock
        self.wall = wall
        self.started = clock()
        self.violations: list[Violation] = []
        self.counts: Counter[str] = Counter()
        self.last_stored: StoredRun | None = None
        self.most_checkpoints = 0
        self._seen: set[tuple[str, str]] = set()
        self._struck: list[Struck] = []
        self._last_running: dict[str, float] = {}  # job -> when last seen RUNNING (epoch s)
        self._latest_seen = False
        self._lease_holders: dict[int, str] = {}  # generation -> its holder, as first seen
        self._newest_lease = 0
        self._ever_whole: set[str] = set()  # checkpoints seen stored whole
        # Successive reads of the store further apart than this, with no outage of the
        # schedule's between them, are a gap the checker saw nothing in (READ_GAPS).
        self.gap_limit_s = gap_limit_s
        self._last_read_at: float | None = None
        self.longest_gap_s = 0.0
        self._outages: list[tuple[float, float | None]] = []  # (start, end: None while on)
        # The job API and the store are read on threads of their own: a request to a
        # head that hangs delays no read of the store (READ_GAPS).
        self._wakes = {"jobs": threading.Event(), "store": threading.Event()}
        self._gone_last_round: set[str] = set()
        self._over_since: float | None = None  # retention over its limit since
        self._unanswered_since: float | None = None  # the job API, with a head ready
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def elapsed(self) -> float:
        return self.clock() - self.started

    def struck(self, fault: Struck) -> None:
        """A fault, before it acts: the attempt it ends is accounted for by it."""
        with self._lock:
            self._struck.append(fault)

    def stored_iteration(self) -> int | None:
        """The newest checkpoint stored whole, as last read (a lower bound: it only grows)."""
        stored = self.last_stored
        return None if stored is None else stored.latest_iteration()

    @contextlib.contextmanager
    def store_outage(self) -> Iterator[None]:
        """Around a fault that takes the store away (stopped, killed): reads then fail by
        design, and a gap in them over the outage is no gap of the checker's."""
        with self._lock:
            self._outages.append((self.clock(), None))
            index = len(self._outages) - 1
        try:
            yield
        finally:
            with self._lock:
                self._outages[index] = (self._outages[index][0], self.clock())

    def store_changed(self) -> None:
        """The store says the run's `latest` changed (store_changes.py): a round of the
        store's checks now, so that each change is checked, not a sample of them."""
        with self._lock:
            self.counts["latest changes seen"] += 1
        self._wakes["store"].set()

    def wake(self) -> None:
        """A round now, not at the next interval (right after a fault has acted)."""
        for wake in self._wakes.values():
            wake.set()

    def _gap_problem(self, start: float, end: float) -> str | None:
        """The gap between two reads of the store, said, if it is over the limit and no
        outage overlaps it."""
        gap = end - start
        self.longest_gap_s = max(self.longest_gap_s, gap)
        if self.gap_limit_s is None or gap <= self.gap_limit_s:
            return None
        with self._lock:
            outages = list(self._outages)
        if any(o_start <= end and (o_end is None or o_end >= start) for o_start, o_end in outages):
            return None
        return (
            f"no read of the store for {gap:.0f} s ({start - self.started:.0f} s to "
            f"{end - self.started:.0f} s), outside any outage of the schedule (limit "
            f"{self.gap_limit_s:.0f} s): what changed then went unchecked"
        )

    def start(self) -> None:
        self.started = self.clock()
        parts = {"jobs": self._check_jobs, "store": self._check_store}
        self._threads = [
            threading.Thread(
                target=self._loop, args=(parts[name], wake), name=f"uerl-checker-{name}",
                daemon=True,
            )
            for name, wake in self._wakes.items()
        ]  # fmt: skip
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float, *, final: bool = True) -> list[Violation]:
        """Stops the thread (a round in progress ends first, within `timeout_s`), then,
        with `final`, checks once more: the end state."""
        self._stop.set()
        self.wake()
        deadline = self.clock() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - self.clock()))
            if thread.is_alive():
                self._violate(
                    CHECKER, f"{thread.name}: a round did not end within {timeout_s:.0f} s"
                )
        if final:
            self._round()
        return list(self.violations)

    def _loop(self, part: Callable[[], None], wake: threading.Event) -> None:
        while True:
            self._round(part)
            wake.wait(self.interval_s)
            wake.clear()
            if self._stop.is_set():
                return

    def _round(self, part: Callable[[], None] | None = None) -> None:
        try:
            (part or self.check_once)()
        except Exception as exc:  # a fault of the checker's own: it must not pass unseen
            self._violate(CHECKER, f"{type(exc).__name__}: {exc}")

    def _violate(self, invariant: str, detail: str) -> None:
        with self._lock:
            if (invariant, detail) in self._seen:
                return
            self._seen.add((invariant, detail))
            found = Violation(round(self.elapsed(), 1), invariant, detail)
            self.violations.append(found)
        print(f"invariant broken: {found}", flush=True)

    def check_once(self) -> None:
        self._check_jobs()
        self._check_store()

    def _check_jobs(self) -> None:
        asked = self.wall()  # a job seen RUNNING was so at some moment after this
        try:
            jobs = list(self.read_jobs())
        except Exception:
            self.counts["job API unanswered"] += 1
            try:
                ready = self.head_ready()
            except Exception:
                ready = False  # cannot tell: no head taken
            if not ready:
                self._unanswered_since = None
            elif self._unanswered_since is None:
                self._unanswered_since = self.clock()
            elif self.clock() - self._unanswered_since > self.unanswered_limit_s:
                self._violate(
                    ONE_JOB,
                    f"the job API went unanswered over {self.unanswered_limit_s:.0f} s while a "
                    "Ray head was Running and Ready: the run's jobs went unchecked",
                )
            return
        self._unanswered_since = None
        self.counts["job API answered"] += 1
        for problem in one_job_problems(jobs, self.run):
            self._violate(ONE_JOB, problem)
        with self._lock:
            for job in jobs:
                if is_attempt(job, self.run) and job.status == "RUNNING":
                    self._last_running[job.submission_id] = asked

    def _check_store(self) -> None:
        try:
            stored = self.read_store()
        except Exception:  # stopped on purpose, or a file renamed while listed
            self.counts["store unread"] += 1
            self._over_since = None  # its limit counts rounds that read it
            return
        self.counts["store read"] += 1
        now = self.clock()
        if self._last_read_at is not None:
            problem = self._gap_problem(self._last_read_at, now)
            if problem is not None:
                self._violate(READ_GAPS, problem)
        self._last_read_at = now
        view = self.logs()
        with self._lock:
            faults, running = list(self._struck), dict(self._last_running)
        if stored.latest is not None:
            self._latest_seen = True
        elif self._latest_seen:
            self._violate(LATEST_WHOLE, "checkpoints/latest is gone after it was stored")
        for problem in latest_problems(stored):
            self._violate(LATEST_WHOLE, problem)
        for problem in metrics_problems(stored.metrics):
            self._violate(METRICS_ONCE, problem)
        for problem in attempts_problems(stored.attempts, running, self.run):
            self._violate(ATTEMPTS_APART, problem)
        for problem in redone_problems(stored.attempts, faults, view.last_shown(), self.redo_bound):
            self._violate(REDONE, problem)
        if not self.partials_allowed:
            for relative in partial_files(stored):
                self._violate(NO_PARTIAL, f"the store holds {relative}, a write in progress")
        for problem in lease_problems(stored, self._lease_holders, self._newest_lease):
            self._violate(LEASE_FENCED, problem)
        self._newest_lease = max([self._newest_lease, *stored.leases])
        # Gone two rounds running: a checkpoint saved again under its name (a redone
        # iteration) is renamed over the old one, missing for a moment on a claim.
        gone = set(newest_kept_problems(stored, self._ever_whole, self.keep))
        for problem in sorted(gone & self._gone_last_round):
            self._violate(RETENTION, problem)
        self._gone_last_round = gone
        self._check_retention(stored)
        self.most_checkpoints = max(self.most_checkpoints, len(stored.checkpoints()))
        self.last_stored = stored

    def _check_retention(self, stored: StoredRun) -> None:
        excess = retention_excess(stored, self.keep)
        if not excess:
            self._over_since = None
            return
        now = self.clock()
        if self._over_since is None:
            self._over_since = now
        elif now - self._over_since >= self.settle_s:
            self._violate(
                RETENTION,
                f"{len(excess)} checkpoints stored for over {self.settle_s:.0f} s "
                f"({excess[0]} .. {excess[-1]}): retention keeps {self.keep}, the best and "
                "one in progress",
            )
