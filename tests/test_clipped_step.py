"""The clipped optimizer step against torch's ``clip_grad_norm_`` followed by ``step()``."""

import copy

import pytest
import torch as th

from sb3_amago.clipped_step import clipped_step, takes_grad_scale, total_grad_norm


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
