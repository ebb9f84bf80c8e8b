"""``symkit sweep -S key=v1,v2 [-S key2=w1,w2 ...]``: run a grid of DVC experiments, compare them.

Each ``-S`` option is a DVC ``--set-param`` override whose value may list several values
separated by commas: DVC's own sweep syntax (Hydra's override grammar, as ``dvc exp run --queue
-S`` parses it), so ``[3,5]`` stays one list and ``'a,b'`` one string. The grid is the cartesian
product of the ``-S`` options in the order given (the last varies fastest); arm ``k`` (1-based)
is the experiment ``<prefix>-<k>``.

Before anything runs, every arm's params.yaml is made by DVC's own override code
(:func:`dvc.utils.hydra.apply_overrides`) on a copy and validated like ``symkit check-params``
(sections the project knows; any other section is checked by DVC's override only, which refuses
a key that does not exist unless written ``+key=value``), and the workspace is checked: a git
repository whose params.yaml and dvc.yaml match ``HEAD``, whose ``HEAD`` holds evaluation
results, and where no experiment has an arm's name.

The arms then run one at a time in the foreground with ``dvc exp run --temp`` (each in a
temporary copy of the workspace; params.yaml here is never rewritten), up to ``--target``
(default ``evaluate``: what the comparison reads). A failed arm is recorded (exit status, last
lines of its log) and the sweep goes on. Finally ``symkit compare HEAD <finished arms...>``
writes compare.json/.md/.html into ``--out``, beside ``sweep.json`` (the arms, their overrides
and outcomes) and ``logs/<arm>.log``. Why ``--temp`` and not DVC's queue: ``docs/compare.md``,
section "Sweeps".
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.core import artifacts
from pipeline.core.commands import run_argv
from pipeline.core.config import ParamsError, parse_section, parse_yaml, section_class, sections
from pipeline.decision.registered_comparisons import REGISTRATION
from pipeline.tools.runs import EVAL, PARAMS, PER_PIECE

HELP = "run a grid of DVC experiments (-S key=v1,v2), one at a time, then compare them"

GUARDED = (PARAMS, "dvc.yaml", REGISTRATION)
"""Files whose uncommitted changes would make the arms differ from ``HEAD`` by more than their
overrides (DVC copies workspace changes into every experiment), or, for the registered
comparisons, make a registration look older than it is."""
LOG_TAIL = 20
"""Lines of a failed arm's log kept in sweep.json (and the last 10 of them printed)."""
SCHEMA_VERSION = 1
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
"""An experiment name prefix: safe as a git ref component and as a folder name."""


class SweepError(ValueError):
    """The sweep cannot start (bad grid, workspace not clean, a name taken); the message says
    what to do."""


# ---- the grid -------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepArm:
    """One experiment of the grid: its name and its ``-S`` overrides (``key=value``)."""

    name: str
    overrides: tuple[str, ...]


