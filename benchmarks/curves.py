"""What the learning benchmarks share: a run's evaluation curve recorded as it trains
(:class:`EvalRecorder`), the CSV the rows live in (:class:`CurveStore`), where a curve first
reaches a threshold (:func:`first_crossing`, :func:`first_reach`), the mean curve over seeds, and
the tables, reports and plots made from them. Each benchmark script keeps its tasks, its columns
and its table.
"""

import csv
import json
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from common import provenance
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

#: Evaluation envs are seeded with the run's seed plus this, apart from the training envs.
EVAL_SEED_OFFSET = 10_000

#: The columns of a benchmark that records a run's mean return only (``variant``: the variant or task
#: name; ``attempt``: when the run started, in seconds since the epoch) and their types.
RETURN_FIELDS: dict[str, type] = {
    "variant": str,
    "seed": int,
    "attempt": int,
    "env_steps": int,
    "wall_s": float,
    "mean_return": float,
    "final": int,
}

Row = dict[str, Any]


# ------------------------------------------------------------------------------------------------
# Recording a run
# ------------------------------------------------------------------------------------------------
class EvalRecorder(BaseCallback):
    """Evaluates a run as it trains and hands each evaluation's row to ``on_row``: at the start (if
    ``at_start``), every ``eval_freq`` env steps below the budget, and at the end. A row holds
    ``run_fields``, ``env_steps``, ``wall_s`` (seconds of training since ``learn`` began,
    evaluations excluded), what ``evaluate`` returned, and ``final`` (1 on the run's last row).

    :param evaluate: evaluates the model, returning the row's measured columns
    :param stop: given the rows so far (the newest last), whether the run stops at the newest one
        (it is then the final row)
    :param resumed_at: ``(env steps, wall_s)`` of the last row of the run this one continues (no
        evaluation at the start then)
    """

    def __init__(
        self,
        evaluate: Callable[[], Mapping[str, Any]],
        eval_freq: int,
        budget: int,
        run_fields: Row,
        on_row: Callable[[Row], None],
        at_start: bool = True,
        stop: Callable[[list[Row]], bool] | None = None,
        resumed_at: tuple[int, float] | None = None,
    ) -> None:
        super().__init__()
        self.evaluate = evaluate
        self.eval_freq = eval_freq
        self.budget = budget
        self.run_fields = run_fields
        self.on_row = on_row
        self.stop = stop
        # A run resumed at (env steps, training seconds) of its last row: its next evaluation is the
        # one an uninterrupted run would make next, and its seconds count on from that row's.
        steps, self.wall_offset = resumed_at or (0, 0.0)
        self.at_start = at_start and resumed_at is None
        self.next_eval = (steps // eval_freq + 1) * eval_freq
        self.start = 0.0
        self.eval_seconds = 0.0
        self.rows: list[Row] = []
        self.stopped = False

    def _on_training_start(self) -> None:
        self.start = time.perf_counter()
        if self.at_start:
            self._record(final=False)

    def _on_step(self) -> bool:
        if self.next_eval <= self.num_timesteps < self.budget:
            self._record(final=False)
            while self.next_eval <= self.num_timesteps:
                self.next_eval += self.eval_freq
        return not self.stopped

    def _on_training_end(self) -> None:
        if not self.stopped:
            self._record(final=True)

    def _record(self, final: bool) -> None:
        began = time.perf_counter()
        wall = self.wall_offset + began - self.start - self.eval_seconds
        measured = self.evaluate()
        self.eval_seconds += time.perf_counter() - began
        row = {**self.run_fields, "env_steps": self.num_timesteps, "wall_s": wall, **measured, "final": int(final)}
        self.rows.append(row)
        if not final and self.stop is not None and self.stop(self.rows):
            row["final"], self.stopped = 1, True
        self.on_row(row)


def consecutive_hits(column: str, threshold: float, count: int) -> Callable[[list[Row]], bool]:
    """An :class:`EvalRecorder` ``stop`` rule: the last ``count`` rows all have ``column`` >= ``threshold``."""

    def stop(rows: list[Row]) -> bool:
        return len(rows) >= count and all(row[column] >= threshold for row in rows[-count:])

    return stop


def return_run(row: Row) -> tuple[str, int]:
    """The (variant, seed) run a row of :data:`RETURN_FIELDS` belongs to."""
    return row["variant"], row["seed"]


def train_with_returns(
    model: BaseAlgorithm,
    variant: str,
    seed: int,
    every: int,
    budget: int,
    store: "CurveStore",
    env_id: str,
    stop_return: float,
    episodes: int = 16,
) -> None:
    """Train ``model`` for ``budget`` env steps, recording into ``store`` (:data:`RETURN_FIELDS`) the
    mean return of ``episodes`` deterministic episodes of ``env_id`` every ``every`` env steps;
    stop early once two evaluations in a row reach ``stop_return``."""
    eval_env = make_vec_env(env_id, n_envs=8, seed=seed + EVAL_SEED_OFFSET)

    def evaluate() -> dict[str, float]:
        returns, _ = evaluate_policy(model, eval_env, episodes, deterministic=True, return_episode_rewards=True)
        return {"mean_return": float(np.mean(returns))}

    def on_row(row: Row) -> None:
        store.append(row)
        print(
            f"{variant:>14} seed {seed} {row['env_steps']:>6} steps  return {row['mean_return']:+.3f}  {row['wall_s']:6.0f} s",
            flush=True,
        )

    run_fields = {"variant": variant, "seed": seed, "attempt": int(time.time())}
    stop = consecutive_hits("mean_return", stop_return, 2)
    model.learn(budget, callback=EvalRecorder(evaluate, every, budget, run_fields, on_row, at_start=False, stop=stop))
    eval_env.close()


# ------------------------------------------------------------------------------------------------
# The CSV
# ------------------------------------------------------------------------------------------------
class CurveStore:
    """A benchmark's CSV of evaluation rows, one row per evaluation, typed by column.

    Several processes may append to one file (rows are written whole). A column added to a
    benchmark after its first results has a default in ``defaults``: rows of older files read with
    it, and the first append to such a file rewrites it with today's header.

    :param path: the CSV file (it may not exist yet)
    :param fields: column name -> type (``str``, ``int``, ``float``), in the file's order
    :param defaults: value of each later-added column in rows written before it
    """

    def __init__(self, path: Path, fields: Mapping[str, type], defaults: Mapping[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.fields = dict(fields)
        self.defaults = dict(defaults or {})

    def read(self) -> list[Row]:
        """The rows with typed values (none if the file does not exist)."""
        if not self.path.exists():
            return []
        with open(self.path, newline="") as file:
            return [
                {key: kind(row.get(key, self.defaults.get(key))) for key, kind in self.fields.items()}
                for row in csv.DictReader(file)
            ]

    def write(self, rows: Sequence[Row]) -> None:
        """Replace the file with ``rows`` (through a temporary file, so a crash leaves the old one)."""
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(self.fields))
            writer.writeheader()
            writer.writerows(rows)
        tmp.replace(self.path)

    def append(self, row: Row) -> None:
        """Append one row, with the header if the file is new (see the class docstring for older headers)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        if not new:
            with open(self.path, newline="") as file:
                header = next(csv.reader(file), [])
            if header != list(self.fields):
                self.write(self.read())
        with open(self.path, "a", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(self.fields))
            if new:
                writer.writeheader()
            writer.writerow(row)

    def finished(self, run: Callable[[Row], Hashable]) -> set:
        """The runs (``run(row)`` names a row's run) that have a final row."""
        return {run(row) for row in self.read() if row["final"]}

    def drop_unfinished(
        self,
        run: Callable[[Row], Hashable],
        only: Iterable[Hashable] | None = None,
        resumable: Mapping[Any, int] | None = None,
    ) -> set:
        """Remove the rows of runs without a final row (interrupted runs), of the runs in ``only`` if
        given (so a process leaves alone the runs another process has in progress); return the
        finished runs. An interrupted run in ``resumable`` (run -> env steps of its checkpoint) keeps
        its rows up to those steps, which the resumed run continues."""
        rows = self.read()
        finished = {run(row) for row in rows if row["final"]}
        dropped = None if only is None else set(only)
        resumable = resumable or {}

        def keep(row: Row) -> bool:
            key = run(row)
            if key in finished or (dropped is not None and key not in dropped):
                return True
            return key in resumable and row["env_steps"] <= resumable[key]

        kept = [row for row in rows if keep(row)]
        if len(kept) < len(rows):
            self.write(kept)
        return finished


# ------------------------------------------------------------------------------------------------
# Curves and thresholds
# ------------------------------------------------------------------------------------------------
def first_crossing(values: Sequence[float] | np.ndarray, threshold: float) -> int | None:
    """Index of the first value at or above ``threshold``, or None."""
    reached = np.flatnonzero(np.asarray(values, dtype=float) >= threshold)
    return int(reached[0]) if reached.size else None


def first_reach(rows: Sequence[Row], threshold: float, column: str = "mean_return") -> Row | None:
    """The run's first row (by env steps) whose ``column`` is at or above ``threshold``, or None."""
    ordered = sorted(rows, key=lambda row: row["env_steps"])
    index = first_crossing([row[column] for row in ordered], threshold)
    return None if index is None else ordered[index]


@dataclass(frozen=True)
class Curve:
    """Evaluation points of one run, or the mean (and std) over seeds at the points they share."""

    steps: np.ndarray
    wall_s: np.ndarray
    score: np.ndarray
    score_std: np.ndarray

    def crossing(self, threshold: float) -> tuple[int, float] | None:
        """Env steps and training seconds of the first point at or above ``threshold``, or None."""
        index = first_crossing(self.score, threshold)
        return None if index is None else (int(self.steps[index]), float(self.wall_s[index]))


def run_curve(rows: Sequence[Row], column: str = "score") -> Curve:
    """One run's rows as a curve of ``column`` (zero spread)."""
    rows = sorted(rows, key=lambda row: row["env_steps"])
    score = np.array([row[column] for row in rows], dtype=float)
    return Curve(
        np.array([row["env_steps"] for row in rows]), np.array([row["wall_s"] for row in rows]), score, np.zeros_like(score)
    )


def mean_curve(curves: Sequence[Curve]) -> Curve:
    """Mean over runs of the score and the training seconds at the env steps every run evaluated at;
    the std of the score across runs."""
    shared = sorted(set.intersection(*(set(curve.steps.tolist()) for curve in curves)))
    picked = [[int(np.flatnonzero(curve.steps == step)[0]) for step in shared] for curve in curves]
    scores = np.array([curve.score[index] for curve, index in zip(curves, picked)])
    walls = np.array([curve.wall_s[index] for curve, index in zip(curves, picked)])
    return Curve(np.array(shared), walls.mean(axis=0), scores.mean(axis=0), scores.std(axis=0))


# ------------------------------------------------------------------------------------------------
# Reports and plots
# ------------------------------------------------------------------------------------------------
def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table of ``rows`` (cells already formatted) under ``header``."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def table_report(
    title: str, meta: Mapping[str, Any], description: str, header: Sequence[str], rows: Iterable[Sequence[Any]]
) -> list[str]:
    """The lines of a one-table report: title, provenance (:func:`common.provenance` of ``meta``),
    what the table holds, the table."""
    return [f"# {title}", "", provenance(dict(meta)), "", description, "", markdown_table(header, rows)]


def per_seed(values: Iterable[Any]) -> str:
    """One table cell holding a figure per seed: ``a / b / c``."""
    return " / ".join(str(value) for value in values)


def write_report(out_dir: Path, name: str, payload: Mapping[str, Any], lines: Sequence[str]) -> None:
    """``<name>.json`` (``payload``) and ``<name>.md`` (``lines``) in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (out_dir / f"{name}.md").write_text("\n".join(lines) + "\n")


def plot_curves(
    path: Path,
    curves: Sequence[tuple[str, Curve]],
    title: str,
    ylabel: str,
    threshold: float | None = None,
    ylim: tuple[float, float] | None = (-0.05, 1.05),
) -> None:
    """A PNG of labelled curves against env steps, each shaded +- its std, with the threshold dotted."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for label, curve in curves:
        ax.plot(curve.steps, curve.score, label=label)
        ax.fill_between(curve.steps, curve.score - curve.score_std, curve.score + curve.score_std, alpha=0.2)
    if threshold is not None:
        ax.axhline(threshold, color="grey", linestyle=":", linewidth=1)
    ax.set_title(title)
    ax.set_xlabel("env steps")
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
