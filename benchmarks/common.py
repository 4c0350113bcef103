"""What every benchmark records beside its figures (benchmarks/results/<name>.json and .md):
the exact command, torch version and thread count, CPU model and date."""

import datetime
import json
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

import torch as th

RESULTS_DIR = Path(__file__).parent / "results"


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def run_metadata() -> dict[str, Any]:
    """The command that produced a result and the machine it ran on."""
    return {
        "command": shlex.join(["python", *sys.argv]),
        "torch_version": th.__version__,
        "threads": th.get_num_threads(),
        "cpu_model": cpu_model(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_results(name: str, config: dict[str, Any], figures: dict[str, dict[str, Any]], out_dir: Path = RESULTS_DIR) -> None:
    """``<name>.json`` (config, figures with units, metadata) and a ``<name>.md`` table.

    :param figures: ``{figure name: {"value": number, "unit": str, ...more fields}}``
    """
    meta = run_metadata()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps({"config": config, "figures": figures, **meta}, indent=2) + "\n")
    lines = [
        f"# {name}",
        "",
        f"`{meta['command']}`; torch {meta['torch_version']}, {meta['threads']} threads, {meta['cpu_model']}, {meta['date']}.",
        "",
        "| figure | value | unit |",
        "|---|---|---|",
    ]
    lines += [f"| {key} | {fig['value']:.4g} | {fig['unit']} |" for key, fig in figures.items()]
    (out_dir / f"{name}.md").write_text("\n".join(lines) + "\n")
