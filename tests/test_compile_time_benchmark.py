"""benchmarks/compile_time.py: the first process compiles on an empty inductor cache, the later ones
reuse that same cache, and the figures read the runs in that order."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import compile_time


def test_the_first_process_finds_an_empty_cache_and_the_later_ones_reuse_it(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Path, list[str]]] = []

    def fake_first_update(cache_dir: Path, threads: int, length: int, updates: int) -> dict[str, float]:
        seen.append((cache_dir, sorted(p.name for p in cache_dir.iterdir())))
        (cache_dir / f"graph_{len(seen)}").write_text("compiled")  # what a process leaves in the cache
        return {"first_update_s": 80.0 / len(seen), "update_ms": 45.0, "load_average": 1.0}

    monkeypatch.setattr(compile_time, "first_update", fake_first_update)
    runs = compile_time.measured_runs(threads=2, length=64, updates=5, warm_runs=2)
    assert len(runs) == 3
    assert len({cache for cache, _ in seen}) == 1, "one cache folder for every process"
    assert [contents for _, contents in seen] == [[], ["graph_1"], ["graph_1", "graph_2"]]
    assert not seen[0][0].exists(), "the temporary cache is removed after the last process"


def test_figures_take_the_first_run_as_the_empty_cache_and_the_median_of_the_rest() -> None:
    runs = [
        {"first_update_s": 83.41, "update_ms": 45.25, "load_average": 0.65},
        {"first_update_s": 16.55, "update_ms": 44.28, "load_average": 1.10},
        {"first_update_s": 15.67, "update_ms": 43.71, "load_average": 1.13},
        {"first_update_s": 19.0, "update_ms": 44.0, "load_average": 1.2},
    ]
    figures = compile_time.figures(runs)
    assert figures["first_update_empty_cache"]["value"] == 83.4
    assert figures["first_update_cached"]["value"] == 16.6  # the median of 16.55, 15.67 and 19.0
    assert figures["first_update_cached"]["runs_s"] == [16.6, 15.7, 19.0]
    assert figures["first_update_cached"]["load_average_range"] == "1.10-1.20"


def test_at_least_one_later_process_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["compile_time.py", "--warm-runs", "0"])
    with pytest.raises(SystemExit):
        compile_time.main()


@pytest.mark.slow
def test_the_measuring_script_compiles_and_times_the_reference_model(tmp_path: Path) -> None:
    run = compile_time.first_update(tmp_path, threads=1, length=8, updates=2)
    assert run["first_update_s"] > 0 and run["update_ms"] > 0
    assert any(tmp_path.iterdir()), "the compiled graphs went to the given cache folder"
