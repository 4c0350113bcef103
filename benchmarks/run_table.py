"""Runs of one task from several learning-suite CSVs, side by side, for comparing variants of the
code (each CSV labelled with its variant) on more runs than the suite's own table keeps.

    python benchmarks/run_table.py --task DarkKeyToDoor5 --runs clamped=a.csv log_softmax=b.csv \\
        --out-dir benchmarks/results/bc_likelihood --name runs

Per run (a label, a seed, a commit): the final score, the mean score of the last ``--last``
evaluations (one evaluation of 32 episodes is noisy), the mean score over every evaluation (the
area under the curve), and, on tasks with trials, each trial's return averaged over the same last
evaluations. Per label: the mean and standard deviation over its finished runs. Unfinished runs
(no final row) are listed with the env steps they reached and left out of the summary.

Against a reference label (``--reference``, the first label by default): each other label's
difference in mean and two one-sided permutation p-values, the share of relabellings of the two
labels' finished runs whose difference is at least as low (``p lower``) or at least as high
(``p higher``) as the one observed. Every relabelling is counted where there are at most
``EXACT_RELABELLINGS`` of them, else a seeded random sample of ``SAMPLED_RELABELLINGS``. Pick the
direction before looking: a test of "did the change make it worse" reads ``p lower``.

With ``--margin M``, each comparison also tests non-inferiority: ``p not worse by M`` is the
``p higher`` of the label's values raised by M, against the hypothesis that its mean is M or more
below the reference's. Below 0.05, the one-sided 95% permutation confidence bound of the difference
is above -M: the label is no worse than the reference by M or more.
"""

import argparse
import itertools
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from common import RESULTS_DIR, run_metadata
from curves import Row, markdown_table, run_curve, write_report
from learning import curve_store, row_trial_returns


def parse_runs(specs: Sequence[str]) -> list[tuple[str, Path]]:
    """``LABEL=CSV`` arguments -> ``(label, path)`` pairs."""
    pairs = []
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"--runs takes LABEL=CSV pairs, got {spec!r} (e.g. clamped=results/x.csv)")
        pairs.append((label, Path(path)))
    return pairs


def summarise_run(rows: Sequence[Row], last: int) -> dict:
    """One run's figures from its rows (any order)."""
    rows = sorted(rows, key=lambda row: row["env_steps"])
    score = run_curve(rows).score
    tail = rows[-last:]
    trials = [row_trial_returns(row) for row in tail if row["trial_returns"]]
    return {
        "commit": rows[-1]["commit"][:7],
        "env_steps": rows[-1]["env_steps"],
        "finished": bool(rows[-1]["final"]),
        "final": float(score[-1]),
        "last_mean": float(score[-last:].mean()),
        "auc": float(score.mean()),
        "trials": np.mean(trials, axis=0).tolist() if len(trials) == len(tail) else [],
    }


def collect(task: str, algos: Sequence[str], runs: Sequence[tuple[str, Path]], last: int) -> list[dict]:
    """Every run of ``task`` by one of ``algos`` (e.g. ``amago`` and ``amago_bf16``, from two CSVs)
    in each labelled CSV, summarised (see :func:`summarise_run`)."""
    found = []
    for label, path in runs:
        if not path.exists():
            raise SystemExit(f"{path} does not exist: give --runs LABEL=CSV with the path of a learning-suite CSV")
        by_run: dict[tuple[str, int], list[Row]] = {}
        for row in curve_store(path).read():
            if row["task"] == task and row["algo"] in algos:
                by_run.setdefault((row["algo"], row["seed"]), []).append(row)
        found += [
            {"label": label, "csv": str(path), "algo": algo, "seed": seed, **summarise_run(rows, last)}
            for (algo, seed), rows in sorted(by_run.items())
        ]
    if not found:
        raise SystemExit(f"no rows of task {task!r} and algos {list(algos)} in the CSVs given")
    return found


