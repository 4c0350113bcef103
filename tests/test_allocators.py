"""benchmarks/allocators.py: each allocator's measurements run with it preloaded, glibc's without,
a library the loader cannot find is recorded and skipped, and ``--thp`` adds glibc's malloc on
transparent huge pages where the kernel offers them; a record names the allocator and malloc settings
it ran under."""

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
    # the sides alternate: the second round measures them in the reverse order
    assert preloaded == [(8, None, True), (8, "libfastalloc.so.1", True), (8, "libfastalloc.so.1", True), (8, None, True)]
    result = json.loads((tmp_path / "allocators.json").read_text())
    assert result["config"]["not_found"] == ["absent"]
    assert result["figures"]["glibc_L8"]["value"] == 10.0
    assert result["figures"]["fastalloc_L8"]["ratio_to_glibc"] == 2.0
    assert "absent_L8" not in result["figures"]


def _measure_thp_sides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, thp_setting: str | None) -> tuple[list, dict]:
    """Run ``allocators.py --allocators --thp`` on fake measurements (glibc's on huge pages 12 updates/s,
    without 10) with the kernel's THP setting ``thp_setting`` (``None``: no such file)."""
    tunables = []

    def fake_measure(tree, threads, length, updates, precision="fp32", extra_env=None, compile_model=False):
        tunables.append((extra_env or {}).get("GLIBC_TUNABLES"))
        return 12.0 if extra_env else 10.0

    setting = tmp_path / "enabled"
    if thp_setting is not None:
        setting.write_text(thp_setting)
    monkeypatch.setattr(allocators, "THP_SETTING", setting)
    monkeypatch.setattr(compare_commits, "measure", fake_measure)
    monkeypatch.setattr(allocators, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(sys, "argv", ["allocators.py", "--lengths", "8", "--rounds", "1", "--allocators", "--thp"])
    allocators.main()
    return tunables, json.loads((tmp_path / "allocators.json").read_text())


def test_thp_measures_glibc_with_the_huge_page_tunable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tunables, result = _measure_thp_sides(monkeypatch, tmp_path, "always [madvise] never\n")
    assert tunables == [None, "glibc.malloc.hugetlb=1"]
    assert result["config"]["transparent_hugepage"] == "madvise"
    assert result["figures"]["glibc_thp_L8"]["ratio_to_glibc"] == 1.2
    assert result["figures"]["glibc_thp_L8"]["environment"] == "GLIBC_TUNABLES=glibc.malloc.hugetlb=1"


@pytest.mark.parametrize("thp_setting", ["always madvise [never]\n", None])
def test_thp_is_skipped_where_the_kernel_gives_no_huge_pages(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], thp_setting: str | None
) -> None:
    tunables, result = _measure_thp_sides(monkeypatch, tmp_path, thp_setting)
    assert tunables == [None]
    assert "glibc_thp_L8" not in result["figures"]
    assert result["config"]["transparent_hugepage"] == ("never" if thp_setting else "unknown")
    assert "glibc_thp: the kernel's transparent huge pages are" in capsys.readouterr().out


@pytest.mark.skipif(ctypes.util.find_library("tcmalloc_minimal") is None, reason="libtcmalloc_minimal is not installed")
def test_the_preload_reaches_the_measuring_process() -> None:
    script = "print(any('tcmalloc' in line for line in open('/proc/self/maps')))"
    env = {"LD_PRELOAD": ctypes.util.find_library("tcmalloc_minimal")}
    assert compare_commits.run_script(script, compare_commits.REPO, 1, 8, 1, extra_env=env) == "True"
    assert compare_commits.run_script(script, compare_commits.REPO, 1, 8, 1) == "False"


def test_a_record_names_the_environment_it_was_measured_under(monkeypatch: pytest.MonkeyPatch) -> None:
    # A preloaded allocator moves every side's figures (tcmalloc: 1.09x the eager update on an Intel
    # Xeon), so a record made under one must say so where its command is written.
    import common

    monkeypatch.setattr(sys, "argv", ["compare_commits.py", "--rounds", "5"])
    for key in common.MEASURED_ENVIRONMENT:
        monkeypatch.delenv(key, raising=False)
    assert common.run_metadata()["command"] == "python compare_commits.py --rounds 5"
    monkeypatch.setenv("LD_PRELOAD", "libtcmalloc_minimal.so.4")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    monkeypatch.setenv("PATH", "/elsewhere")  # not a measured setting
    assert common.run_metadata()["command"] == (
        "LD_PRELOAD=libtcmalloc_minimal.so.4 GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python compare_commits.py --rounds 5"
    )
