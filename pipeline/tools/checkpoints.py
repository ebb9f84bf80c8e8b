"""``symkit checkpoints push|pull``: move a run's training checkpoints through the project's DVC
remote, so a run killed on one machine resumes on another.

DVC 3 has no checkpoint outputs: ``data/transformer`` (with its ``checkpoints/``) reaches the
remote only when ``train_transformer`` has finished, through ``dvc push``. This command moves the
checkpoints of a run still going, or killed:

- ``push``: every whole checkpoint folder (``data/transformer/checkpoints/run-*/step-*``; the
  loop writes them to a temporary folder and renames, so a listed one is complete) that the
  remote lacks is uploaded to ``<remote>/symkit-checkpoints/<run>/<step>/``, file by file, and
  then a ``COMPLETE`` file listing every file's sha256, last: a folder without it is an upload
  cut short, which ``pull`` never takes. A checkpoint removed by the run's own rotation
  (``transformer.checkpoint.keep_last``) while it uploads is skipped, with a warning. Then the
  remote keeps the newest ``keep_last`` complete checkpoints of each run. ``--watch SECONDS``
  repeats this until interrupted, beside a training run; a failed round warns and the next one
  tries again. The training process is never touched: a push that fails cannot stop or corrupt
  it.
- ``pull``: the newest complete checkpoint of each run on the remote that is newer than the
  local ones is downloaded into a temporary folder, checked against its sha256 list and renamed
  into place. ``dvc repro`` (or ``symkit train-transformer``) then resumes from it: the run
  folder's name is the run's identity (config, tokenizer, split, training code), so another
  machine with the same params, data and code finds it.

The remote is DVC's: the default one (``dvc remote add -d``), or ``--remote NAME``; any kind DVC
reaches (a local folder, S3/MinIO with ``dvc-s3``, SSH, ...). docs/remote.md has the workflow.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.core import artifacts
from pipeline.core.config import load_section
from pipeline.training import checkpoint as ckpt
from pipeline.training.config import TransformerStageConfig

HELP = "push a run's checkpoints to the DVC remote while it trains, or pull them to resume"
PREFIX = "symkit-checkpoints"
MARK = "COMPLETE"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["push", "pull"])
    parser.add_argument("--remote", default=None, help="a DVC remote's name (default: the "
                                                       "default remote)")
    parser.add_argument("--out", type=Path, default=Path("data/transformer"),
                        help="the model folder whose checkpoints/ the run writes")
    parser.add_argument("--watch", type=float, default=None, metavar="SECONDS",
                        help="push: repeat every SECONDS until interrupted")
    parser.add_argument("--rounds", type=int, default=None,
                        help="push --watch: stop after this many rounds")


class Store:
    """A folder of the DVC remote: ``fs`` (DVC's filesystem for it) and ``base`` (its path)."""

    def __init__(self, fs: Any, base: str) -> None:
        self.fs, self.base = fs, base

    def join(self, *parts: str) -> str:
        return self.fs.join(self.base, *parts)

    def complete(self, run: str) -> list[str]:
        """The run's step folders holding a ``COMPLETE`` list, oldest first."""
        folder = self.join(run)
        if not self.fs.exists(folder):
            return []
        steps = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(folder, detail=False)]
        return sorted(s for s in steps if s.startswith(ckpt.PREFIX)
                      and self.fs.exists(self.join(run, s, MARK)))

    def runs(self) -> list[str]:
        if not self.fs.exists(self.base):
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.base,
                                                                            detail=False))


def store_of(repo: Path, remote: str | None) -> Store:
    """The checkpoint folder of ``repo``'s DVC remote ``remote`` (None: the default)."""
    from dvc.repo import Repo

    dvc = Repo(str(repo))
    try:
        r = dvc.cloud.get_remote(remote, "checkpoints")
    finally:
        dvc.close()
    return Store(r.fs, r.fs.join(r.path, PREFIX))


def push(out: Path, store: Store, keep: int, echo: Callable[[str], None] = print) -> list[str]:
    """Upload the checkpoints the remote lacks (module docstring); the ``run/step`` pushed."""
    pushed = []
    for run in sorted((Path(out) / "checkpoints").glob("run-*")):
        have = set(store.complete(run.name))
        for step in ckpt.list_checkpoints(run):
            if step.name in have:
                continue
            try:
                files = sorted(f for f in step.iterdir() if f.is_file())
                sums = {f.name: artifacts.sha256_file(f) for f in files}
                for f in files:
                    store.fs.put_file(str(f), store.join(run.name, step.name, f.name))
            except FileNotFoundError:
                echo(f"checkpoints: {run.name}/{step.name} was removed while it uploaded (the "
                     "run keeps its newest checkpoints only); skipped")
                continue
            with tempfile.TemporaryDirectory() as tmp:
                mark = Path(tmp) / MARK
                mark.write_text(json.dumps(sums, sort_keys=True, indent=1) + "\n")
                store.fs.put_file(str(mark), store.join(run.name, step.name, MARK))
            pushed.append(f"{run.name}/{step.name}")
        done = store.complete(run.name)
        for old in done[: max(0, len(done) - keep)]:
            store.fs.rm(store.join(run.name, old), recursive=True)
    return pushed


def pull(out: Path, store: Store) -> list[str]:
    """Download each run's newest complete checkpoint when it is newer than the local ones;
    the ``run/step`` pulled. Raises ``ValueError`` when a file does not match its sha256."""
    pulled = []
    for run in store.runs():
        steps = store.complete(run)
        local = Path(out) / "checkpoints" / run
        newest_here = max((p.name for p in ckpt.list_checkpoints(local)), default="")
        if not steps or steps[-1] <= newest_here:
            continue
        step = steps[-1]
        local.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".pull-{step}-", dir=local))
        try:
            sums = json.loads(store.fs.cat_file(store.join(run, step, MARK)))
            for name, digest in sorted(sums.items()):
                store.fs.get_file(store.join(run, step, name), str(tmp / name))
                if artifacts.sha256_file(tmp / name) != digest:
                    raise ValueError(f"{run}/{step}/{name} on the remote does not match its "
                                     "sha256 in COMPLETE: the upload was damaged")
            tmp.rename(local / step)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        pulled.append(f"{run}/{step}")
    return pulled


def main(args: argparse.Namespace) -> int:
    keep = load_section("transformer", args.params, TransformerStageConfig).checkpoint.keep_last
    try:
        store = store_of(Path.cwd(), args.remote)
    except Exception as e:  # no DVC repo, no remote, a remote DVC cannot reach
        print(f"symkit checkpoints: {e}", file=sys.stderr)
        return 2
    if args.action == "pull":
        got = pull(args.out, store)
        print(f"checkpoints: pulled {', '.join(got) if got else 'nothing (none newer)'}")
        return 0
    rounds = 0
    while True:
        rounds += 1
        try:
            got = push(args.out, store, keep)
            print(f"checkpoints: pushed {', '.join(got) if got else 'nothing new'}", flush=True)
            failed = False
        except Exception as e:  # a failed round never stops training, nor the next round
            print(f"symkit checkpoints: warning: push failed ({type(e).__name__}: {e}); "
                  + ("trying again next round" if args.watch is not None
                     else "training is unaffected"),
                  file=sys.stderr, flush=True)
            failed = True
        if args.watch is None or (args.rounds is not None and rounds >= args.rounds):
            return 1 if failed else 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0
