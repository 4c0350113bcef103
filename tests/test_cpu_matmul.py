"""The fp32 CPU products on oneDNN (sb3_amago.nets.cpu_matmul): the same values and gradients as
torch's own functions, routed only where they should be, chosen from the environment, compiled
without a graph break, and the whole update the same with the route on or off."""

import math

import pytest
import torch as th
from op_log import OpLog
from stable_baselines3.common.env_util import make_vec_env
from test_amago import ACTION_SPACES, CountingEnv, filled_model
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from sb3_amago.nets import cpu_matmul, transformer
from sb3_amago.nets.cpu_matmul import Linear, ensemble_linear, linear

needs_onednn = pytest.mark.skipif(not cpu_matmul._onednn_available(), reason="this torch build has no oneDNN")


@pytest.fixture
def onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fp32 product on oneDNN, however small (the tests' products are far below the threshold)."""
    monkeypatch.setattr(cpu_matmul, "ONEDNN", True)
    monkeypatch.setattr(cpu_matmul, "ONEDNN_MIN_MACS", 0)


def _grads(fn, *tensors: th.Tensor, seed: int = 0) -> tuple[th.Tensor, list[th.Tensor]]:
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    out.backward(th.randn(out.shape, generator=th.Generator().manual_seed(seed)))
    return out.detach(), [leaf.grad for leaf in leaves]


@needs_onednn
@pytest.mark.usefixtures("onednn")
@pytest.mark.parametrize("x_shape", [(37, 24), (3, 11, 24), (2, 3, 5, 24), (0, 24)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("out_features", [16, 40])  # narrower and wider than the input
def test_linear_gives_torchs_values_and_gradients(x_shape: tuple[int, ...], bias: bool, out_features: int) -> None:
    gen = th.Generator().manual_seed(1)
    x, weight, b = (
        th.randn(x_shape, generator=gen),
        th.randn(out_features, 24, generator=gen),
        th.randn(out_features, generator=gen),
    )
    tensors = (x, weight, b) if bias else (x, weight)
    ours, our_grads = _grads(linear, *tensors)
    theirs, their_grads = _grads(F.linear, *tensors)
    assert ours.shape == (*x_shape[:-1], out_features)
    th.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    for mine, reference in zip(our_grads, their_grads):
        th.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-4)


@needs_onednn
@pytest.mark.usefixtures("onednn")
@pytest.mark.parametrize("expanded", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_ensemble_linear_gives_baddbmms_values_and_gradients(expanded: bool, bias: bool) -> None:
    """Also on one input expanded along the members (the critics' first layer) and on a weight
    slice (the Box critics' state and gamma columns), where the gradient sums over members."""
    gen = th.Generator().manual_seed(2)
    x = th.randn(1, 30, 12, generator=gen) if expanded else th.randn(4, 30, 12, generator=gen)
    weight = th.randn(4, 20, 8, generator=gen)
    b = th.randn(4, 1, 8, generator=gen)

    def ours(x, weight, *b):
        return ensemble_linear(x.expand(4, -1, -1), weight[:, 3:15], *b)

    def theirs(x, weight, *b):
        return th.baddbmm(b[0], x.expand(4, -1, -1), weight[:, 3:15]) if b else th.bmm(x.expand(4, -1, -1), weight[:, 3:15])

    tensors = (x, weight, b) if bias else (x, weight)
    out, grads = _grads(ours, *tensors)
    ref, ref_grads = _grads(theirs, *tensors)
    th.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for mine, reference in zip(grads, ref_grads):
        th.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-4)


@needs_onednn
@pytest.mark.usefixtures("onednn")
@pytest.mark.parametrize("expanded", [True, False])
def test_one_input_for_every_member_takes_one_product(expanded: bool) -> None:
    """The critics' first layer: an input expanded along the members is one product forward and two
    backward (input and weight gradients), where separate inputs take one per member each."""
    x = th.randn(1 if expanded else 4, 30, 12, requires_grad=True)
    weight, b = th.randn(4, 12, 8, requires_grad=True), th.randn(4, 1, 8, requires_grad=True)
    log = OpLog()
    with log:
        ensemble_linear(x.expand(4, -1, -1), weight, b).sum().backward()
    assert sum("onednn_linear" in name for name in log.names) == (3 if expanded else 12)


@needs_onednn
@pytest.mark.usefixtures("onednn")
def test_members_products_backward_without_a_zero_filled_ensemble_per_member() -> None:
    """Eager, the members' slices are taken by unbind (compiled, by indexing: inductor fuses that
    backward): the same values and gradients as indexing, bit for bit, and no select_backward, which
    makes a zero tensor of the whole input's or weight's shape per member."""
    gen = th.Generator().manual_seed(3)
    x, weight, b = th.randn(4, 30, 12, generator=gen), th.randn(4, 20, 8, generator=gen), th.randn(4, 1, 8, generator=gen)

    def indexed(x, weight, b):
        w = weight[:, 3:15]
        return th.stack([cpu_matmul.onednn_linear(x[c], w[c].t(), b[c, 0]) for c in range(4)])

    def ours(x, weight, b):
        return ensemble_linear(x, weight[:, 3:15], b)

    out, grads = _grads(ours, x, weight, b)
    ref, ref_grads = _grads(indexed, x, weight, b)
    assert th.equal(out, ref) and all(th.equal(mine, theirs) for mine, theirs in zip(grads, ref_grads))
    leaves = [t.clone().requires_grad_() for t in (x, weight, b)]
    out = ours(*leaves)
    log = OpLog()
    with log:
        out.sum().backward()
    assert "aten.select_backward.default" not in log.names, "indexing's backward: a zero tensor per member"


def _routed_to_onednn(fn) -> bool:
    log = OpLog()
    with log:
        fn()
    return any("onednn_linear" in name for name in log.names)


@needs_onednn
def test_only_fp32_cpu_products_outside_autocast_are_routed(monkeypatch: pytest.MonkeyPatch) -> None:
    x, weight = th.randn(5, 8), th.randn(3, 8)
    monkeypatch.setattr(cpu_matmul, "ONEDNN", True)
    monkeypatch.setattr(cpu_matmul, "ONEDNN_MIN_MACS", 0)
    assert _routed_to_onednn(lambda: linear(x, weight))
    assert not _routed_to_onednn(lambda: linear(x.double(), weight.double()))
    with th.autocast("cpu", dtype=th.bfloat16):
        assert not _routed_to_onednn(lambda: linear(x, weight))
        assert linear(x, weight).dtype == th.bfloat16  # autocast's bf16 product, as F.linear's
    monkeypatch.setattr(cpu_matmul, "ONEDNN", False)
    assert not _routed_to_onednn(lambda: linear(x, weight))
    assert th.equal(linear(x, weight), F.linear(x, weight))


@needs_onednn
def test_products_under_the_threshold_stay_on_the_blas(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager, a product of fewer than ``ONEDNN_MIN_MACS`` multiply-adds never reaches the operator;
    the operator itself (which compiled code always calls) hands such products to the BLAS too,
    with F.linear's values."""
    monkeypatch.setattr(cpu_matmul, "ONEDNN", True)
    monkeypatch.setattr(cpu_matmul, "ONEDNN_MIN_MACS", 16 * 32 * 8)
    weight = th.randn(8, 32)
    small, large = th.randn(15, 32), th.randn(16, 32)
    assert not _routed_to_onednn(lambda: linear(small, weight))
    assert _routed_to_onednn(lambda: linear(large, weight))
    assert not _routed_to_onednn(lambda: ensemble_linear(small.expand(2, -1, -1), weight.t().expand(2, -1, -1)))
    assert _routed_to_onednn(lambda: ensemble_linear(large.expand(2, -1, -1), weight.t().expand(2, -1, -1)))
    assert th.equal(th.ops.sb3_amago.onednn_linear(small, weight, None), F.linear(small, weight))


def _cpuinfo(vendor: str, family: int, processors: int = 2) -> str:
    """``/proc/cpuinfo``'s layout: one block of ``key\t: value`` lines per processor, blank-line separated."""
    block = f"processor\t: {{}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 17\nflags\t\t: fpu avx512f\n"
    return "\n".join(block.format(i) for i in range(processors))


@pytest.mark.parametrize(
    ("vendor", "family", "expected"),
    [
        ("AuthenticAMD", 26, True),  # Zen 5: full-width AVX-512, oneDNN 2x MKL's generic path
        ("AuthenticAMD", 27, True),
        ("AuthenticAMD", 25, False),  # Zen 4: AVX-512 in two halves, MKL as fast and cheaper per call
        ("GenuineIntel", 6, False),
    ],
)
def test_onednn_is_picked_only_on_amd_cpus_with_full_width_avx512(vendor: str, family: int, expected: bool) -> None:
    assert cpu_matmul.amd_with_full_width_avx512(_cpuinfo(vendor, family)) is expected


def test_only_the_first_processor_of_cpuinfo_is_read() -> None:
    mixed = _cpuinfo("GenuineIntel", 6, processors=1) + "\n" + _cpuinfo("AuthenticAMD", 26, processors=1)
    assert cpu_matmul.amd_with_full_width_avx512(mixed) is False
    assert cpu_matmul.amd_with_full_width_avx512("") is False


def test_the_choice_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_matmul.ENV_VARIABLE, "blas")
    assert cpu_matmul.onednn_matmul_chosen() is False
    monkeypatch.setenv(cpu_matmul.ENV_VARIABLE, "auto")
    assert cpu_matmul.onednn_matmul_chosen() == (cpu_matmul._onednn_available() and cpu_matmul._onednn_faster_here())
    monkeypatch.setenv(cpu_matmul.ENV_VARIABLE, "onednn")
    if cpu_matmul._onednn_available():
        assert cpu_matmul.onednn_matmul_chosen() is True
    else:
        with pytest.raises(RuntimeError, match="set it to blas"):
            cpu_matmul.onednn_matmul_chosen()
    monkeypatch.setenv(cpu_matmul.ENV_VARIABLE, "mkl")
    with pytest.raises(ValueError, match="SB3_AMAGO_CPU_MATMUL='mkl' is not one of auto, onednn, blas"):
        cpu_matmul.onednn_matmul_chosen()


@needs_onednn
@pytest.mark.usefixtures("onednn")
def test_routed_layers_compile_without_a_graph_break_and_give_the_eager_values() -> None:
    th.manual_seed(0)
    layer, weight = Linear(12, 6), th.randn(3, 6, 5, requires_grad=True)

    def fn(x: th.Tensor) -> th.Tensor:
        hidden = layer(x).relu()  # (N, 6)
        return ensemble_linear(hidden.expand(3, -1, -1), weight).square().sum()

    assert th._dynamo.explain(fn)(th.randn(7, 12)).graph_break_count == 0
    compiled = th.compile(fn, dynamic=True)
    for rows in (9, 14):
        x = th.randn(rows, 12, requires_grad=True)
        eager_out, eager_grads = _grads(fn, x)
        compiled_out, compiled_grads = _grads(compiled, x)
        th.testing.assert_close(compiled_out, eager_out, rtol=1e-6, atol=1e-6)
        th.testing.assert_close(compiled_grads[0], eager_grads[0], rtol=1e-6, atol=1e-6)


@needs_onednn
def test_flop_counter_counts_the_routed_products(monkeypatch: pytest.MonkeyPatch) -> None:
    x, weight = th.randn(2, 9, 8, requires_grad=True), th.randn(4, 8, requires_grad=True)
    monkeypatch.setattr(cpu_matmul, "ONEDNN_MIN_MACS", 0)
    counts = []
    for routed in (True, False):
        monkeypatch.setattr(cpu_matmul, "ONEDNN", routed)
        counter = FlopCounterMode(display=False)
        with counter:
            linear(x, weight).sum().backward()
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] == 3 * 2 * 18 * 8 * 4  # forward, and the two products of the backward


@needs_onednn
@pytest.mark.parametrize("action_space", ["discrete", "box"])
def test_an_update_is_the_same_with_the_route_on_or_off(monkeypatch: pytest.MonkeyPatch, action_space: str) -> None:
    """Every product of the policy (timestep encoder, Transformer, actor, critics, the Box critics'
    per-step and per-gamma parts) goes through the route: two updates from the same replay and seed,
    with oneDNN and with torch's BLAS, end at the same parameters, to fp32 rounding."""
    monkeypatch.setattr(cpu_matmul, "ONEDNN_MIN_MACS", 0)  # the tiny model's products are all below it
    # Attention is torch's either way; its flash kernel, not the math backend's batched products, so
    # that any BLAS product left in the log is a layer's.
    monkeypatch.setattr(transformer, "CPU_MATH_ATTENTION_MAX_STEPS", 0)
    params = []
    for routed in (True, False):
        monkeypatch.setattr(cpu_matmul, "ONEDNN", routed)
        env = make_vec_env(lambda: CountingEnv(action_space=ACTION_SPACES[action_space], random_length=True), n_envs=2, seed=1)
        model = filled_model(env)
        model.set_random_seed(1)
        log = OpLog()
        with log:
            model.train(gradient_steps=2, batch_size=4)
        assert any("onednn_linear" in name for name in log.names) == routed
        assert not routed or not any(name.split(".")[1] in ("mm", "addmm", "bmm", "baddbmm") for name in log.names)
        params.append(th.cat([p.detach().flatten() for p in model.policy.parameters()]))
    th.testing.assert_close(params[0], params[1], rtol=1e-4, atol=1e-5)


@needs_onednn
def test_the_library_benchmark_replays_the_updates_routed_products() -> None:
    """benchmarks/cpu_matmul.py at L = 8: it records the reference update's routed products (those
    above the threshold, forward and backward), counts their FLOPs as the operator's formula does,
    and times one pass with each library."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from cpu_matmul import flops, recorded_products, replay

    products = recorded_products(8)
    assert products
    assert flops(products) == sum(2 * math.prod(args[0].shape) * args[1].shape[0] for _, args, _ in products) > 0
    seconds = replay(products, repeats=1)
    assert set(seconds) == {"onednn", "blas"} and all(s > 0 for s in seconds.values())
