"""The clipped optimizer step against torch's ``clip_grad_norm_`` followed by ``step()``."""

import copy

import pytest
import torch as th
from op_log import OpLog
from torch.optim.optimizer import register_optimizer_step_post_hook

from sb3_amago import clipped_step as clipped_step_module
from sb3_amago.clipped_step import clipped_step, native_step_lists, takes_grad_scale, total_grad_norm
from sb3_amago.nets import cpu_kernels


def _params_with_grads(scale: float, seed: int = 0) -> list[th.nn.Parameter]:
    gen = th.Generator().manual_seed(seed)
    shapes = [(33, 7), (5,), (64, 64), (3, 1, 9)]
    params = [th.nn.Parameter(th.randn(s, generator=gen)) for s in shapes]
    for p in params:
        p.grad = scale * th.randn(p.shape, generator=gen)
    params.append(th.nn.Parameter(th.randn(4, generator=gen)))  # no gradient: skipped
    return params


def _torch_step(params: list[th.nn.Parameter], make_opt, max_norm: float) -> tuple[th.Tensor, list[th.Tensor]]:
    opt = make_opt(params)
    norm = th.nn.utils.clip_grad_norm_(params, max_norm)
    opt.step()
    return norm, [p.detach().clone() for p in params]


def _package_step(params: list[th.nn.Parameter], make_opt, max_norm: float) -> tuple[th.Tensor, list[th.Tensor]]:
    opt = make_opt(params)
    norm = clipped_step(opt, params, max_norm)
    assert not hasattr(opt, "grad_scale")
    return norm, [p.detach().clone() for p in params]


