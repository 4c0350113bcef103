"""Tests of the networks: trajectory encoders (full forward vs cached stepping, padding, sliding
window), sigma-reparameterisation, the timestep encoder, the action-input critics, dtypes and error messages."""

import copy
import math
import pickle
from typing import Any, cast

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.preprocessing import get_action_dim, preprocess_obs
from stable_baselines3.common.torch_layers import CombinedExtractor, FlattenExtractor, NatureCNN
from torch import nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from sb3_amago.keys import OBS_KEY
from sb3_amago.nets import SigmaReparamLinear, TrajEncoder, TransformerTrajEncoder, cpu_kernels, make_traj_encoder
from sb3_amago.nets.heads import ActionInputCritics, gamma_features
from sb3_amago.nets.rotary import apply_rotary, rotary_tables
from sb3_amago.nets.timestep import RunningNorm, TimestepEncoder, observation_preprocessor
from sb3_amago.nets.transformer import (
    CPU_MATH_ATTENTION_MAX_STEPS,
    causal_attention,
    causal_math_attention,
    sinusoidal_embedding,
    torch_causal_attention,
)

D_IN = 5
SMALL = {
    "transformer": {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 2},
    "transformer_sinusoidal": {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 2, "pos_emb": "sinusoidal"},
    "transformer_learnable": {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 2, "pos_emb": "learnable", "max_time": 300},
    "transformer_none": {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 2, "pos_emb": "none"},
    "gru": {"d_hidden": 16},
    "ff": {"d_hidden": 16},
}


def make_encoder(kind: str, max_seq_len: int = 6) -> TrajEncoder:
    return make_traj_encoder(kind.split("_")[0], D_IN, max_seq_len, **SMALL[kind])


def full_forward(encoder: TrajEncoder, x: th.Tensor, time_idx: th.Tensor) -> th.Tensor:
    """Unpadded full forward of one sequence ``(L, d_in)`` -> ``(L, out_dim)``."""
    return encoder(x[None], time_idx[None], th.ones(1, len(x), dtype=th.bool))[0]


DICT_SPACE = spaces.Dict(
    {
        "vec": spaces.Box(-5, 5, (4,)),
        "cell": spaces.Discrete(3),
        "image": spaces.Box(0, 255, (36, 36, 3), np.uint8),
        "instruction": spaces.MultiDiscrete([5, 5, 5]),
        "achieved": spaces.MultiDiscrete([5, 5]),
    }
)
ACTION_SPACES = [spaces.Discrete(4), spaces.MultiDiscrete([2, 3]), spaces.Box(-1, 1, (2,))]


def sample_obs(space: spaces.Space, batch: int, length: int) -> th.Tensor | dict[str, th.Tensor]:
    """Random observations ``(B, L, *shape)`` in the dtypes SB3's buffers store."""
    if isinstance(space, spaces.Dict):
        return {key: sample_obs(sub, batch, length) for key, sub in space.spaces.items()}
    samples = np.stack([space.sample() for _ in range(batch * length)])
    return th.as_tensor(samples).reshape(batch, length, *(space.shape or (1,)))


def sample_prev_actions(action_space: spaces.Space, batch: int, length: int) -> th.Tensor:
    samples = np.stack([action_space.sample() for _ in range(batch * length)]).astype(np.float32)
    return th.as_tensor(samples).reshape(batch, length, get_action_dim(action_space))


def timestep_inputs(space: spaces.Space, action_space: spaces.Space, batch: int = 2, length: int = 5) -> tuple:
    time_idx = th.arange(length).repeat(batch, 1) + th.tensor([[0], [7]])[:batch]
    real = th.ones(batch, length, dtype=th.bool)
    real[-1, length - 2 :] = False
    return sample_obs(space, batch, length), sample_prev_actions(action_space, batch, length), time_idx, real


# ---------------------------------------------------------------------------------------------
# Trajectory encoders
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(SMALL))
def test_step_matches_full_forward(kind: str) -> None:
    """Cached stepping of N envs (different start times, resets, runs past max_seq_len) equals the
    full forward over each env's context: the last max_seq_len steps (transformer, ff) or the whole
    rollout (gru), with their global time indices."""
    window, n_envs, n_steps = 6, 3, 24
    encoder = make_encoder(kind, window).eval()
    resets = {0: {0, 1, 2}, 3: {1}, 5: {2}, 14: {0}, 17: {1}}
    time_offset = [0, 40, 250 - n_steps]  # the third env ends near the learnable table's end
    histories: list[list[tuple[th.Tensor, int]]] = [[] for _ in range(n_envs)]
    state = encoder.init_state(n_envs, "cpu")
    xs = th.randn(n_steps, n_envs, D_IN)
    for t in range(n_steps):
        done = th.tensor([i in resets.get(t, ()) for i in range(n_envs)])
        state = encoder.reset_state(state, done)
        for i in np.flatnonzero(done.numpy()):
            histories[i] = []
        time_idx = th.tensor([len(histories[i]) + time_offset[i] for i in range(n_envs)])
        for i in range(n_envs):
            histories[i].append((xs[t, i], int(time_idx[i])))
        out, state = encoder.step(xs[t], time_idx, state)
        assert out.shape == (n_envs, encoder.out_dim)
        for i in range(n_envs):
            context = histories[i] if kind == "gru" else histories[i][-window:]
            expected = full_forward(encoder, th.stack([x for x, _ in context]), th.tensor([s for _, s in context]))
            th.testing.assert_close(out[i], expected[-1], atol=1e-5, rtol=0)
    assert max(len(h) for h in histories) > window  # the sliding window was exercised


