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
def test_the_avx2_build_computes_the_same_attention_masks_and_step() -> None:
    # torch runs its AVX2 kernels under ATEN_CPU_CAPABILITY=avx2, and the package builds to match;
    # its dropout mask has no vector path there, and must draw the same elements; its AdamW step
    # must write what torch's AVX2 fused AdamW writes, bit for bit.
    code = """
        import torch as th
        from torch.nn import functional as F
        from sb3_amago import clipped_step
        from sb3_amago.nets import cpu_attention, cpu_kernels, dropout
        assert th.backends.cpu.get_cpu_capability() == "AVX2" and cpu_kernels.load()
        gen = th.Generator().manual_seed(0)
        q, k, v = (th.randn(2, 3, 45, 12, generator=gen, dtype=th.float64) for _ in range(3))
        got = cpu_attention.causal_attention(q.float(), k.float(), v.float()).double()
        th.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=2e-5, rtol=1e-4)
        key = dropout.draw_key(th.device("cpu"))
        like = th.empty(3, 37, 29)
        assert th.equal(dropout.keep_mask(like.shape, 0.1, th.float32, like.device, key), dropout.traced_keep_mask(like, 0.1, key))
        def steps(native):
            step_gen = th.Generator().manual_seed(1)
            params = [th.nn.Parameter(th.randn(s, generator=step_gen)) for s in ((300, 129), (37,))]
            opt = th.optim.AdamW(params, fused=True)
            kept = clipped_step.native_step_lists
            if not native:
                clipped_step.native_step_lists = lambda *args: None
            for _ in range(3):
                for p in params:
                    p.grad = 5 * th.randn(p.shape, generator=step_gen)
                clipped_step.clipped_step(opt, params, 1.0)
            clipped_step.native_step_lists = kept
            assert (kept(opt, params) is not None) and cpu_kernels.loaded()
            return [t for p in params for t in (p.detach(), *opt.state[p].values())]
        assert all(th.equal(a, b) for a, b in zip(steps(True), steps(False)))
        print("ok")
    """
    result = _run(code, ATEN_CPU_CAPABILITY="avx2")
    assert result.stdout.strip().endswith("ok"), result.stderr[-2000:]


#: The package's operators whose CPU kernels the build holds in C++.
CPP_OPERATORS = (
    "causal_attention",
    "causal_attention_backward",
    "stack_projection",
    "leaky_relu",
    "linear_leaky_relu",
    "leaky_relu_kernel",
    "linear_leaky_relu_kernel",
    "dropout_key",
    "dropout_keep_mask",
    "rotary_tables",
)
#: Those whose autograd on the CPU the build holds in C++ (torch.library's is Python).
CPP_AUTOGRAD_OPERATORS = (
    "causal_attention",
    "causal_attention_backward",
    "stack_projection",
    "rotary_tables",
    "leaky_relu_kernel",
    "linear_leaky_relu_kernel",
)


def _builds_operators(names: tuple[str, ...], dispatch_key: str) -> Any:
    """``th.ops.sb3_amago`` once the build is loaded (the test skips where it cannot be), after checking that
    the dispatcher's one kernel of each of ``names`` on ``dispatch_key`` is the build's."""
    if not cpu_kernels.load():
        pytest.skip("the package's CPU kernels are not built on this machine")
    for name in names:
        lines = [
            line for line in th._C._dispatch_dump(f"sb3_amago::{name}").splitlines() if line.startswith(f"{dispatch_key}:")
        ]
        assert len(lines) == 1 and "cpu_kernels.cpp" in lines[0], (name, lines)
    return th.ops.sb3_amago