def parse_set(text: str) -> tuple[str, list[str]]:
    """One ``-S`` option -> (key, its values as override strings), parsed as DVC parses them.

    ``ngram.order=3,5`` gives ``("ngram.order", ["3", "5"])``; ``a=[3,5],[1]`` two lists;
    ``a='x,y',z`` the string ``x,y`` and ``z``; ``a=range(1,4)`` 1, 2 and 3. Each value string is
    the one DVC's own queue sweep passes on (Hydra's ``sweep_string_iterator``), so it parses back
    to the same value. A ``+`` prefix (add a key) is kept. :class:`SweepError` for a parameters
    file other than params.yaml, a ``~key`` deletion, an interval sweep or bad syntax."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if ":" in text.partition("=")[0]:
        raise SweepError(f"-S {text}: a sweep sets {PARAMS} only; drop the file prefix")
    try:
        override = OverridesParser.create().parse_override(text)
    except HydraException as e:
        raise SweepError(f"-S {text}: not an override DVC can parse: "
                         f"{str(e).strip().splitlines()[0]}") from None
    key = override.get_key_element()
    if key.startswith("~"):
        raise SweepError(f"-S {text}: a sweep sets values; deleting a key (~) is not supported")
    if override.is_sweep_override() and not override.is_discrete_sweep():
        raise SweepError(f"-S {text}: an interval cannot be swept; list the values "
                         "(1,2,3) or use range(start,stop,step)")
    if override.is_sweep_override():
        values = list(override.sweep_string_iterator())
    else:
        values = [override.get_value_element_as_str()]
    if not values:
        raise SweepError(f"-S {text}: no values")
    return key, values


def expand_grid(sets: Sequence[str], prefix: str) -> list[SweepArm]:
    """The cartesian product of the ``-S`` options, in the order given (the first option varies
    slowest, as in ``itertools.product`` and DVC's queue sweeps); arm ``k`` is ``<prefix>-<k>``.
    A key given twice is refused (DVC would silently keep the last)."""
    if not sets:
        raise SweepError("give at least one -S key=v1,v2")
    check_prefix(prefix)
    parsed = [parse_set(s) for s in sets]
    keys = [k.lstrip("+") for k, _ in parsed]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise SweepError(f"-S {twice[0]} is given more than once; list all its values in one "
                         "-S, separated by commas")
    choices = [[f"{k}={v}" for v in values] for k, values in parsed]
    return [SweepArm(f"{prefix}-{i}", tuple(combo))
            for i, combo in enumerate(itertools.product(*choices), start=1)]


def check_prefix(prefix: str) -> None:
    if not NAME.fullmatch(prefix):
        raise SweepError(f"--name {prefix!r}: use letters, digits, '-' and '_' (starting with a "
                         "letter or digit): it becomes part of git refs and a folder name")


def default_prefix(sets: Sequence[str], head: str) -> str:
    """``<last part of each key>-<HEAD's short hash>``, e.g. ``smoothing-f412521``: readable in
    ``dvc exp show``, and two sweeps of one key on different commits get different names (an
    experiment name must be unique across commits for ``symkit compare`` to find it)."""
    leaves = [parse_set(s)[0].lstrip("+").rsplit(".", 1)[-1] for s in sets]
    words = [re.sub(r"[^A-Za-z0-9_]+", "_", w).strip("_") or "param" for w in leaves]
    return "-".join([*words, head[:7]])


# ---- validating every arm before running one ------------------------------------------------
def arm_params(base: Path, arm: SweepArm, workdir: Path) -> dict[str, Any]:
    """params.yaml as ``dvc exp run -S`` will write it for ``arm``: DVC's override code applied
    to a copy of ``base`` in ``workdir``. A key that does not exist (without ``+``) or a value
    the override cannot set raises :class:`ParamsError` naming the arm and the override."""
    from dvc.exceptions import DvcException
    from dvc.utils.hydra import apply_overrides

    copy = workdir / PARAMS
    shutil.copyfile(base, copy)
    for override in arm.overrides:
        try:
            apply_overrides(copy, [override])
        except DvcException as e:
            why = " ".join(str(e.__cause__ or e).split())
            raise ParamsError(f"arm {arm.name}: -S {override}: {why}") from None
    return parse_yaml(copy.read_text(encoding="utf-8")) or {}


def check_sections(params: Mapping[str, Any], source: str,
                   known: Mapping[str, str] | None = None) -> list[str]:
    """Problems of every section the project knows (``known``: name -> config class, default
    :func:`pipeline.core.config.sections`), one
    line each naming ``section.key``, the value and what is allowed. Other sections are not
    checked here: DVC's override already refused keys that do not exist."""
    known = sections() if known is None else known
    problems = []
    for name in params:
        if name in known:
            try:
                parse_section(name, params[name], section_class(name), source)
            except ParamsError as e:
                problems.append(str(e))
    return problems


def validate(base: Path, arms: Sequence[SweepArm]) -> dict[str, bool]:
    """Check every arm's params; :class:`ParamsError` listing every bad arm. Returns, per arm,
    whether its params equal ``base``'s (an arm that repeats the baseline)."""
    base_params = parse_yaml(base.read_text(encoding="utf-8")) or {}
    problems: list[str] = []
    same: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="symkit-sweep-") as tmp:
        for arm in arms:
            try:
                params = arm_params(base, arm, Path(tmp))
            except ParamsError as e:
                problems.append(str(e))
                continue
            problems += check_sections(params, f"arm {arm.name} ({' '.join(arm.overrides)})")
            same[arm.name] = params == base_params
    if problems:
        raise ParamsError("\n".join(problems) + "\nNothing was run.")
    return same