@pytest.mark.parametrize("n_layers", [1, 2])
def test_rolled_cache_matches_recompute_inside_the_window_and_with_one_layer(n_layers: int) -> None:
    """``window_slide="roll"`` equals ``"recompute"`` while the context is not full; past the window
    it reuses stale upper-layer keys, so it still equals it with one layer (layer-0 keys depend on
    their own step alone) and departs from it with two."""
    window, n_envs, n_steps = 6, 2, 20
    kwargs = {**SMALL["transformer"], "n_layers": n_layers}
    exact = make_traj_encoder("transformer", D_IN, window, **kwargs).eval()
    rolled = make_traj_encoder("transformer", D_IN, window, window_slide="roll", **kwargs).eval()
    rolled.load_state_dict(exact.state_dict())
    exact_state, rolled_state = exact.init_state(n_envs, "cpu"), rolled.init_state(n_envs, "cpu")
    gaps = []
    for t in range(n_steps):
        x, time_idx = th.randn(n_envs, D_IN), th.full((n_envs,), t)
        exact_out, exact_state = exact.step(x, time_idx, exact_state)
        rolled_out, rolled_state = rolled.step(x, time_idx, rolled_state)
        gaps.append(float((exact_out - rolled_out).abs().max()))
    assert max(gaps[:window]) < 1e-5
    if n_layers == 1:
        assert max(gaps) < 1e-5
    else:
        assert min(gaps[window:]) > 1e-4


def test_unknown_window_slide_is_named() -> None:
    with pytest.raises(ValueError, match="window_slide"):
        make_traj_encoder("transformer", D_IN, 6, window_slide="shift", **SMALL["transformer"])


@pytest.mark.parametrize("kind", list(SMALL))
def test_padding_does_not_change_real_outputs(kind: str) -> None:
    encoder = make_encoder(kind, 8).eval()
    lengths = [8, 3, 5]
    x = th.randn(3, 8, D_IN)
    time_idx = th.arange(8).repeat(3, 1) + 10
    real = th.arange(8)[None] < th.tensor(lengths)[:, None]
    garbage = x.clone()
    garbage[~real] = th.tensor([float("nan"), float("inf"), 1e6, -3.0, 0.0])
    garbage_time = time_idx.masked_fill(~real, 10**9 if kind != "transformer_learnable" else -7)
    out = encoder(garbage, garbage_time, real)
    assert out.isfinite().all()
    for b, n in enumerate(lengths):
        th.testing.assert_close(out[b, :n], full_forward(encoder, x[b, :n], time_idx[b, :n]), atol=1e-5, rtol=0)


def test_rotary_attention_sees_only_time_offsets() -> None:
    """Rotary: shifting every time index alike leaves the output unchanged; changing one gap does not."""
    encoder = make_encoder("transformer").eval()
    x, mask = th.randn(1, 5, D_IN), th.ones(1, 5, dtype=th.bool)
    times = th.tensor([[0, 1, 2, 3, 4]])
    start = encoder(x, times, mask)
    th.testing.assert_close(encoder(x, times + 9_000, mask), start, atol=2e-4, rtol=0)
    gap = encoder(x, th.tensor([[0, 1, 2, 3, 9]]), mask)
    th.testing.assert_close(gap[:, :4], start[:, :4], atol=1e-5, rtol=0)
    assert (gap[:, 4] - start[:, 4]).abs().max() > 1e-3


def test_compiled_transformer_trains_on_windows_of_changing_length() -> None:
    """``compile_model=True`` compiles the encoder with dynamic shapes; a batch whose window is shorter
    than the first one's (the replay trims windows to their longest real rollout) runs forward and
    backward, with the eager encoder's values and gradients (a copy taking the same power steps)."""
    th.manual_seed(0)
    encoder = TransformerTrajEncoder(D_IN, 12, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0)
    eager = copy.deepcopy(encoder)
    compiled = th.compile(encoder, dynamic=True)
    for length in (12, 9):
        x = th.randn(3, length, D_IN)
        time_idx, real = th.arange(length).expand(3, length), th.ones(3, length, dtype=th.bool)
        results = []
        for net, params in ((compiled, encoder), (eager, eager)):
            params.zero_grad()
            out = net(x, time_idx, real)
            out.square().sum().backward()
            results.append((out.detach(), params.blocks[0].qkv.weight.grad))
        th.testing.assert_close(results[0], results[1], atol=1e-4, rtol=1e-4)


def test_rotary_rotation_by_hand() -> None:
    """Each feature pair (i, i + d/2) turns by t * base^(-i / (d/2)); q.k depends on t_q - t_k only."""
    cos, sin = rotary_tables(th.tensor([[0, 1, 3]]), d_head=4)  # (1, 1, 3, 4): per feature, pairs (0, 2) and (1, 3)
    th.testing.assert_close(cos[0, 0, :, 0], th.tensor([1.0, math.cos(1.0), math.cos(3.0)]))
    th.testing.assert_close(cos[0, 0, :, 2], cos[0, 0, :, 0])
    th.testing.assert_close(sin[0, 0, :, 3], th.tensor([0.0, math.sin(0.01), math.sin(0.03)]))
    th.testing.assert_close(sin[0, 0, :, 1], -sin[0, 0, :, 3])
    x = th.tensor([1.0, 2.0, 3.0, 4.0]).expand(1, 1, 3, 4)
    rotated = apply_rotary(x, (cos, sin))
    th.testing.assert_close(
        rotated[0, 0, 1],
        th.tensor(
            [
                math.cos(1) - 3 * math.sin(1),
                2 * math.cos(0.01) - 4 * math.sin(0.01),
                math.sin(1) + 3 * math.cos(1),
                2 * math.sin(0.01) + 4 * math.cos(0.01),
            ]
        ),
    )
    th.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))
    q, k = th.randn(4), th.randn(4)

    def score(t_q: int, t_k: int) -> th.Tensor:
        (cq, sq), (ck, sk) = rotary_tables(th.tensor([[t_q]]), 4), rotary_tables(th.tensor([[t_k]]), 4)
        return (apply_rotary(q.view(1, 1, 1, 4), (cq, sq)) * apply_rotary(k.view(1, 1, 1, 4), (ck, sk))).sum()

    th.testing.assert_close(score(7, 3), score(107, 103), atol=1e-5, rtol=0)
    assert (score(7, 3) - score(7, 5)).abs() > 1e-3