def test_the_operators_cpu_kernels_are_the_builds_and_compute_the_python_kernels_values() -> None:
    # Compiled code calls an operator through the dispatcher: on the CPU it must find the C++ kernel
    # (no Python on the way), whatever was imported first, and get what the Python kernel returns.
    from torch.nn import functional as F

    from sb3_amago.nets import activations, cpu_attention, dropout, rotary

    ops = _builds_operators(CPP_OPERATORS, "CPU")
    gen = th.Generator().manual_seed(0)
    x = th.randn(3, 7, 5, generator=gen)
    assert th.equal(ops.leaky_relu(x, 0.2), F.leaky_relu(x, 0.2)) and th.equal(ops.leaky_relu(x, 0.0), F.relu(x))
    assert th.equal(activations.compiled_leaky_relu(x, 0.2), F.leaky_relu(x, 0.2))
    weight, bias = th.randn(6, 5, generator=gen), th.randn(6, generator=gen)
    assert th.equal(ops.linear_leaky_relu(x, weight, bias, 0.1, False), F.leaky_relu(F.linear(x, weight, bias), 0.1))
    members, member_bias = th.randn(3, 5, 6, generator=gen), th.randn(3, 1, 6, generator=gen)
    expected = F.leaky_relu(th.baddbmm(member_bias, x, members), 0.1)
    assert th.equal(ops.linear_leaky_relu(x, members, member_bias, 0.1, True), expected)
    assert th.equal(ops.linear_leaky_relu(x, members, None, 0.0, True), F.relu(th.bmm(x, members)))
    # the rectifiers' twins without autograd, which the compiled update calls: the same kernels
    assert th.equal(ops.leaky_relu_kernel(x, 0.2), F.leaky_relu(x, 0.2))
    assert th.equal(ops.linear_leaky_relu_kernel(x, members, member_bias, 0.1, True), expected)
    assert th.equal(ops.linear_leaky_relu_kernel(x, weight, None, 0.1, False), F.leaky_relu(F.linear(x, weight), 0.1))
    th.manual_seed(5)
    keys = [ops.dropout_key(x) for _ in range(3)]
    th.manual_seed(5)
    assert keys == [dropout.draw_key(x.device) for _ in range(3)]  # the same draws from torch's generator
    assert keys[0].dtype == th.int64 and keys[0].shape == ()
    assert th.equal(
        ops.dropout_keep_mask(x, keys[0], 3277, 1.25), cpu_kernels.kernels().dropout_keep_mask(x, keys[0], 3277, 1.25)
    )
    q, k, v = (th.randn(2, 4, 9, 8, generator=gen) for _ in range(3))
    projection = ops.stack_projection(q, k, v)
    assert projection.is_contiguous() and th.equal(projection, th.stack([t.transpose(1, 2) for t in (q, k, v)], dim=2))
    angles = th.randn(9, 4, generator=gen)
    cos, sin = th.cat([angles.cos()] * 2, -1), th.cat([-angles.sin(), angles.sin()], -1)
    out, lse = ops.causal_attention(projection, cos, sin)
    expected_out, expected_lse = cpu_kernels.kernels().attention_forward(projection, cos, sin)
    assert th.equal(out, expected_out) and th.equal(lse, expected_lse) and out.stride() == expected_out.stride()
    grad = th.randn(2, 4, 9, 8, generator=gen)
    assert th.equal(
        ops.causal_attention_backward(grad, projection, cos, sin, out, lse),
        cpu_kernels.kernels().attention_backward(grad, projection, cos, sin, out, lse),
    )
    # and through autograd, as eager code calls them
    projection.requires_grad_(True)
    cpu_attention.projection_attention(projection, (cos, sin)).backward(grad)
    assert th.equal(projection.grad, cpu_kernels.kernels().attention_backward(grad, projection.detach(), cos, sin, out, lse))
    time_idx = th.randint(0, 1000, (3, 11), generator=gen)
    for table, expected_table in zip(ops.rotary_tables(time_idx, 16, rotary.ROTARY_BASE), rotary.rotary_tables(time_idx, 16)):
        assert th.equal(table, expected_table) and table.shape == (3, 1, 11, 16)