# ---- the workspace --------------------------------------------------------------------------
def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=False)


def experiment_refs() -> dict[str, str]:
    """Every DVC experiment here: name -> ref (``refs/exps/ab/cdef.../<name>``)."""
    refs = _git("for-each-ref", "--format=%(refname)", "refs/exps").stdout.split()
    return {r.rsplit("/", 1)[-1]: r for r in refs
            if r.count("/") >= 4 and not r.startswith(("refs/exps/exec/", "refs/exps/celery/"))}


def check_workspace(arms: Sequence[SweepArm], target: str) -> str:
    """``HEAD``'s commit, after refusing a workspace the sweep cannot use as its baseline."""
    if not Path(PARAMS).is_file() or not Path("dvc.yaml").is_file():
        raise SweepError(f"no {PARAMS} and dvc.yaml here: run the sweep from the repository root")
    top = _git("rev-parse", "--show-toplevel")
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != Path.cwd().resolve():
        raise SweepError("not the root of a git repository: DVC experiments need git; run the "
                         "sweep from the repository root")
    head = _git("rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    if head.returncode != 0:
        raise SweepError("the repository has no commit yet: commit the project and its baseline "
                         "results first")
    dirty = _git("status", "--porcelain", "--", *GUARDED).stdout.splitlines()
    if dirty:
        files = ", ".join(line[3:] for line in dirty)
        raise SweepError(f"uncommitted changes to {files}: the arms would carry them while the "
                         "baseline (HEAD) does not. Commit them (with their results) or set them "
                         "aside (`git stash`), then run the sweep again")
    for rel in (EVAL, PER_PIECE):
        if _git("cat-file", "-e", f"HEAD:{rel}").returncode != 0:
            raise SweepError(f"HEAD has no committed {rel}: the baseline must be evaluated; run "
                             "`dvc repro` and commit its results first")
    stages = (yaml.safe_load(Path("dvc.yaml").read_text(encoding="utf-8")) or {}).get("stages")
    if target not in (stages or {}):
        raise SweepError(f"--target {target!r} is not a stage of dvc.yaml (stages: "
                         f"{', '.join(stages or {}) or 'none'})")
    taken = sorted(a.name for a in arms if a.name in experiment_refs())
    if taken:
        raise SweepError(f"experiment {', '.join(taken)} already exists: choose another --name, "
                         f"or remove it (`dvc exp remove {' '.join(taken)}`)")
    return head.stdout.strip()


def other_changes() -> list[str]:
    """Tracked files changed in the workspace (besides :data:`GUARDED`, refused earlier): DVC
    copies them into every arm."""
    return [line[3:] for line in _git("status", "--porcelain", "--untracked-files=no"
                                      ).stdout.splitlines()]


# ---- running ---------------------------------------------------------------------------------
def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the DVC children: this interpreter's folder first on PATH (stage
    commands call ``symkit``), no analytics, and the Makefile's fixed thread counts and hash
    seed, so an arm runs as ``make repro`` ran the baseline."""
    env = dict(os.environ if env is None else env)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, *(p for p in env.get("PATH", "").split(os.pathsep)
                                              if p and p != bin_dir)])
    env["DVC_NO_ANALYTICS"] = "1"
    env.setdefault("OMP_NUM_THREADS", "2")
    env.setdefault("MKL_NUM_THREADS", "2")
    env["PYTHONHASHSEED"] = "0"
    return env


def dvc_args(arm: SweepArm, target: str) -> list[str]:
    """``dvc`` arguments that run ``arm`` as an experiment in a temporary copy, in the
    foreground."""
    return ["exp", "run", "--temp", "--name", arm.name,
            *itertools.chain.from_iterable(("-S", o) for o in arm.overrides), target]


@dataclass
class Outcome:
    """What became of one arm."""

    name: str
    overrides: tuple[str, ...]
    status: str = "pending"  # pending | finished | failed | interrupted
    exit_code: int | None = None
    ref: str | None = None
    log_tail: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "overrides": list(self.overrides), "status": self.status,
                "exit_code": self.exit_code, "ref": self.ref, "log": f"logs/{self.name}.log",
                "log_tail": self.log_tail}


def run_arm(arm: SweepArm, target: str, log: Path) -> Outcome:
    """Run one arm in the foreground, its output echoed and kept; ``finished`` when DVC exits 0
    and the experiment's ref exists. The log is written after the run, never inside the
    workspace while DVC stashes it."""
    proc = subprocess.Popen([sys.executable, "-m", "dvc", *dvc_args(arm, target)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env=child_env())
    lines: list[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line)
            print(f"  {arm.name} | {line}", end="", flush=True)
        rc = proc.wait()
    except KeyboardInterrupt:  # Ctrl-C reached DVC too; let it stop its stage and clean up
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    finally:
        artifacts.write_text(log, "".join(lines))
    ref = experiment_refs().get(arm.name)
    ok = rc == 0 and ref is not None
    tail = [line.rstrip("\n") for line in lines[-LOG_TAIL:]]
    if rc == 0 and ref is None:
        tail.append(f"symkit sweep: dvc exited 0 but no experiment named {arm.name} exists")
    return Outcome(arm.name, arm.overrides, "finished" if ok else "failed", rc, ref, tail)


# ---- the command ------------------------------------------------------------------------------
def compare_argv(baseline: str, names: Sequence[str], args: argparse.Namespace) -> list[str]:
    argv = ["compare", baseline, *names]
    if args.split != "val":
        argv += ["--split", args.split]
    if args.model != "transformer":
        argv += ["--model", args.model]
    return [*argv, "--out", args.out.as_posix()]


def write_record(args: argparse.Namespace, head: str, outcomes: Sequence[Outcome],
                 compare: dict[str, Any] | None) -> None:
    """sweep.json: the grid, each arm's overrides and outcome, the comparison's command."""
    artifacts.write_json(args.out / "sweep.json", {
        "schema_version": SCHEMA_VERSION, "prefix": args.name, "baseline": "HEAD",
        "baseline_commit": head, "target": args.target, "split": args.split, "model": args.model,
        "sets": list(args.set), "arms": [o.record() for o in outcomes], "compare": compare})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-S", "--set-param", dest="set", action="append", default=[],
                        metavar="KEY=V1,V2",
                        help="a params.yaml override as in `dvc exp run -S`, whose values are "
                             "swept; repeat for a grid (quote it in the shell: -S 'a.b=[3,5],[8]')")
    parser.add_argument("--name", help="experiment name prefix; arms are <prefix>-1 ... "
                                       "(default: the keys' last parts and HEAD's short hash)")
    parser.add_argument("--target", default="evaluate",
                        help="dvc.yaml stage each arm is run up to (default evaluate: what the "
                             "comparison reads)")
    parser.add_argument("--split", choices=["val", "test"], default="val",
                        help="split compared (default val)")
    parser.add_argument("--model", default="transformer",
                        help="model compared across arms (default transformer)")
    parser.add_argument("--out", type=Path,
                        help="output folder (default reports/sweep/<prefix>)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the grid and the commands, run nothing")
    parser.add_argument("--jobs", type=int, default=1,
                        help="arms run at once; only 1 (concurrent DVC runs race, see "
                             "docs/compare.md)")


def main(args: argparse.Namespace) -> int:
    try:
        head, arms, same = plan(args)
    except SweepError as e:
        print(f"symkit sweep: {e}", file=sys.stderr)
        return 2
    print(f"sweep: {len(arms)} arm{'s' * (len(arms) > 1)} against HEAD ({head[:7]}), run one "
          f"at a time up to stage {args.target}; then {args.model} compared on {args.split}")
    for arm in arms:
        print(f"  {arm.name}: {' '.join(arm.overrides)}"
              + ("  (same params as HEAD)" if same[arm.name] else ""))
    for path in other_changes():
        print(f"symkit sweep: warning: {path} has uncommitted changes; every arm carries them "
              "and the baseline (HEAD) does not", file=sys.stderr)
    if args.dry_run:
        for arm in arms:
            print(shlex.join(["dvc", *dvc_args(arm, args.target)]))
        print(shlex.join(["symkit", *compare_argv("HEAD", [a.name for a in arms], args)]))
        return 0
    outcomes = run_arms(args, head, arms)
    if any(o.status == "interrupted" for o in outcomes):
        return 130
    return finish(args, head, outcomes)


def plan(args: argparse.Namespace) -> tuple[str, list[SweepArm], dict[str, bool]]:
    """Everything checked before an arm runs: options, grid, workspace, every arm's params."""
    if args.jobs != 1:
        raise SweepError(f"--jobs {args.jobs}: arms run one at a time; concurrent `dvc exp run` "
                         "processes contend for the repository's lock and fail (docs/compare.md, "
                         "Sweeps)")
    if Path(args.params) != Path(PARAMS):
        raise SweepError(f"--params {args.params}: DVC's -S sets {PARAMS} at the repository "
                         "root; run the sweep there without --params")
    if not args.set:
        raise SweepError("give at least one -S key=v1,v2")
    head = _git("rev-parse", "--verify", "--quiet", "HEAD^{commit}").stdout.strip()
    if args.name is None:
        args.name = default_prefix(args.set, head or "nohead")
    if args.out is None:
        args.out = Path("reports/sweep") / args.name
    arms = expand_grid(args.set, args.name)
    head = check_workspace(arms, args.target)
    same = validate(Path(PARAMS), arms)
    return head, arms, same