OPTIMIZERS = {
    "adamw_fused": lambda ps: th.optim.AdamW(ps, lr=1e-2, weight_decay=1e-3, fused=True),
    "adam_fused": lambda ps: th.optim.Adam(ps, lr=1e-2, fused=True),
    "adamw_foreach": lambda ps: th.optim.AdamW(ps, lr=1e-2, foreach=True),
    "sgd": lambda ps: th.optim.SGD(ps, lr=1e-1, momentum=0.9),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("grad_scale", [10.0, 1e-3])
def test_matches_torch_clip_then_step(name: str, grad_scale: float) -> None:
    """Clipping (a large gradient) and not clipping (a small one): the same norm and the same
    parameters as torch's clip then step; bit for bit where the clip is applied apart (or is 1)."""
    params = _params_with_grads(grad_scale)
    ours = copy.deepcopy(params)
    for p, q in zip(params, ours, strict=True):
        q.grad = None if p.grad is None else p.grad.clone()
    norm, expected = _torch_step(params, OPTIMIZERS[name], max_norm=1.0)
    assert (norm > 1.0) == (grad_scale > 1.0)
    our_norm, got = _package_step(ours, OPTIMIZERS[name], max_norm=1.0)
    assert th.equal(our_norm, norm)
    exact = not takes_grad_scale(OPTIMIZERS[name](_params_with_grads(1.0))) or norm <= 1.0
    for want, have in zip(expected, got, strict=True):
        if exact:
            assert th.equal(have, want)
        else:  # dividing by the scale against multiplying by its inverse: the last bit
            th.testing.assert_close(have, want, rtol=1e-6, atol=1e-7)
    # The gradients are left clipped, as clip_grad_norm_ leaves them.
    for p, q in zip(params, ours, strict=True):
        if p.grad is not None:
            th.testing.assert_close(q.grad, p.grad, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("dtype", [th.float64, th.bfloat16])
def test_fused_steps_of_other_float_types(dtype: th.dtype) -> None:
    """Parameters in fp64 or bf16 under a fused AdamW (whose step reads its scale in fp32 only): fp64
    gradients are clipped apart, the same values as torch's clip then step; bf16 ones by the step's
    scale, within bf16's rounding."""
    params, ours = [], []
    for p in _params_with_grads(10.0):
        for group in (params, ours):
            group.append(th.nn.Parameter(p.detach().to(dtype)))
            group[-1].grad = None if p.grad is None else p.grad.to(dtype)
    make_opt = OPTIMIZERS["adamw_fused"]
    norm, expected = _torch_step(params, make_opt, max_norm=1.0)
    our_norm, got = _package_step(ours, make_opt, max_norm=1.0)
    assert norm > 1.0
    for want, have in [(norm, our_norm), *zip(expected, got, strict=True)]:
        assert have.dtype == dtype
        if dtype == th.float64:
            assert th.equal(have, want)
        else:
            th.testing.assert_close(have, want)


def test_takes_grad_scale() -> None:
    params = _params_with_grads(1.0)
    assert takes_grad_scale(th.optim.AdamW(params, fused=True))
    assert not takes_grad_scale(th.optim.AdamW(params, foreach=True))
    assert not takes_grad_scale(th.optim.SGD(params, lr=0.1))
    assert not takes_grad_scale(th.optim.RMSprop(params))


def test_a_loaded_unfused_group_is_clipped_apart() -> None:
    """A state dict saved by an unfused optimizer makes the fused one's groups unfused (a model file
    of an earlier version): its step refuses a gradient scale, so the clip is applied apart."""
    params = _params_with_grads(10.0)
    opt = th.optim.AdamW(params, fused=True)
    opt.load_state_dict(th.optim.AdamW(params, foreach=True).state_dict())
    assert not takes_grad_scale(opt)
    expected_params = copy.deepcopy(params)
    for p, q in zip(params, expected_params, strict=True):
        q.grad = None if p.grad is None else p.grad.clone()
    norm, expected = _torch_step(expected_params, lambda ps: th.optim.AdamW(ps, foreach=True), max_norm=1.0)
    assert th.equal(clipped_step(opt, params, 1.0), norm)
    for want, p in zip(expected, params, strict=True):
        assert th.equal(p.detach(), want)


def test_grad_scale_removed_when_the_step_raises() -> None:
    params = _params_with_grads(10.0)
    opt = th.optim.AdamW(params, fused=True)

    def broken_step(*args, **kwargs):
        raise RuntimeError("step failed")

    opt.step = broken_step  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="step failed"):
        clipped_step(opt, params, 1.0)
    assert not hasattr(opt, "grad_scale")


def test_total_grad_norm() -> None:
    params = _params_with_grads(2.0)
    grads = [p.grad for p in params if p.grad is not None]
    th.testing.assert_close(total_grad_norm(grads), th.linalg.vector_norm(th.cat([g.flatten() for g in grads])))
    assert total_grad_norm([]) == 0.0


# ----------------------------------------------------------------------------------------------------
# The native step (sb3_amago/nets/cpu_adamw.cpp): torch's fused AdamW's values, bit for bit
# ----------------------------------------------------------------------------------------------------
native = pytest.mark.skipif(not cpu_kernels.buildable(), reason="the package's CPU kernels are built for AVX2 or AVX-512 CPUs")

#: Sizes with and without a tail shorter than a vector, below, at and above torch's parallel grain (32,768).
NATIVE_SHAPES = [(33, 7), (5,), (64, 64), (3, 1, 9), (300, 129), (512, 256), (16,), (128, 256)]


def _model_params(seed: int) -> list[th.nn.Parameter]:
    gen = th.Generator().manual_seed(seed)
    return [th.nn.Parameter(th.randn(s, generator=gen)) for s in NATIVE_SHAPES]


def _set_grads(params: list[th.nn.Parameter], seed: int, grad_scale: float) -> None:
    gen = th.Generator().manual_seed(seed)
    for p in params:
        p.grad = grad_scale * th.randn(p.shape, generator=gen)


def _steps(make_opt, native_allowed: bool, monkeypatch: pytest.MonkeyPatch, grad_scale: float, n: int = 3):
    """``n`` clipped steps of a fresh optimizer: the norms, and every tensor the steps wrote."""
    with monkeypatch.context() as m:
        if not native_allowed:
            m.setattr(clipped_step_module, "native_step_lists", lambda *args: None)
        params = _model_params(0)
        opt = make_opt(params)
        norms = []
        for i in range(n):
            _set_grads(params, i, grad_scale)
            norms.append(clipped_step(opt, params, max_norm=1.0))
        written = [t.detach().clone() for p in params for t in (p, p.grad, *opt.state[p].values())]
        return th.stack(norms), written, native_step_lists(opt, params) is not None


@pytest.fixture
def kernels_loaded() -> None:
    if not cpu_kernels.load():
        pytest.skip("the package's CPU kernels could not be built here")


@native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("weight_decay", [0.0, 1e-3])
@pytest.mark.parametrize("grad_scale", [10.0, 1e-3])
def test_the_native_step_writes_what_torchs_fused_adamw_writes(
    kernels_loaded: None, monkeypatch: pytest.MonkeyPatch, threads: int, weight_decay: float, grad_scale: float
) -> None:
    """Clipped (a large gradient) and not: the same norms, parameters, clipped gradients, moments and
    step counts, bit for bit, after three steps (the first makes the state, in torch's step)."""
    make = lambda ps: th.optim.AdamW(ps, lr=1e-2, weight_decay=weight_decay, fused=True)
    before = th.get_num_threads()
    th.set_num_threads(threads)
    try:
        norms, written, ran = _steps(make, True, monkeypatch, grad_scale)
        expected_norms, expected, _ = _steps(make, False, monkeypatch, grad_scale)
    finally:
        th.set_num_threads(before)
    assert ran
    assert th.equal(norms, expected_norms)
    assert all(th.equal(have, want) for have, want in zip(written, expected, strict=True))


NOT_NATIVE = {
    "foreach": lambda ps: th.optim.AdamW(ps, foreach=True),
    "amsgrad": lambda ps: th.optim.AdamW(ps, fused=True, amsgrad=True),
    "maximize": lambda ps: th.optim.AdamW(ps, fused=True, maximize=True),
    "adam": lambda ps: th.optim.Adam(ps, fused=True),
    "two_groups": lambda ps: th.optim.AdamW([{"params": ps[:2]}, {"params": ps[2:], "lr": 1e-4}], fused=True),
    "tensor_lr": lambda ps: th.optim.AdamW(ps, lr=th.tensor(1e-3), fused=True),
}


@native
@pytest.mark.parametrize("name", NOT_NATIVE)
def test_other_optimizers_take_torchs_step(kernels_loaded: None, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    norms, written, ran = _steps(NOT_NATIVE[name], True, monkeypatch, 10.0)
    expected_norms, expected, _ = _steps(NOT_NATIVE[name], False, monkeypatch, 10.0)
    assert not ran
    assert th.equal(norms, expected_norms)
    assert all(th.equal(have, want) for have, want in zip(written, expected, strict=True))


@native
def test_step_hooks_and_replaced_steps_are_honoured(kernels_loaded: None) -> None:
    """A hook on the optimizer, a global one, or a ``step`` replaced on the instance (as torch's LR
    schedulers wrap it) sends the step through ``optimizer.step()``, where they run."""
    params = _model_params(0)
    opt = th.optim.AdamW(params, fused=True)
    _set_grads(params, 0, 1.0)
    clipped_step(opt, params, 1.0)  # the state
    assert native_step_lists(opt, params) is not None
    calls = []
    handle = opt.register_step_pre_hook(lambda *args: calls.append("pre"))
    clipped_step(opt, params, 1.0)
    handle.remove()
    handle = register_optimizer_step_post_hook(lambda *args: calls.append("global post"))
    try:
        clipped_step(opt, params, 1.0)
    finally:
        handle.remove()
    scheduler = th.optim.lr_scheduler.StepLR(opt, step_size=1)
    assert native_step_lists(opt, params) is None  # its wrapper counts the steps
    clipped_step(opt, params, 1.0)
    scheduler.step()
    assert calls == ["pre", "global post"]


@native
def test_under_a_dispatch_or_function_mode_torchs_step_runs(kernels_loaded: None) -> None:
    """A mode that watches operators (here one that records them) sees the whole step: torch's."""
    params = _model_params(0)
    opt = th.optim.AdamW(params, fused=True)
    _set_grads(params, 0, 1.0)
    clipped_step(opt, params, 1.0)  # the state
    assert native_step_lists(opt, params) is not None
    with OpLog() as log:
        assert native_step_lists(opt, params) is None
        clipped_step(opt, params, 1.0)
    assert "aten._fused_adamw_.default" in log.names
    with th.device("cpu"):
        assert native_step_lists(opt, params) is None


@native
def test_tensors_the_kernel_cannot_step_go_to_torch(kernels_loaded: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-contiguous parameter: the kernel declines before writing anything, and torch's step runs."""

    def steps(allowed: bool) -> list[th.Tensor]:
        with monkeypatch.context() as m:
            if not allowed:
                m.setattr(clipped_step_module, "native_step_lists", lambda *args: None)
            gen = th.Generator().manual_seed(0)
            params = [th.nn.Parameter(th.randn(40, 33, generator=gen).t()), th.nn.Parameter(th.randn(7, generator=gen))]
            opt = th.optim.AdamW(params, fused=True)
            for i in range(3):
                for j, p in enumerate(params):
                    p.grad = th.full_like(p, float(i + j + 1))
                clipped_step(opt, params, 1.0)
            assert native_step_lists(opt, params) is not None  # the group qualifies; the tensors do not
            return [t.detach().clone() for p in params for t in (p, *opt.state[p].values())]

    assert all(th.equal(a, b) for a, b in zip(steps(True), steps(False), strict=True))
