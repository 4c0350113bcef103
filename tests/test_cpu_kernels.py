"""The package's C++ CPU kernels (sb3_amago/nets/cpu_kernels.py): the setting that chooses them, the
fallbacks around their build, its name, and the AVX2 build's results."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch as th

from sb3_amago.nets import cpu_kernels


def _fresh_state(monkeypatch: pytest.MonkeyPatch, choice: str) -> None:
    """The module as in a process that has not tried to build the kernels yet, under ``choice``."""
    monkeypatch.setattr(cpu_kernels, "CHOICE", choice)
    monkeypatch.setattr(cpu_kernels, "_kernels", None)
    monkeypatch.setattr(cpu_kernels, "_tried", False)


def test_cpus_without_avx2_keep_torchs_kernels_and_native_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(th.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    _fresh_state(monkeypatch, "auto")
    assert not cpu_kernels.load() and not cpu_kernels.loaded()
    _fresh_state(monkeypatch, "native")
    with pytest.raises(RuntimeError, match="AVX2 or AVX-512 only.*SB3_AMAGO_CPU_KERNELS=auto or torch"):
        cpu_kernels.load()


def test_a_failed_build_warns_under_auto_and_raises_under_native(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils import cpp_extension

    def no_compiler(**kwargs: Any) -> None:
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(th.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    _fresh_state(monkeypatch, "auto")
    with pytest.warns(UserWarning, match="could not be built \\(no C\\+\\+ compiler found\\).*pip install ninja"):
        assert not cpu_kernels.load()
    assert not cpu_kernels.load()  # tried once per process: no second warning
    _fresh_state(monkeypatch, "native")
    with pytest.raises(RuntimeError, match="could not be built.*SB3_AMAGO_CPU_KERNELS=torch"):
        cpu_kernels.load()


def test_pips_ninja_is_put_on_path_where_path_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    ninja = pytest.importorskip("ninja")
    monkeypatch.setattr(cpu_kernels.shutil, "which", lambda name: None)
    monkeypatch.setenv("PATH", "/nowhere")
    cpu_kernels._put_ninja_on_path()
    assert os.environ["PATH"].split(os.pathsep)[0] == ninja.BIN_DIR


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **env}, capture_output=True, text=True, check=False
    )


def test_the_setting_is_read_at_import_and_checked() -> None:
    result = _run(
        "from sb3_amago.nets import cpu_kernels; print(cpu_kernels.load(), cpu_kernels.loaded())",
        SB3_AMAGO_CPU_KERNELS="torch",
    )
    assert result.returncode == 0 and result.stdout.split() == ["False", "False"], result.stderr
    result = _run("import sb3_amago.nets.cpu_kernels", SB3_AMAGO_CPU_KERNELS="fast")
    assert result.returncode != 0 and "SB3_AMAGO_CPU_KERNELS='fast' is not one of ('auto', 'native', 'torch')" in result.stderr
    # The variable's name before the dropout mask joined the build: an error that names the new one.
    result = _run("import sb3_amago", SB3_AMAGO_CPU_ATTENTION="torch")
    assert result.returncode != 0 and "SB3_AMAGO_CPU_ATTENTION is now SB3_AMAGO_CPU_KERNELS" in result.stderr


def test_builds_are_named_per_instruction_set_torch_version_and_sources(tmp_path: Path) -> None:
    names = {cpu_kernels.build_name(capability) for capability in ("AVX512", "AVX2")}
    assert len(names) == 2 and all(th.__version__.replace(".", "_").replace("+", "_") in name for name in names)
    assert all(name.isidentifier() for name in names)  # a Python module's name
    sources = cpu_kernels.SOURCES
    copied = tmp_path / "copy" / "cpu_dropout.cpp"
    copied.parent.mkdir()
    copied.write_text(sources[1].read_text())
    assert cpu_kernels.build_name("AVX512", [sources[0], copied, sources[2]]) not in names  # the same text elsewhere
    edited = tmp_path / "cpu_dropout.cpp"
    edited.write_text(sources[1].read_text() + "// an edit\n")
    assert cpu_kernels.build_name("AVX512", [sources[0], edited, sources[2]]) not in names  # another version


@pytest.mark.slow
@pytest.mark.skipif(th.backends.cpu.get_cpu_capability() != "AVX512", reason="needs an AVX-512 CPU to try its AVX2 build too")
def test_the_avx2_build_computes_the_same_attention_and_masks() -> None:
    # torch runs its AVX2 kernels under ATEN_CPU_CAPABILITY=avx2, and the package builds to match;
    # its dropout mask has no vector path there, and must draw the same elements.
    code = """
        import torch as th
        from torch.nn import functional as F
        from sb3_amago.nets import cpu_attention, cpu_kernels, dropout
        assert th.backends.cpu.get_cpu_capability() == "AVX2" and cpu_kernels.load()
        gen = th.Generator().manual_seed(0)
        q, k, v = (th.randn(2, 3, 45, 12, generator=gen, dtype=th.float64) for _ in range(3))
        got = cpu_attention.causal_attention(q.float(), k.float(), v.float()).double()
        th.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=2e-5, rtol=1e-4)
        key = dropout.draw_key(th.device("cpu"))
        like = th.empty(3, 37, 29)
        assert th.equal(dropout.keep_mask(like.shape, 0.1, th.float32, like.device, key), dropout.traced_keep_mask(like, 0.1, key))
        print("ok")
    """
    result = _run(code, ATEN_CPU_CAPABILITY="avx2")
    assert result.stdout.strip().endswith("ok"), result.stderr[-2000:]