def run_arms(args: argparse.Namespace, head: str, arms: Sequence[SweepArm]) -> list[Outcome]:
    """Run the arms in order, rewriting sweep.json after each; Ctrl-C marks the running arm
    ``interrupted`` and runs no later one."""
    outcomes = [Outcome(a.name, a.overrides) for a in arms]
    write_record(args, head, outcomes, None)
    for i, arm in enumerate(arms):
        print(f"sweep: arm {i + 1}/{len(arms)} {arm.name}: "
              f"{shlex.join(['dvc', *dvc_args(arm, args.target)])}", flush=True)
        start = time.monotonic()
        try:
            outcomes[i] = o = run_arm(arm, args.target, args.out / "logs" / f"{arm.name}.log")
        except KeyboardInterrupt:
            outcomes[i].status = "interrupted"
            write_record(args, head, outcomes, None)
            done = [x.name for x in outcomes if x.status == "finished"]
            print(f"\nsymkit sweep: interrupted during {arm.name}; later arms not run"
                  + (f"; compare the finished ones with: "
                     f"{shlex.join(['symkit', *compare_argv('HEAD', done, args)])}"
                     if done else ""), file=sys.stderr)
            return outcomes
        print(f"sweep: {arm.name} {o.status} (exit {o.exit_code}) in "
              f"{time.monotonic() - start:.0f} s", flush=True)
        if o.status == "failed":
            print("\n".join(f"  {arm.name} ! {line}" for line in o.log_tail[-10:]),
                  file=sys.stderr)
        write_record(args, head, outcomes, None)
    return outcomes


