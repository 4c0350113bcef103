"""What every benchmark records beside its figures (benchmarks/results/<name>.json and .md):
the exact command, torch version and thread count, CPU model and date."""

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch as th

from sb3_amago import cpu_memory
from sb3_amago.nets import cpu_kernels, cpu_matmul

RESULTS_DIR = Path(__file__).parent / "results"


def add_learning_run_args(parser: argparse.ArgumentParser) -> None:
    """The options every resumable learning benchmark takes: ``--threads`` (torch threads per run, 1 by
    default), ``--out-dir`` (where the CSV and the report go) and ``--report-only`` (no training)."""
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--report-only", action="store_true", help="write the report from the CSV, train nothing")


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers (``AMD EPYC (family 25, model 17)``): a
    virtual machine's model name can hide the generation (Zen 4 and Zen 5 both read ``AMD EPYC``)."""
    cpuinfo = Path("/proc/cpuinfo")
    fields = cpu_matmul.first_processor(cpuinfo.read_text()) if cpuinfo.exists() else {}
    name = fields.get("model name") or platform.processor() or "unknown"
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def git_commit() -> str:
    """The commit the benchmark's code is at (short hash, ``+dirty`` when tracked files differ from
    it), or ``"unknown"`` outside a git checkout."""
    here = Path(__file__).parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short=10", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}+dirty" if dirty else commit


REPO = Path(__file__).resolve().parents[1]


def short_commit(revision: str) -> str:
    """The short hash of a git revision of this repository."""
    return subprocess.run(
        ["git", "rev-parse", "--short=10", revision], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()


@contextlib.contextmanager
def git_worktree(revision: str) -> Iterator[Path]:
    """A detached git worktree of ``revision`` in a temporary folder, removed on exit: an older
    version of the package to measure beside the working tree."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), short_commit(revision)], cwd=REPO, check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)


#: Environment variables that change what a benchmark measures (the allocator, malloc's settings,
#: OpenMP's waiting, the package's CPU kernels and products): set ones lead the recorded command.
MEASURED_ENVIRONMENT = (
    "LD_PRELOAD",
    "GLIBC_TUNABLES",
    "OMP_WAIT_POLICY",
    cpu_kernels.ENV_VARIABLE,
    cpu_matmul.ENV_VARIABLE,
    cpu_memory.ENV_VARIABLE,
)


def run_metadata() -> dict[str, Any]:
    """The command that produced a result (with the settings of :data:`MEASURED_ENVIRONMENT` it ran
    under) and the machine it ran on."""
    settings = [f"{key}={shlex.quote(os.environ[key])}" for key in MEASURED_ENVIRONMENT if os.environ.get(key)]
    return {
        "command": " ".join([*settings, shlex.join(["python", *sys.argv])]),
        "commit": git_commit(),
        "torch_version": th.__version__,
        "threads": th.get_num_threads(),
        "cpu_model": cpu_model(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def provenance(meta: dict[str, Any], per: str = "") -> str:
    """The line under a result table's title: command, torch, threads, CPU, date (from :func:`run_metadata`)."""
    return (
        f"`{meta['command']}`; torch {meta['torch_version']}, {meta['threads']} thread(s){per}, "
        f"{meta['cpu_model']}, {meta['date']}."
    )


def checkpoint_label(path: Path) -> str:
    """A saved model's row label: its env steps from the ``meta.json`` that ``learning.py
    --checkpoint-dir`` writes beside it, else its path."""
    meta = path.parent / "meta.json"
    return f"{json.loads(meta.read_text())['env_steps']:,}" if meta.exists() else str(path)


def markdown(name: str, payload: dict[str, Any]) -> str:
    """The people's table of a result payload (as written to ``<name>.json``); fields of a figure
    beyond value and unit (ratios, references) go in its last column."""
    lines = [
        f"# {name}",
        "",
        provenance(payload),
        "",
        "| figure | value | unit | details |",
        "|---|---|---|---|",
    ]
    for key, fig in payload["figures"].items():
        details = ", ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in fig.items() if k not in ("value", "unit")
        )
        lines.append(f"| {key} | {fig['value']:.4g} | {fig['unit']} | {details} |")
    return "\n".join(lines) + "\n"


def print_and_write(name: str, config: dict[str, Any], figures: dict[str, dict[str, Any]], out_dir: Path) -> None:
    """Each figure printed, then all of them written (:func:`write_results`)."""
    for key, figure in figures.items():
        print(f"{key}: {figure['value']} {figure['unit']}")
    write_results(name, config, figures, out_dir=out_dir)


def write_results(name: str, config: dict[str, Any], figures: dict[str, dict[str, Any]], out_dir: Path = RESULTS_DIR) -> None:
    """``<name>.json`` (config, figures with units, metadata) and ``<name>.md`` (:func:`markdown`).

    :param figures: ``{figure name: {"value": number, "unit": str, ...more fields}}``
    """
    payload = {"config": config, "figures": figures, **run_metadata()}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (out_dir / f"{name}.md").write_text(markdown(name, payload))