def test_sinusoidal_embedding_by_hand() -> None:
    """[sin, cos] halves at frequencies 10000^(-i / (d/2)), added to the projected input at each step's global time."""
    emb = sinusoidal_embedding(th.tensor([0, 2]), d_model=4)
    th.testing.assert_close(
        emb, th.tensor([[0.0, 0.0, 1.0, 1.0], [math.sin(2.0), math.sin(0.02), math.cos(2.0), math.cos(0.02)]])
    )
    encoder = make_encoder("transformer_sinusoidal")
    x, times = th.randn(2, 3, D_IN), th.tensor([[0, 1, 2], [50, 51, 52]])
    th.testing.assert_close(encoder._embed(x, times), encoder.input_proj(x) + sinusoidal_embedding(times, 16))


def test_learnable_table_row_reaches_only_steps_at_and_after_its_time() -> None:
    """Learnable positions: editing the row of global time 42 changes the outputs from the step at time 42 on."""
    encoder = make_encoder("transformer_learnable").eval()
    x, mask = th.randn(1, 5, D_IN), th.ones(1, 5, dtype=th.bool)
    times = th.arange(40, 45)[None]  # a window cut from the middle of a rollout
    before = encoder(x, times, mask)
    with th.no_grad():
        encoder.pos_table.weight[42] += th.randn(16)  # not a constant shift, which LayerNorm would remove
    after = encoder(x, times, mask)
    th.testing.assert_close(after[:, :2], before[:, :2])
    assert ((after[:, 2:] - before[:, 2:]).abs().amax(-1) > 1e-3).all()


@pytest.mark.parametrize("kind", list(SMALL))
def test_gradients_reach_every_parameter(kind: str) -> None:
    encoder = make_encoder(kind, 8).train()
    out = encoder(th.randn(2, 8, D_IN), th.arange(8).repeat(2, 1), th.ones(2, 8, dtype=th.bool))
    (out[:, -1] * th.randn_like(out[:, -1])).sum().backward()
    for name, param in encoder.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


@pytest.mark.parametrize("kind", list(SMALL))
def test_persistent_buffers_are_floating(kind: str) -> None:
    for name, value in make_encoder(kind).state_dict().items():
        assert value.is_floating_point(), name


@pytest.mark.parametrize("kind", list(SMALL))
def test_bf16_autocast_and_float64(kind: str) -> None:
    encoder = make_encoder(kind).eval()
    x, time_idx, mask = th.randn(2, 6, D_IN), th.arange(6).repeat(2, 1), th.ones(2, 6, dtype=th.bool)
    with th.autocast("cpu", dtype=th.bfloat16):
        out = encoder(x, time_idx, mask)
        state = encoder.init_state(2, "cpu", th.bfloat16)
        for t in range(8):
            step_out, state = encoder.step(x[:, t % 6], time_idx[:, t % 6] + t, state)
    assert out.isfinite().all() and step_out.isfinite().all()
    encoder = encoder.double()
    out = encoder(x.double(), time_idx, mask)
    step_out, _ = encoder.step(x[:, 0].double(), time_idx[:, 0], encoder.init_state(2, "cpu", th.float64))
    assert out.dtype == step_out.dtype == th.float64
    th.testing.assert_close(step_out, out[:, 0])


class _AttentionDtypes(TorchDispatchMode):
    """Records the dtype of the query of every flash-attention kernel, of the first operand of
    every batched product (the math backend's attention: the layers' products are not batched), and
    of the query of every call of the package's CPU attention kernel, that runs under it."""

    def __init__(self) -> None:
        super().__init__()
        self.flash: list[th.dtype] = []
        self.bmm: list[th.dtype] = []
        self.package: list[th.dtype] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if "scaled_dot_product" in str(func):
            self.flash.append(args[0].dtype)
        elif func is th.ops.aten.bmm.default:
            self.bmm.append(args[0].dtype)
        elif func is th.ops.sb3_amago.causal_attention.default:
            self.package.append(args[0].dtype)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("length", [6, CPU_MATH_ATTENTION_MAX_STEPS + 1])