def finish(args: argparse.Namespace, head: str, outcomes: Sequence[Outcome]) -> int:
    """Compare the finished arms with HEAD; 0 when every arm finished and the comparison was
    written, else 1."""
    finished = [o.name for o in outcomes if o.status == "finished"]
    failed = [o.name for o in outcomes if o.status != "finished"]
    if failed:
        print(f"sweep: {len(failed)} arm{'s' * (len(failed) > 1)} failed: "
              + "; ".join(f"{o.name} (exit {o.exit_code}, log {args.out.as_posix()}/logs/"
                          f"{o.name}.log)" for o in outcomes if o.status != "finished"))
    if not finished:
        print("symkit sweep: no arm finished: nothing to compare", file=sys.stderr)
        write_record(args, head, outcomes, None)
        return 1
    now = _git("rev-parse", "--verify", "--quiet", "HEAD^{commit}").stdout.strip()
    baseline = "HEAD" if now == head else head  # HEAD moved during the sweep: its start commit
    argv = compare_argv(baseline, finished, args)
    print(f"sweep: comparing {len(finished)} finished arm{'s' * (len(finished) > 1)} with "
          f"{baseline}" + (f" (skipped, failed: {', '.join(failed)})" if failed else ""),
          flush=True)
    rc = run_argv(argv[0], argv[1:])
    write_record(args, head, outcomes,
                 {"argv": ["symkit", *argv], "exit_code": rc, "arms": finished,
                  "failed_arms": failed})
    print("sweep: wrote " + ", ".join(f"{args.out.as_posix()}/{f}" for f in
                                      (["sweep.json"] + (["compare.json"] if rc == 0 else []))))
    print(f"sweep: to compare again: {shlex.join(['symkit', *argv])}")
    return 1 if failed or rc != 0 else 0