def test_the_autograd_of_the_operators_that_run_only_with_the_build_is_the_builds() -> None:
    # A compiled update calls the operators with autograd's dispatch key in force: on the CPU it must
    # find C++ there too (no Python on the way), with the gradient of the projection's stack, and an
    # error for a backward through the two without a gradient, as torch.library's Python gives.
    from sb3_amago.nets.rotary import ROTARY_BASE

    ops = _builds_operators(CPP_AUTOGRAD_OPERATORS, "AutogradCPU")
    gen = th.Generator().manual_seed(2)
    q, k, v = (th.randn(2, 4, 9, 8, generator=gen, requires_grad=True) for _ in range(3))
    projection = ops.stack_projection(q, k, v)
    grad = th.randn(projection.shape, generator=gen)
    projection.backward(grad)
    for given, part in zip((q, k, v), grad.unbind(2)):  # views of the projection's gradient
        assert th.equal(given.grad, part.transpose(1, 2))

    # Without a gradient of their own: a backward through them is an error, as with torch.library's.
    cos, sin = ops.rotary_tables(th.arange(9).repeat(2, 1), 8, ROTARY_BASE)
    assert not cos.requires_grad and not sin.requires_grad
    qkv = projection.detach().requires_grad_(True)
    out, lse = ops.causal_attention(qkv.detach(), cos, sin)
    backward = ops.causal_attention_backward(th.randn(out.shape, generator=gen), qkv, cos, sin, out, lse)
    with pytest.raises(RuntimeError, match="not implemented"):
        backward.sum().backward()
    x = th.randn(3, 5, generator=gen, requires_grad=True)
    for rectified in (
        ops.leaky_relu_kernel(x, 0.1),
        ops.linear_leaky_relu_kernel(x, th.randn(4, 5, generator=gen), None, 0.1, False),
    ):
        with pytest.raises(RuntimeError, match="not implemented"):
            rectified.sum().backward()


@pytest.mark.parametrize("dtype", [th.float32, th.float64])
def test_linear_leaky_relu_adds_the_bias_to_the_finished_product_as_its_python_kernel_does(dtype: th.dtype) -> None:
    # The C++ kernel adds the bias and rectifies in one pass over the product's rows (fp32: a vector
    # loop and a tail), where baddbmm and addmm would add the bias before the product's last blocks,
    # which rounds differently at wide inner sizes (700 here): it must give the Python kernel's values.
    from torch.nn import functional as F

    from sb3_amago.nets import activations

    if not cpu_kernels.load():
        pytest.skip("the package's CPU kernels are not built on this machine")
    python_kernel = activations.compiled_linear_leaky_relu._init_fn  # the operator's Python kernel itself
    ops = th.ops.sb3_amago
    gen = th.Generator().manual_seed(3)
    x = th.randn(3, 41, 700, generator=gen, dtype=dtype)
    members = th.randn(3, 700, 37, generator=gen, dtype=dtype)
    shared_bias = th.randn(1, 1, 37, generator=gen, dtype=dtype)  # broadcast over the members
    biases = (th.randn(3, 1, 37, generator=gen, dtype=dtype), shared_bias, shared_bias.expand(3, 1, 37))
    for bias in biases:
        expected = F.leaky_relu(th.bmm(x, members) + bias, 0.1)
        assert th.equal(python_kernel(x, members, bias, 0.1, True), expected)
        assert th.equal(ops.linear_leaky_relu(x, members, bias, 0.1, True), expected)
    weight, bias = th.randn(19, 700, generator=gen, dtype=dtype), th.randn(19, generator=gen, dtype=dtype)
    expected = F.relu(F.linear(x, weight) + bias)
    assert th.equal(python_kernel(x, weight, bias, 0.0, False), expected)
    assert th.equal(ops.linear_leaky_relu(x, weight, bias, 0.0, False), expected)