@pytest.mark.parametrize("kernels", ["package", "torch"])
def test_training_attention_runs_in_fp32_under_cpu_bf16_autocast(
    length: int, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CPU flash attention is several times slower in bf16 (backward above all): the full forward
    # keeps attention in fp32, on the package's kernel where it is built, else on torch's math backend
    # (short windows) or flash kernel, and the rest of the block in bf16.
    if kernels == "torch":
        monkeypatch.setattr(cpu_kernels, "CHOICE", "torch")
    elif not cpu_kernels.load():
        pytest.skip("the package's CPU attention kernel is not built on this CPU")
    encoder = make_encoder("transformer", max_seq_len=length).train()
    x, time_idx = th.randn(2, length, D_IN), th.arange(length).repeat(2, 1)
    mask = th.ones(2, length, dtype=th.bool)
    recorder = _AttentionDtypes()
    with recorder:
        with th.autocast("cpu", dtype=th.bfloat16):
            out = encoder(x, time_idx, mask)
        out.float().sum().backward()  # outside autocast, as AMAGO.train runs it
    n_layers = len(cast(TransformerTrajEncoder, encoder).blocks)
    if kernels == "package":
        assert recorder.package == [th.float32] * n_layers and recorder.flash == [] and recorder.bmm == []
    elif length <= CPU_MATH_ATTENTION_MAX_STEPS:
        assert recorder.flash == [] and len(recorder.bmm) >= 2 * n_layers  # scores and output per layer
        assert set(recorder.bmm) == {th.float32}
    else:
        assert recorder.flash == [th.float32] * (2 * n_layers)  # forward and backward kernel per layer
    assert out.dtype == th.bfloat16 and out.isfinite().all()


@pytest.mark.parametrize("length", [5, CPU_MATH_ATTENTION_MAX_STEPS, CPU_MATH_ATTENTION_MAX_STEPS + 1])
@pytest.mark.parametrize("attention", [causal_attention, torch_causal_attention], ids=["default", "torch"])
def test_causal_attention_is_causal_softmax_attention(length: int, attention: Any) -> None:
    """The package's CPU kernel where it is built and torch's backends (math up to
    CPU_MATH_ATTENTION_MAX_STEPS steps, flash above) compute causal softmax attention, values and gradients."""
    th.manual_seed(0)
    q, k, v = (th.randn(2, 3, length, 16, requires_grad=True) for _ in range(3))
    out = attention(q, k, v)
    scores = (q @ k.transpose(-1, -2)) / 4.0  # (B, H, L, L), 1 / sqrt(16)
    future = th.ones(length, length, dtype=th.bool).triu(1)
    expected = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
    th.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grads = th.autograd.grad(out.square().sum(), (q, k, v))
    expected_grads = th.autograd.grad(expected.square().sum(), (q, k, v))
    for grad, expected_grad in zip(grads, expected_grads):
        th.testing.assert_close(grad, expected_grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("length", [1, 7, 65])
def test_causal_math_attention_is_torchs_math_backend_bit_for_bit(length: int) -> None:
    """The same values and gradients as ``scaled_dot_product_attention`` on the math backend, on
    query, key and value views of one projection laid out as the Transformer's (strided)."""
    gen = th.Generator().manual_seed(length)
    qkv_init = th.randn(3, 2, length, 4, 16, generator=gen).permute(0, 1, 3, 2, 4)  # (3, B, H, L, Dh)
    grad_out = th.randn(2, 4, length, 16, generator=gen)

    def run(fn) -> tuple[th.Tensor, th.Tensor]:
        qkv = qkv_init.clone().requires_grad_()
        out = fn(*qkv.unbind(0))
        out.backward(grad_out)
        return out.detach(), qkv.grad

    def torchs(q: th.Tensor, k: th.Tensor, v: th.Tensor) -> th.Tensor:
        with sdpa_kernel([SDPBackend.MATH]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    (out, grad), (ref, ref_grad) = run(causal_math_attention), run(torchs)
    assert th.equal(out, ref) and th.equal(grad, ref_grad)


@pytest.mark.skipif(not th.cuda.is_available(), reason="needs a GPU")
def test_cuda_training_attention_keeps_off_cudnn() -> None:
    # torch picks cuDNN attention for bf16 on Hopper, at milliseconds of host time a call for this
    # model's small heads: the encoder's forward and backward run torch's own kernels instead.
    encoder = make_encoder("transformer").train().cuda()
    x = th.randn(2, 6, D_IN, device="cuda")
    time_idx, mask = th.arange(6, device="cuda").repeat(2, 1), th.ones(2, 6, dtype=th.bool, device="cuda")
    with th.profiler.profile(activities=[th.profiler.ProfilerActivity.CPU]) as prof, th.autocast("cuda", dtype=th.bfloat16):
        encoder(x, time_idx, mask).float().sum().backward()
    names = [event.key for event in prof.key_averages()]
    assert any("scaled_dot_product" in name for name in names)
    assert not any("cudnn_attention" in name for name in names), names


def test_transformer_errors() -> None:
    encoder = make_encoder("transformer", max_seq_len=4)
    with pytest.raises(ValueError, match=r"length 5 exceeds max_seq_len=4"):
        encoder(th.randn(1, 5, D_IN), th.arange(5)[None], th.ones(1, 5, dtype=th.bool))
    learnable = TransformerTrajEncoder(D_IN, 4, d_model=8, n_heads=2, pos_emb="learnable", max_time=10)
    with pytest.raises(ValueError, match=r"Time index 12 .* size max_time=10"):
        learnable(th.randn(1, 4, D_IN), th.arange(4)[None] + 9, th.ones(1, 4, dtype=th.bool))
    with pytest.raises(ValueError, match=r"Time index 10 .* size max_time=10"):
        learnable.step(th.randn(2, D_IN), th.tensor([3, 10]), learnable.init_state(2, "cpu"))
    with pytest.raises(ValueError, match="needs max_time"):
        TransformerTrajEncoder(D_IN, 4, pos_emb="learnable")
    with pytest.raises(ValueError, match="Unknown trajectory encoder 'lstm'"):
        make_traj_encoder("lstm", D_IN, 4)


# ---------------------------------------------------------------------------------------------
# Sigma reparameterisation
# ---------------------------------------------------------------------------------------------
def test_sigma_reparam_identity_at_init_and_power_iteration() -> None:
    layer = SigmaReparamLinear(20, 30).eval()
    x = th.randn(7, 20)
    th.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    with th.no_grad():
        layer.weight.copy_(th.randn(30, 20))
    true_sigma = th.linalg.matrix_norm(layer.weight.detach(), ord=2)
    assert abs(layer.sigma().item() - true_sigma.item()) > 1e-2
    layer.train()
    for _ in range(200):
        layer(x)
    th.testing.assert_close(layer.sigma().detach(), true_sigma, rtol=1e-4, atol=0)
    frozen = (layer.u.clone(), layer.v.clone())
    with th.no_grad():
        layer.weight.mul_(th.rand_like(layer.weight))
    layer.eval()
    layer(x)
    assert th.equal(layer.u, frozen[0]) and th.equal(layer.v, frozen[1])


# ---------------------------------------------------------------------------------------------
# Timestep encoder
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("action_space", ACTION_SPACES, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("obs_kind", ["box", "dict"])
def test_timestep_encoder_shapes_and_gradients(obs_kind: str, action_space: spaces.Space) -> None:
    space = spaces.Box(-1, 1, (3,)) if obs_kind == "box" else DICT_SPACE
    encoder = TimestepEncoder(space, action_space, d_out=16, hidden_sizes=(32, 32))
    obs, prev_actions, time_idx, real = timestep_inputs(space, action_space)
    out = encoder(obs, prev_actions, time_idx, real)
    assert out.shape == (2, 5, 16) and out.isfinite().all()
    assert (out[~real] == 0).all()
    (out[0, -1] * th.randn(16)).sum().backward()
    for name, param in encoder.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    for name, value in encoder.state_dict().items():
        assert value.is_floating_point(), name


@pytest.mark.parametrize("cnn", ["nature", "impala"])
def test_timestep_encoder_bf16_autocast(cnn: str) -> None:
    encoder = TimestepEncoder(
        DICT_SPACE, ACTION_SPACES[0], features_extractor_kwargs={"cnn": cnn}, d_out=16, hidden_sizes=(32,)
    )
    with th.autocast("cpu", dtype=th.bfloat16):
        out = encoder(*timestep_inputs(DICT_SPACE, ACTION_SPACES[0]))
    assert out.isfinite().all()


@pytest.mark.parametrize(
    "space, extractor_class, kwargs",
    [
        (spaces.Box(-1, 1, (3,)), FlattenExtractor, {}),
        (spaces.Box(0, 255, (3, 36, 36), np.uint8), NatureCNN, {"features_dim": 32}),
        (spaces.Dict({"vec": spaces.Box(-1, 1, (3,)), "cell": spaces.Discrete(3)}), CombinedExtractor, {}),
    ],
    ids=["flatten", "nature_cnn", "combined"],
)
def test_timestep_encoder_with_sb3_extractors(space: spaces.Space, extractor_class: type, kwargs: dict) -> None:
    encoder = TimestepEncoder(space, ACTION_SPACES[2], extractor_class, kwargs, d_out=16, hidden_sizes=(32,))
    assert isinstance(encoder.features_extractor, extractor_class)
    out = encoder(*timestep_inputs(space, ACTION_SPACES[2]))
    assert out.shape == (2, 5, 16) and out.isfinite().all()


def test_previous_action_features() -> None:
    encoder = TimestepEncoder(spaces.Box(-1, 1, (3,)), spaces.MultiDiscrete([2, 3]), d_out=8, hidden_sizes=())
    prev_actions = th.tensor([[[1.0, 2.0], [0.0, 1.0], [1.0, 0.0]]])
    features = encoder.action_features(prev_actions, th.tensor([[0, 1, 2]]))
    expected = th.tensor([[[0, 0, 0, 0, 0, 1], [1, 0, 0, 1, 0, 0], [0, 1, 1, 0, 0, 0]]], dtype=th.float32)
    th.testing.assert_close(features, expected)


def test_running_norm_ignores_padding_and_is_frozen_in_eval() -> None:
    space = spaces.Box(-np.inf, np.inf, (2,))
    encoder = TimestepEncoder(space, ACTION_SPACES[0], d_out=8, hidden_sizes=())
    norm = encoder.obs_norms[OBS_KEY]
    obs, prev_actions, time_idx, real = timestep_inputs(space, ACTION_SPACES[0], length=6)
    obs = obs * 3.0 + 5.0
    obs[~real] = 1e4
    encoder(obs, prev_actions, time_idx, real)
    real_obs = obs[real]  # (n_real, 2)
    th.testing.assert_close(norm.mean, real_obs.mean(0))
    th.testing.assert_close(norm.var, real_obs.var(0, unbiased=False))
    frozen = {k: v.clone() for k, v in norm.state_dict().items()}
    encoder.eval()
    encoder(obs + 100.0, prev_actions, time_idx, real)
    for key, value in norm.state_dict().items():
        assert th.equal(value, frozen[key]), key


def test_running_norm_is_a_bias_corrected_ema() -> None:
    rate = 0.1
    norm = RunningNorm((3,), rate=rate).train()
    batches = [th.randn(10, 3) * s + s for s in (1.0, 4.0, 2.0)]
    for batch in batches:
        norm(batch, th.ones(10, dtype=th.bool))
    first = second = th.zeros(3, dtype=th.float64)
    for batch in batches:
        first = (1 - rate) * first + rate * batch.double().mean(0)
        second = (1 - rate) * second + rate * (batch.double() ** 2).mean(0)
    debias = 1 - (1 - rate) ** len(batches)
    mean = first / debias
    th.testing.assert_close(norm.mean.double(), mean, rtol=1e-5, atol=1e-6)
    th.testing.assert_close(norm.var.double(), second / debias - mean**2, rtol=1e-5, atol=1e-5)


def test_timestep_encoder_validation_errors() -> None:
    encoder = TimestepEncoder(DICT_SPACE, ACTION_SPACES[0], d_out=8, hidden_sizes=(16,))
    obs, prev_actions, time_idx, real = timestep_inputs(DICT_SPACE, ACTION_SPACES[0])
    bad_shape = dict(obs, vec=th.zeros(2, 5, 3))
    with pytest.raises(ValueError, match=r"'vec'.*expected shape \(2, 5, 4\).*received \(2, 5, 3\)"):
        encoder(bad_shape, prev_actions, time_idx, real)
    bad_dtype = dict(obs, image=obs["image"].float())
    with pytest.raises(ValueError, match=r"'image'.*expected uint8, received dtype torch.float32"):
        encoder(bad_dtype, prev_actions, time_idx, real)
    missing = {k: v for k, v in obs.items() if k != "cell"}
    with pytest.raises(ValueError, match=r"'cell' is missing"):
        encoder(missing, prev_actions, time_idx, real)
    with pytest.raises(ValueError, match=r"prev_actions: expected shape \(2, 5, 1\).*received \(2, 5, 2\)"):
        encoder(obs, th.zeros(2, 5, 2), time_idx, real)
    obs_no_achieved = {k: v for k, v in obs.items() if k != "achieved"}
    discrete_flat = dict(obs_no_achieved, cell=obs["cell"][..., 0])
    assert encoder(discrete_flat, prev_actions, time_idx, real).isfinite().all()


# ------------------------------------------------------------------------------ FastDropout
@pytest.mark.parametrize("p", [0.05, 0.3])
def test_fast_dropout_drops_at_its_rate_and_keeps_the_expectation(p: float) -> None:
    from sb3_amago.nets.dropout import FastDropout, keep_mask

    mask = keep_mask(th.Size((400, 1000)), p, th.float32, th.device("cpu"))
    p_eff = round(p * 2**15) / 2**15
    assert mask.unique().tolist() == pytest.approx([0.0, 1.0 / (1.0 - p_eff)])
    fields = (mask == 0).float().view(-1, 4).mean(0)  # each 16-bit field of a draw
    assert fields.tolist() == pytest.approx([p_eff] * 4, abs=0.006)
    assert mask.mean().item() == pytest.approx(1.0, abs=0.01)
    neighbours = (mask[:, 1:] == 0) & (mask[:, :-1] == 0)  # no dependence between adjacent elements
    assert neighbours.float().mean().item() == pytest.approx(p_eff**2, abs=0.006)

    layer = FastDropout(p)
    x = th.randn(3, 7, 11, requires_grad=True)
    th.manual_seed(1)
    y = layer(x)
    th.manual_seed(1)
    assert th.equal(layer(x), y)  # torch's generator seeds it
    assert not th.equal(layer(x), y)  # and a second call draws another mask
    y.sum().backward()
    assert th.allclose(x.grad, (y / x).detach())  # the gradient is the mask
    assert th.equal(layer.eval()(x), x)


def test_fast_dropout_draws_are_splitmix64() -> None:
    """Draw ``d`` of a mask is SplitMix64's output for the state ``key + d * GAMMA``: the published
    first outputs of SplitMix64 seeded with 1234567 (it adds GAMMA before each output)."""
    from sb3_amago.nets.dropout import _GAMMA, splitmix64

    seed = 1234567
    outputs = splitmix64(th.arange(1, 6, dtype=th.int64) * _GAMMA + seed)
    expected = [6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431, 16408922859458223821]
    assert [value % 2**64 for value in outputs.tolist()] == expected


def _mask_kernels(kernels: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Masks from the package's C++ kernel (``native``; skipped where it is not built) or from torch's
    operators (``torch``)."""
    if kernels == "torch":
        monkeypatch.setattr(cpu_kernels, "CHOICE", "torch")
    elif not cpu_kernels.load():
        pytest.skip("the package's CPU kernels are not built on this CPU")


@pytest.mark.parametrize("kernels", ["native", "torch"])
@pytest.mark.parametrize("shape", [(3, 7, 11), (8, 65, 128), (3, 70001), (2, 6), (5,)])
def test_fast_dropout_mask_follows_each_field_of_its_draws(
    shape: tuple[int, ...], kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Element ``i`` is kept exactly when 16-bit field ``i % 4`` of draw ``i // 4`` is at or above the
    threshold, computed here from the key with Python integers, whichever kernel draws the mask
    (the C++ one in vectors of 8 draws, in parallel stretches, and a draw at a time for the rest:
    the shapes cover each); the per-element form that ``torch.compile`` fuses gives the same mask."""
    from sb3_amago.nets.dropout import draw_key, keep_mask, traced_keep_mask, uses_native_mask

    _mask_kernels(kernels, monkeypatch)
    assert uses_native_mask(th.float32, th.device("cpu")) == (kernels == "native")
    p = 0.05
    steps = round(p * 2**15)
    n = math.prod(shape)
    th.manual_seed(3)
    key = draw_key(th.device("cpu"))
    mask = keep_mask(th.Size(shape), p, th.float32, th.device("cpu"), key)
    th.testing.assert_close(traced_keep_mask(th.zeros(shape), p, key), mask, atol=0, rtol=0)
    th.manual_seed(3)
    assert th.equal(keep_mask(th.Size(shape), p, th.float32, th.device("cpu")), mask)  # the default key is draw_key's

    def splitmix64(state: int) -> int:
        z = state % 2**64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        return z ^ (z >> 31)

    draws = [splitmix64(key.item() + d * 0x9E3779B97F4A7C15) for d in range(-(-n // 4))]
    fields = [(draws[i // 4] >> (16 * (i % 4))) & 0xFFFF for i in range(n)]
    signed = np.array([f - 2**16 if f >= 2**15 else f for f in fields])
    kept = (signed >= -(2**15) + 2 * steps).reshape(shape)
    np.testing.assert_array_equal(mask.numpy() > 0, kept)


@pytest.mark.parametrize("kernels", ["native", "torch"])
def test_fast_dropout_compiles_without_a_graph_break(kernels: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torch.compile the layer drops the eager layer's elements (the key from one opaque
    operator, then the C++ kernel's mask as another, or the hash traced into the graph; no graph
    break), two layers in one graph draw two keys, and the backward multiplies by the forward's
    mask, not a second draw."""
    from sb3_amago.nets.dropout import FastDropout

    _mask_kernels(kernels, monkeypatch)
    layer = FastDropout(0.3)
    explanation = th._dynamo.explain(layer)(th.ones(64, 64))
    assert explanation.graph_break_count == 0
    # the C++ kernel's mask as an operator of the graph where the kernels are in use
    assert ("sb3_amago.dropout_keep_mask" in explanation.graphs[0].code) == (kernels == "native")
    compiled = th.compile(lambda x: layer(x) * 2.0, dynamic=True)
    for rows in (200, 150):
        x = th.ones(rows, 200, requires_grad=True)
        th.manual_seed(0)
        eager = layer(x.detach()) * 2.0
        th.manual_seed(0)
        y = compiled(x)
        th.testing.assert_close(y, eager, atol=0, rtol=0)
        assert (y == 0).float().mean().item() == pytest.approx(0.3, abs=0.02)
        y.sum().backward()
        assert x.grad is not None
        th.testing.assert_close(x.grad, y, atol=0, rtol=0)
    first, second = th.compile(lambda x: (layer(x), layer(x)))(th.ones(64, 64))
    assert not th.equal(first, second)


def test_observation_preprocessors_give_sb3s_values() -> None:
    """The encoder's preprocessing, decided per space at construction (no numpy read in the update,
    for torch.compile), gives SB3's ``preprocess_obs`` values and dtype."""
    image = spaces.Box(0, 255, (3, 8, 8), dtype=np.uint8)
    cases = [
        (spaces.Discrete(5), th.tensor([0, 4, 2])),
        (spaces.MultiDiscrete([3, 4]), th.tensor([[0, 3], [2, 1], [1, 0]])),
        (spaces.MultiDiscrete([2]), th.tensor([[1], [0]])),
        (spaces.Box(-1, 1, (2,)), th.tensor([[0.5, -1.0]])),
        (image, th.randint(0, 256, (2, 3, 8, 8), dtype=th.uint8)),
        (spaces.MultiBinary(3), th.tensor([[1, 0, 1]], dtype=th.int8)),
    ]
    for space, x in cases:
        expected = cast(th.Tensor, preprocess_obs(x, space))
        processed = observation_preprocessor(space)(x)
        assert processed.dtype == expected.dtype and th.equal(processed, expected), space


def test_timestep_encoder_pickles_with_every_observation_kind() -> None:
    """The per-space preprocessing and dtype checks the encoder keeps are picklable (plain pickle,
    as multiprocessing and a user's ``pickle.dumps(model.policy)`` use), and survive the trip."""
    space = spaces.Dict(
        {
            "d": spaces.Discrete(3, start=1),
            "m": spaces.MultiDiscrete([2, 3]),
            "b": spaces.MultiBinary(2),
            "x": spaces.Box(-1, 1, (2,)),
            "image": spaces.Box(0, 255, (3, 16, 16), dtype=np.uint8),
        }
    )
    encoder = TimestepEncoder(space, spaces.Discrete(2), d_out=8, hidden_sizes=()).eval()
    restored = pickle.loads(pickle.dumps(encoder))
    obs = {
        key: th.as_tensor(np.stack([part.sample() for _ in range(6)])).view(2, 3, *part.shape)
        for key, part in space.spaces.items()
    }
    args = (obs, th.zeros(2, 3, encoder.action_dim), th.arange(3).expand(2, 3), th.ones(2, 3, dtype=th.bool))
    assert th.equal(restored(*args), encoder(*args))


def _graph_recorder(graphs: list[th.fx.GraphModule]) -> Any:
    """A ``torch.compile`` backend that appends each graph dynamo hands it to ``graphs`` and runs it as traced."""

    def backend(gm: th.fx.GraphModule, example_inputs: list[th.Tensor]) -> Any:
        graphs.append(gm)
        return gm.forward

    return backend


@pytest.mark.parametrize("negative_slope", [0.01, 0.0])
def test_compiled_leaky_relu_takes_eager_values_and_gradients(negative_slope: float) -> None:
    """Under torch.compile the rectifier is the opaque operator with a traced backward (no graph break), with
    ``F.leaky_relu``'s values and input gradients; slope 0 is ``F.relu``'s, zero input included."""
    from sb3_amago.nets.activations import LeakyReLU

    layer = LeakyReLU(negative_slope)
    assert th._dynamo.explain(layer)(th.ones(4, 4)).graph_break_count == 0
    compiled = th.compile(lambda x: layer(x) * 3.0, dynamic=True)
    for rows in (6, 5):
        x = th.randn(rows, 7)
        x[0, :3] = 0.0
        results = []
        for fn in (compiled, lambda x: F.leaky_relu(x, negative_slope) * 3.0):
            leaf = x.clone().requires_grad_(True)
            out = fn(leaf)
            out.backward(th.arange(float(leaf.numel())).view_as(leaf))
            results.append((out.detach(), leaf.grad))
        th.testing.assert_close(results[0], results[1], atol=0, rtol=0)


def test_compiled_leaky_relu_is_opaque_only_where_a_backward_reads_it() -> None:
    """Compiled, an input that needs a gradient goes through the opaque operator (its backward reads
    the output); one that needs none (the target heads, under ``no_grad``) takes the plain rectifier,
    which the compiler fuses, with the same values."""
    from sb3_amago.nets.activations import leaky_relu

    graphs: list[th.fx.GraphModule] = []
    recording_backend = _graph_recorder(graphs)
    compiled = th.compile(lambda x: leaky_relu(x) * 3.0, backend=recording_backend, dynamic=True)
    x = th.randn(6, 7)
    with_grad = compiled(x.clone().requires_grad_(True))
    with th.no_grad():
        without_grad = compiled(x.clone().requires_grad_(True))
    opaque = [any(node.target is th.ops.sb3_amago.leaky_relu.default for node in gm.graph.nodes) for gm in graphs]
    assert opaque == [True, False]
    expected = F.leaky_relu(x, 0.01) * 3.0
    th.testing.assert_close((with_grad.detach(), without_grad), (expected, expected), atol=0, rtol=0)


def test_compiled_update_calls_the_rectifiers_twins_without_autograd() -> None:
    """Under the package's decomposition table the rectifiers' operators are traced with their gradient
    formulas, and the forward graph then calls their twins without autograd (on the CPU with the build:
    no Python per call at run time); values and gradients are eager code's bit for bit."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from sb3_amago.compiled_update import inductor_decompositions
    from sb3_amago.nets.activations import RUN_TIME_OPERATORS, leaky_relu, linear_leaky_relu

    graphs: list[th.fx.GraphModule] = []

    def keep(gm: th.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return make_boxed_func(gm)

    def fn(x: th.Tensor, weight: th.Tensor, bias: th.Tensor, members: th.Tensor, member_bias: th.Tensor) -> th.Tensor:
        hidden = linear_leaky_relu(leaky_relu(x, 0.1), weight, bias, 0.01)  # (5, 6)
        return linear_leaky_relu(hidden.expand(3, -1, -1), members, member_bias, 0.0, ensemble=True)  # (3, 5, 4)

    gen = th.Generator().manual_seed(3)
    shapes = ((5, 8), (6, 8), (6,), (3, 6, 4), (3, 1, 4))
    inputs = [th.randn(shape, generator=gen) for shape in shapes]
    backend = aot_autograd(fw_compiler=keep, bw_compiler=keep, decompositions=inductor_decompositions())
    results = []
    for f in (th.compile(fn, backend=backend), fn):
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        out = f(*leaves)
        out.backward(th.linspace(-1.0, 1.0, out.numel()).view_as(out))
        results.append((out.detach(), *(leaf.grad for leaf in leaves)))
    forward_targets = {node.target for node in graphs[0].graph.nodes if node.op == "call_function"}
    assert set(RUN_TIME_OPERATORS.values()) <= forward_targets
    assert not set(RUN_TIME_OPERATORS) & forward_targets
    th.testing.assert_close(results[0], results[1], atol=0, rtol=0)


@pytest.mark.parametrize("n_members", [None, 3])
def test_mlp_runs_each_layer_and_rectifier_as_one_with_the_sequential_values(n_members: int | None) -> None:
    """The heads' MLP (the rectifier in place on each product's output; compiled, the opaque operator
    ``sb3_amago::linear_leaky_relu`` where a backward reads it) has ``nn.Sequential``'s values and
    gradients over the same modules: eager bit for bit, compiled within rounding; an input that needs
    no gradient compiles to the plain layers."""
    from sb3_amago.nets.heads import MLP, mlp

    th.manual_seed(0)
    net = mlp(5, (8, 8), 4, n_members=n_members)
    assert isinstance(net, MLP) and list(net.state_dict()) == list(nn.Sequential(*net).state_dict())
    shape = (6, 5) if n_members is None else (n_members, 6, 5)
    graphs: list[th.fx.GraphModule] = []
    recording_backend = _graph_recorder(graphs)

    def run(fn: Any) -> tuple[th.Tensor, ...]:
        x = th.randn(*shape, generator=th.Generator().manual_seed(1)).requires_grad_(True)
        net.zero_grad()
        out = fn(x)
        out.backward(th.linspace(-1.0, 1.0, out.numel()).view_as(out))
        return (out.detach(), x.grad, *(p.grad for p in net.parameters()))

    expected = run(lambda x: nn.Sequential.forward(net, x))
    assert all(th.equal(a, b) for a, b in zip(run(net), expected, strict=True))
    th.testing.assert_close(run(th.compile(net, dynamic=True)), expected, atol=1e-6, rtol=1e-5)
    th.compile(net, backend=recording_backend, dynamic=True)(th.randn(*shape).requires_grad_(True))
    with th.no_grad():
        th.compile(net, backend=recording_backend, dynamic=True)(th.randn(*shape))
        x = th.randn(*shape, generator=th.Generator().manual_seed(2))  # traced: the bias added in the rectifier's kernel
        th.testing.assert_close(th.compile(net, dynamic=True)(x), nn.Sequential.forward(net, x), atol=1e-6, rtol=1e-5)
    fused = [sum(node.target is th.ops.sb3_amago.linear_leaky_relu.default for node in gm.graph.nodes) for gm in graphs]
    assert fused == [2, 0]


def test_action_input_critics_equal_their_mlp_on_the_concatenated_input() -> None:
    """The split first layer (state once, gamma and action features per gamma) is the ensemble MLP
    applied to ``[state, symlog(1 / (1 - gamma)), action]`` of every (step, gamma), in value and gradient."""
    th.manual_seed(0)
    gammas = th.tensor([0.9, 0.99, 0.999])
    critics = ActionInputCritics(state_dim=6, encoded_dim=2, gammas=gammas, n_critics=3, hidden=(16, 16))
    state = th.randn(2, 5, 6, requires_grad=True)
    action = th.randn(2, 5, 3, 2, requires_grad=True)  # (B, L, G, A)
    out = critics(state, action)  # (B, L, C, G)
    tiled = state.unsqueeze(-2).expand(2, 5, 3, 6)
    features = th.cat([tiled, gamma_features(gammas).expand(2, 5, 3, 1), action], dim=-1).reshape(1, -1, 9)
    by_hand = critics.net(features.expand(3, -1, -1)).view(3, 2, 5, 3).movedim(0, -2)
    assert out.shape == (2, 5, 3, 3)
    th.testing.assert_close(out, by_hand)
    grads = th.autograd.grad(out.square().sum(), (state, action, critics.net[0].weight))
    grads_by_hand = th.autograd.grad(by_hand.square().sum(), (state, action, critics.net[0].weight))
    for grad, grad_by_hand in zip(grads, grads_by_hand):
        th.testing.assert_close(grad, grad_by_hand)