#: Relabellings counted one by one up to this many (C(20, 10) = 184,756), else sampled.
EXACT_RELABELLINGS = 200_000
SAMPLED_RELABELLINGS = 100_000
SUMMARY_KEYS = ("final", "last_mean", "auc")


def finished_by_label(found: Sequence[dict]) -> dict[str, list[dict]]:
    """Each label's finished runs, labels in order of first appearance (those with none left out)."""
    finished: dict[str, list[dict]] = {}
    for run in found:
        if run["finished"]:
            finished.setdefault(run["label"], []).append(run)
    return finished


def per_label(found: Sequence[dict]) -> list[dict]:
    """Mean and std over each label's finished runs of the final score, the last-evaluations mean,
    and the last trial's return minus the first's."""
    summary = []
    for label, done in finished_by_label(found).items():
        figures = {"label": label, "runs": len(done)}
        for key in SUMMARY_KEYS:
            values = np.array([run[key] for run in done])
            figures[key] = (float(values.mean()), float(values.std()))
        rises = np.array([run["trials"][-1] - run["trials"][0] for run in done if run["trials"]])
        figures["trial_rise"] = (float(rises.mean()), float(rises.std())) if len(rises) else None
        summary.append(figures)
    return summary


def permutation_pvalues(reference: Sequence[float], other: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """One-sided permutation p-values of ``mean(other) - mean(reference)``: the share of the pooled
    values' relabellings (same group sizes) whose difference is <= the observed one, and >= it."""
    pooled = np.asarray([*reference, *other], dtype=float)
    n, k = len(pooled), len(other)
    observed = pooled[len(reference) :].mean() - pooled[: len(reference)].mean()
    if math.comb(n, k) <= EXACT_RELABELLINGS:
        picks = np.array(list(itertools.combinations(range(n), k)))  # (relabellings, k)
        extra = 0
    else:  # the observed labelling counts as one of the sample (an exact test's p is never 0)
        rng = np.random.default_rng(seed)
        picks = np.argsort(rng.random((SAMPLED_RELABELLINGS, n)), axis=1)[:, :k]
        extra = 1
    in_other = pooled[picks].sum(axis=1)  # (relabellings,)
    diffs = in_other / k - (pooled.sum() - in_other) / (n - k)
    tolerance = 1e-12 * max(1.0, float(np.abs(pooled).max()))  # the observed labelling's own sum rounds
    lower = (np.count_nonzero(diffs <= observed + tolerance) + extra) / (len(diffs) + extra)
    higher = (np.count_nonzero(diffs >= observed - tolerance) + extra) / (len(diffs) + extra)
    return float(lower), float(higher)


def against_reference(found: Sequence[dict], reference: str, margin: float | None = None) -> list[dict]:
    """Each other label with two or more finished runs against ``reference``'s finished runs: the
    difference in mean and :func:`permutation_pvalues` of the final score, the last-evaluations mean
    and the mean over all evaluations; with ``margin``, the non-inferiority p-value (module docstring)."""
    finished = finished_by_label(found)
    if len(finished.get(reference, [])) < 2:
        return []
    comparisons = []
    for label, runs in finished.items():
        if label == reference or len(runs) < 2:
            continue
        figures: dict = {
            "label": label,
            "reference": reference,
            "runs": len(runs),
            "reference_runs": len(finished[reference]),
            "margin": margin,
        }
        for key in SUMMARY_KEYS:
            ref_values, values = [run[key] for run in finished[reference]], [run[key] for run in runs]
            lower, higher = permutation_pvalues(ref_values, values)
            figures[key] = {"difference": float(np.mean(values) - np.mean(ref_values)), "p_lower": lower, "p_higher": higher}
            if margin is not None:
                figures[key]["p_not_worse_by_margin"] = permutation_pvalues(ref_values, [v + margin for v in values])[1]
        comparisons.append(figures)
    return comparisons


def report_lines(
    task: str, found: Sequence[dict], summary: Sequence[dict], comparisons: Sequence[dict], last: int, meta: dict
) -> list[str]:
    def pm(pair: tuple[float, float] | None) -> str:
        return "" if pair is None else f"{pair[0]:.3f} ± {pair[1]:.3f}"

    header = ["label", "seed", "commit", "env steps", "final", f"last {last}", "mean over all"]
    n_trials = max(len(run["trials"]) for run in found)
    header += [f"trial {i + 1}" for i in range(n_trials)]
    rows = [
        [run["label"], run["seed"], run["commit"], f"{run['env_steps']:,}" + ("" if run["finished"] else " (unfinished)")]
        + [f"{run[key]:.3f}" for key in SUMMARY_KEYS]
        + [f"{x:.2f}" for x in run["trials"]]
        + [""] * (n_trials - len(run["trials"]))
        for run in found
    ]
    description = (
        f"{task}, one row per run: the score at the final evaluation, the mean over the last {last} "
        f"evaluations and over every evaluation, and each trial's return averaged over the last {last}."
    )
    lines = [f"# {task}: runs side by side", "", f"`{meta['command']}`, {meta['date']} (the runs' own machines and"]
    lines += ["commits are their CSVs'; this only reads them).", "", description, "", markdown_table(header, rows)]
    lines += ["", "Per label, over its finished runs (mean ± std):", ""]
    lines.append(
        markdown_table(
            ["label", "runs", "final", f"last {last}", "mean over all", "last trial - first"],
            [[s["label"], s["runs"], pm(s["final"]), pm(s["last_mean"]), pm(s["auc"]), pm(s["trial_rise"])] for s in summary],
        )
    )
    if comparisons:
        reference = comparisons[0]["reference"]
        header = ["label", "runs", "final", f"last {last}", "mean over all"]

        def table(cell: Callable[[dict], str]) -> str:
            """One row per comparison, ``cell`` of each summary key's figures."""
            rows = [
                [c["label"], f"{c['runs']} vs {c['reference_runs']}"] + [cell(c[key]) for key in SUMMARY_KEYS]
                for c in comparisons
            ]
            return markdown_table(header, rows)

        lines += ["", f"Against `{reference}` (difference in mean; one-sided permutation p-values, lower / higher):", ""]
        lines.append(table(lambda f: f"{f['difference']:+.3f} (p {f['p_lower']:.3f} / {f['p_higher']:.3f})"))
        margin = comparisons[0]["margin"]
        if margin is not None:
            lines += [
                "",
                f"Non-inferiority with a margin of {margin} (p of a mean {margin} or more below `{reference}`'s):",
                "",
            ]
            lines.append(table(lambda f: f"{f['p_not_worse_by_margin']:.3f}"))
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True)
    parser.add_argument("--algo", nargs="+", default=["amago"], help="the rows' algorithms (any of them)")
    parser.add_argument("--runs", nargs="+", required=True, metavar="LABEL=CSV")
    parser.add_argument("--last", type=int, default=5, help="evaluations averaged at the end of a run")
    parser.add_argument("--reference", help="the label the others are tested against (default: the first --runs label)")
    parser.add_argument("--margin", type=float, help="also test non-inferiority by this margin (see the docstring)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default="run_table")
    args = parser.parse_args(argv)
    runs = parse_runs(args.runs)
    reference = args.reference or runs[0][0]
    if reference not in {label for label, _ in runs}:
        raise SystemExit(f"--reference {reference!r} is not one of the --runs labels {sorted({label for label, _ in runs})}")
    found = collect(args.task, args.algo, runs, args.last)
    summary = per_label(found)
    comparisons = against_reference(found, reference, args.margin)
    meta = run_metadata()
    write_report(
        args.out_dir,
        args.name,
        {"meta": meta, "runs": found, "per_label": summary, "against_reference": comparisons},
        report_lines(args.task, found, summary, comparisons, args.last, meta),
    )


if __name__ == "__main__":
    main()
