"""benchmarks/allocators.py: each allocator's measurements run with it preloaded, glibc's without,
and a library the loader cannot find is recorded and skipped."""

import ctypes.util
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import allocators
import compare_commits


def test_each_allocator_is_preloaded_into_its_own_measurements(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    libraries = {"fastalloc": "libfastalloc.so.1", "absent": None}
    preloaded = []

    def fake_measure(tree, threads, length, updates, precision="fp32", extra_env=None, compile_model=False):
        preload = (extra_env or {}).get("LD_PRELOAD")
        preloaded.append((length, preload, compile_model))
        return 20.0 if preload else 10.0

    monkeypatch.setattr(ctypes.util, "find_library", libraries.get)
    monkeypatch.setattr(compare_commits, "measure", fake_measure)
    monkeypatch.setattr(allocators, "RESULTS_DIR", tmp_path)
    argv = ["allocators.py", "--lengths", "8", "--rounds", "2", "--allocators", "fastalloc", "absent", "--compile"]
    monkeypatch.setattr(sys, "argv", argv)
    allocators.main()
    assert preloaded == [(8, None, True), (8, "libfastalloc.so.1", True)] * 2
    result = json.loads((tmp_path / "allocators.json").read_text())
    assert result["config"]["not_found"] == ["absent"]
    assert result["figures"]["glibc_L8"]["value"] == 10.0
    assert result["figures"]["fastalloc_L8"]["ratio_to_glibc"] == 2.0
    assert "absent_L8" not in result["figures"]


@pytest.mark.skipif(ctypes.util.find_library("tcmalloc_minimal") is None, reason="libtcmalloc_minimal is not installed")
def test_the_preload_reaches_the_measuring_process() -> None:
    script = "print(any('tcmalloc' in line for line in open('/proc/self/maps')))"
    env = {"LD_PRELOAD": ctypes.util.find_library("tcmalloc_minimal")}
    assert compare_commits.run_script(script, compare_commits.REPO, 1, 8, 1, extra_env=env) == "True"
    assert compare_commits.run_script(script, compare_commits.REPO, 1, 8, 1) == "False"
