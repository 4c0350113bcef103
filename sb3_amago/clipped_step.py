"""The optimizer's step on gradients clipped to a maximum total norm, as
``torch.nn.utils.clip_grad_norm_`` followed by ``optimizer.step()``.

Clipping rescales every gradient by ``max_norm / (norm + 1e-6)`` where that is below 1: a pass that
reads and writes all of them (1.5 M floats for the reference model) between the norm and the step.
An optimizer whose step takes a gradient scale (torch's fused AdamW, Adam and SGD, the default
being fused AdamW: :func:`~sb3_amago.policies.default_optimizer_kwargs`) divides each gradient by
the scale as it reads it, inside its one pass, so there the clip is handed over as that scale
instead of applied apart: on a CPU the compiled fp32 update at L = 64 ran 1.023x faster (an Intel
Xeon, 2 threads, both ways alternated in one process, 8 rounds, each faster). Dividing by the
scale and multiplying by its inverse round differently in the last bit; the clipped gradients are
the same otherwise (and written back to ``.grad`` by the step, as the apart clip leaves them).
"""

from collections.abc import Sequence

import torch as th

#: Added to the norm before dividing, as ``clip_grad_norm_`` does.
EPS = 1e-6


def total_grad_norm(grads: Sequence[th.Tensor]) -> th.Tensor:
    """The 2-norm of ``grads`` together, as ``clip_grad_norm_`` computes it: the norm of the
    per-tensor norms (0 for none)."""
    if not grads:
        return th.zeros(())
    return th.linalg.vector_norm(th.stack(th._foreach_norm(list(grads), 2.0)), 2.0)


def takes_grad_scale(optimizer: th.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` reads a gradient scale (``optimizer.grad_scale``, the attribute
    torch's ``GradScaler`` sets for fused optimizers): torch's optimizers whose every parameter group
    is fused (a group's own setting, which a loaded state dict may have changed from the constructor's)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False)) and all(
        group.get("fused") for group in optimizer.param_groups
    )


def clipped_step(optimizer: th.optim.Optimizer, params: Sequence[th.Tensor], max_norm: float) -> th.Tensor:
    """``clip_grad_norm_(params, max_norm)`` then ``optimizer.step()``: the gradients are scaled by
    ``min(1, max_norm / (norm + 1e-6))`` before the step reads them, in the step's own pass where
    the optimizer takes a gradient scale (:func:`takes_grad_scale`). Returns the total norm before
    clipping, as ``clip_grad_norm_`` does. No host synchronisation on any device.

    :param params: the parameters ``optimizer`` steps (those without a gradient are skipped)
    """
    grads = [p.grad for p in params if p.grad is not None]
    total = total_grad_norm(grads)
    if takes_grad_scale(optimizer):
        optimizer.grad_scale = th.clamp((total + EPS) / max_norm, min=1.0)  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale  # type: ignore[attr-defined]
        return total
    if grads:
        th._foreach_mul_(grads, th.clamp(max_norm / (total + EPS), max=1.0))
    optimizer.step()
    return total
