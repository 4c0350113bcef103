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

On the CPU, with the package's kernels built (:mod:`sb3_amago.nets.cpu_kernels`), the default
optimizer's clipped step runs as one C++ call (``sb3_amago/nets/cpu_adamw.cpp``): the norms, then
AdamW's arithmetic over all the tensors, each a parallel region over every tensor at once where
torch's take one per tensor, and without the step's Python loop over the parameters. The same values
bit for bit as torch's step; :func:`native_step_lists` says when it runs.
"""

from collections.abc import Sequence
from numbers import Real

import torch as th
import torch.optim.optimizer as torch_optimizer

from sb3_amago.nets import cpu_kernels

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


#: The settings of an AdamW group the native step runs: those that change its arithmetic at their defaults.
_NATIVE_GROUP = {"fused": True, "amsgrad": False, "maximize": False, "capturable": False, "differentiable": False}


def native_step_lists(optimizer: th.optim.Optimizer, params: Sequence[th.Tensor]) -> list[list[th.Tensor]] | None:
    """The parameters, gradients, moments and step counts the native clipped step reads, or None where
    torch's step must run: the kernels are not loaded; ``optimizer`` is not exactly torch's fused
    ``AdamW`` with one parameter group at its arithmetic's defaults (no AMSGrad, ``maximize``,
    ``capturable``, ``differentiable``) and numbers for its settings; a step hook is registered
    (on it or globally) or its ``step`` is replaced (as torch's LR schedulers wrap it); its state is not
    made yet (the first step makes it); ``params`` (those with a gradient) are not the group's
    parameters with a gradient, in order; or a torch dispatch or function mode is active (a
    ``FlopCounterMode``, an operator counter, ``with torch.device(...)``): it would not see the work the
    kernel does on its threads. The kernel checks the tensors themselves (contiguous fp32 CPU tensors)
    and leaves the step to torch where they are not."""
    if not cpu_kernels.loaded() or type(optimizer) is not th.optim.AdamW or "step" in vars(optimizer):
        return None
    if th._C._len_torch_dispatch_stack() > 0 or th._C._len_torch_function_stack() > 0:
        return None
    hooks = (
        getattr(optimizer, "_optimizer_step_pre_hooks", None),
        getattr(optimizer, "_optimizer_step_post_hooks", None),
        getattr(torch_optimizer, "_global_optimizer_pre_hooks", None),
        getattr(torch_optimizer, "_global_optimizer_post_hooks", None),
    )
    if any(h is None or len(h) > 0 for h in hooks) or len(optimizer.param_groups) != 1:
        return None
    group = optimizer.param_groups[0]
    if any(group.get(key) != value for key, value in _NATIVE_GROUP.items()) or not all(
        isinstance(x, Real) for x in (group["lr"], *group["betas"], group["eps"], group["weight_decay"])
    ):
        return None
    stepped = [p for p in group["params"] if p.grad is not None]
    given = [p for p in params if p.grad is not None]
    if len(stepped) != len(given) or any(a is not b for a, b in zip(stepped, given, strict=True)):
        return None
    states = []
    for p in stepped:
        state = optimizer.state.get(p)
        if not state or "step" not in state:
            return None
        states.append(state)
    return [
        stepped,
        [p.grad for p in stepped],
        [state["exp_avg"] for state in states],
        [state["exp_avg_sq"] for state in states],
        [state["step"] for state in states],
    ]


def clipped_step(optimizer: th.optim.Optimizer, params: Sequence[th.Tensor], max_norm: float) -> th.Tensor:
    """``clip_grad_norm_(params, max_norm)`` then ``optimizer.step()``: the gradients are scaled by
    ``min(1, max_norm / (norm + 1e-6))`` before the step reads them, in the step's own pass where
    the optimizer takes a gradient scale (:func:`takes_grad_scale`) and no gradient is fp64. Returns
    the total norm before clipping, as ``clip_grad_norm_`` does. No host synchronisation on any device.

    :param params: the parameters ``optimizer`` steps (those without a gradient are skipped)
    """
    native = native_step_lists(optimizer, params)
    if native is not None:
        group = optimizer.param_groups[0]
        beta1, beta2 = group["betas"]
        total = cpu_kernels.kernels().clipped_adamw_step(
            *native, group["lr"], beta1, beta2, group["weight_decay"], group["eps"], max_norm, EPS
        )
        if total is not None:
            return total
    grads = [p.grad for p in params if p.grad is not None]
    total = total_grad_norm(grads)
    if takes_grad_scale(optimizer) and all(g.dtype != th.float64 for g in grads):
        # A fused step reads its scale in fp32 (as torch's GradScaler keeps it): fp64 gradients are clipped
        # apart, at their own precision, and a norm in half precision is widened.
        optimizer.grad_scale = th.clamp((total + EPS) / max_norm, min=1.0).float()  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale  # type: ignore[attr-defined]
        return total
    if grads:
        th._foreach_mul_(grads, th.clamp(max_norm / (total + EPS), max=1.0))
    optimizer.step()
    return total
