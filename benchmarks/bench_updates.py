"""Gradient updates per second, their share of the machine's matmul rate, collection throughput and
acting latency of AMAGO on CPU.

Reference configuration: batch 8 sequences, windows of L = 64 and L = 256, d_model 128,
3 layers, 8 heads, 4 critics, 19 discount factors, discrete actions, fp32. Also measured:

- **Roofline share.** One update runs under a recorder of its matrix products (``mm``, ``addmm``,
  ``bmm``, ``baddbmm`` and the attention kernels, forward and backward); each product is then
  replayed alone on fresh tensors of the same shapes, strides and dtype, its best of several runs
  on operands in the caches (:func:`replay_seconds`). The replay's time is what
  the update's matrix work costs at its own shapes on this machine (the attainable rate, the
  update's FLOPs over that time); its share of an update's time is the roofline share, and the rest
  is time outside matrix products (elementwise ops, the optimizer, Python). The machine's peak, a
  2,048-cubed product by the library the layers use (``sb3_amago.nets.cpu_matmul``), is given beside it, in bf16 too where the CPU has bf16 instructions; where
  it has them, the update under bf16 autocast gets its own roofline. Each is given for the
  compiled update too (``compile_model=True``, ``_compiled`` in the figure's name), against the
  same products.
- **Overhead floor.** The same update with every width 8 (``d_model``, ``d_ff``, the heads' and the
  timestep encoder's hidden layers; two attention heads of 4): the same operators, one by one, on the
  same batch and window. Its time is what no narrower network would save: Python, autograd and the
  dispatcher, about 4 microseconds an operator, and the work on tensors whose size the widths do not
  set (the loss's batch x window x critics x gammas x actions values, the masks). The time outside
  matrix products less this floor is the elementwise work that scales with the widths.
- Updates per second at L = 64 with 2-dimensional Box actions in place of Discrete(4) (their
  critics take the action as input, so they run once per discount factor: the costly case).
- Env steps per second while collecting with 16 envs and the key/value cache, per-step acting
  latency, and the share of replay sampling in one training step at batch 24 x window 1,024.

    python benchmarks/bench_updates.py --threads 2            # full run, writes benchmarks/results/updates.*
    python benchmarks/bench_updates.py --threads 2 --quick    # a smoke run into updates_quick.*
    python benchmarks/bench_updates.py --threads 2 --name updates_zen4   # into updates_zen4.*
    python benchmarks/bench_updates.py --device cuda          # on a GPU, also L = 1,024 and the compiled
                                                              # update: updates_cuda.*
"""

import argparse
import contextlib
import copy
import functools
import statistics
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from common import write_results
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import FlopCounterMode

from sb3_amago import AMAGO
from sb3_amago.nets import cpu_attention, cpu_matmul
from sb3_amago.precision import cpu_has_native_bf16

# 18 extra discount factors + the main 0.999 = 19 heads: the paper's discrete-action set plus 0.5, 0.8.
MULTIGAMMAS = (
    0.5,
    0.7,
    0.8,
    0.9,
    0.93,
    0.95,
    0.98,
    0.99,
    0.992,
    0.994,
    0.995,
    0.997,
    0.998,
    0.9991,
    0.9992,
    0.9993,
    0.9994,
    0.9995,
)
aten = th.ops.aten
#: The matrix products of an update (forward and backward) that the roofline replays.
MATRIX_OPS = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    th.ops.sb3_amago.onednn_linear.default,  # fp32 products on oneDNN (sb3_amago.nets.cpu_matmul)
    th.ops.sb3_amago.causal_attention.default,  # the package's CPU attention (sb3_amago.nets.cpu_attention)
    th.ops.sb3_amago.causal_attention_backward.default,
}


#: FLOP formulas for torch's CPU flash-attention kernels, which ``FlopCounterMode`` lacks (it has the
#: CUDA ones): the math backend's count, the one the package's own CPU attention kernel registers,
#: so that an update counts the same FLOPs whichever kernel its window takes. Forward, the scores and
#: their product with the values; backward, the four products of their gradients (the flash kernel
#: also computes the scores again, which is not counted). The ``(L, L)`` products are counted whole,
#: causal or not, as torch counts them.
CPU_ATTENTION_FLOPS = {
    aten._scaled_dot_product_flash_attention_for_cpu: cpu_attention.attention_flops,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: cpu_attention.attention_backward_flops,
}


class LongEpisodeEnv(gym.Env):
    """16 float features, 4 actions (``continuous``: a 2-dimensional Box), rewards at random,
    2,000-step episodes; observations and rewards from the env's seeded generator (the space's own
    ``sample`` ignores the seed), so a seeded model's replay is the same in every process."""

    def __init__(self, continuous: bool = False) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(16,), dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32) if continuous else spaces.Discrete(4)
        self.t = 0

    def _observation(self) -> np.ndarray:
        return self.np_random.uniform(-1.0, 1.0, size=16).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observation(), {}

    def step(self, action):
        self.t += 1
        return self._observation(), float(self.np_random.random() < 0.1), False, self.t >= 2_000, {}


#: The reference model's widths.
#: Updates a timing benchmark runs before it times (op_times.py, update_costs.py): past the heap's
#: growth in the first updates of a process, and a compiled model's last recompiles.
WARM_UP_UPDATES = 20
REFERENCE_POLICY = {"traj_encoder_kwargs": {"d_model": 128, "n_heads": 8, "d_ff": 512, "n_layers": 3}, "d_embed": 128}
#: The overhead floor's: the reference's layers and operators, every width 8. Two heads, not one:
#: with one, the math attention's products take views of tensors the reference's must copy.
FLOOR_POLICY = {
    "traj_encoder_kwargs": {"d_model": 8, "n_heads": 2, "d_ff": 8, "n_layers": 3},
    "d_embed": 8,
    "actor_hidden": (8, 8),
    "critic_hidden": (8, 8),
    "timestep_encoder_kwargs": {"hidden_sizes": (8, 8)},
}


@contextlib.contextmanager
def module_settings(module: types.ModuleType, **values: Any) -> Iterator[None]:
    """``module``'s settings (module attributes such as ``cpu_matmul.ONEDNN_MIN_MACS``) set to
    ``values`` inside the block, restored after it."""
    saved = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def every_product_routed() -> contextlib.AbstractContextManager[None]:
    """Products of any size on the library the reference's run on (``cpu_matmul.ONEDNN_MIN_MACS``
    lifted): the overhead floor's products are all below that threshold and the reference's, at
    L >= 64, all above it, so only this way does the floor run the reference's operators and pay
    their per-call cost (oneDNN's, where it is chosen)."""
    return module_settings(cpu_matmul, ONEDNN_MIN_MACS=0)


def make_model(
    n_envs: int,
    max_seq_len: int,
    buffer_size: int,
    device: str = "cpu",
    compile_model: bool = False,
    continuous: bool = False,
    policy_kwargs: dict[str, Any] | None = None,
) -> AMAGO:
    """The reference model (``policy_kwargs``: other widths)."""
    env = make_vec_env(LongEpisodeEnv, n_envs=n_envs, seed=0, env_kwargs={"continuous": continuous})
    return AMAGO(
        "TransformerPolicy",
        env,
        max_seq_len=max_seq_len,
        multigammas=MULTIGAMMAS,
        buffer_size=buffer_size,
        learning_starts=10**9,  # collection only acts; updates are timed separately
        batch_size=8,
        seed=0,
        device=device,
        compile_model=compile_model,
        policy_kwargs=copy.deepcopy(policy_kwargs or REFERENCE_POLICY),
    )


#: Windows' worth of env steps each env of the reference model collects before its updates. The
#: replay cuts a window short where its rollout ends and a batch is as wide as its widest window, so
#: with rollouts of one window and a bit (the earlier fill, L + 64 steps) about a fifth of the batches at
#: L = 256 were narrower than ``L + 1`` (down to 222 steps); with four windows' worth a batch of 8
#: is narrower with a chance of about 4**-8.
FILL_WINDOWS = 4


def trained_model(
    max_seq_len: int,
    mixed_precision: bool = False,
    device: str = "cpu",
    compile_model: bool = False,
    continuous: bool = False,
    policy_kwargs: dict[str, Any] | None = None,
    warmup_updates: int = 3,
) -> AMAGO:
    """The reference model (``policy_kwargs``: other widths) with a replay of full windows, after
    ``warmup_updates`` updates (and with them the compilation)."""
    n_envs = 4
    model = make_model(n_envs, max_seq_len, 50_000, device, compile_model, continuous, policy_kwargs)
    model.mixed_precision = mixed_precision
    model.learn(n_envs * FILL_WINDOWS * (max_seq_len + 1))
    if warmup_updates:
        model.train(gradient_steps=warmup_updates, batch_size=8)
    return model


def alternated_update_seconds(
    models: dict[str, Any],
    rounds: int,
    updates: int,
    setting: Callable[[str], contextlib.AbstractContextManager[Any]] = lambda name: contextlib.nullcontext(),
) -> dict[str, list[float]]:
    """Seconds per update of each of ``models`` (reference models, batch 8), trained in turn in this
    process for ``rounds`` rounds of ``updates`` updates, in ``models``' order in even rounds and the
    reverse in odd ones (neither side always first), each side's round inside ``setting(name)``: the
    one-process comparison for changes smaller than this VM's moves between processes."""
    seconds: dict[str, list[float]] = {name: [] for name in models}
    for round_ in range(rounds):
        for name in list(models) if round_ % 2 == 0 else list(models)[::-1]:
            with setting(name):
                start = time.perf_counter()
                models[name].train(gradient_steps=updates, batch_size=8)
                seconds[name].append((time.perf_counter() - start) / updates)
    return seconds


def alternation_parser(description: str) -> argparse.ArgumentParser:
    """The command line of a benchmark that alternates two updates in one process (:func:`against_the_package`):
    threads, window length, rounds, updates per round and side, and the results' name."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30, help="alternations inside the update")
    parser.add_argument("--updates", type=int, default=10, help="updates per round and side")
    parser.add_argument("--name", default=None)
    return parser


def against_the_package(
    length: int, rounds: int, updates: int, other_forward: Callable[[], Callable[..., Any]], batch: int = 8
) -> dict[str, dict[str, Any]]:
    """The package's compiled update against another compile of the same forward, ``other_forward()``
    (called once; it returns the compiled ``update_forward``), each on a reference model, alternated in
    this process (:func:`alternated_update_seconds`) after a round of warm-up: the medians, and the median
    of the per-round ratios (other / package) with the rounds the package's side was faster."""
    package = trained_model(length, compile_model=True)
    other = trained_model(length, compile_model=False)
    other._update_forward = other_forward()
    models = {"package": package, "other": other}
    for model in models.values():
        model.train(gradient_steps=updates, batch_size=batch)
    seconds = alternated_update_seconds(models, rounds, updates)
    ratios = [o / p for o, p in zip(seconds["other"], seconds["package"], strict=True)]
    return {
        "update_ms_package": {"value": round(1e3 * statistics.median(seconds["package"]), 2), "unit": "ms (median)"},
        "update_ms_other": {"value": round(1e3 * statistics.median(seconds["other"]), 2), "unit": "ms (median)"},
        "update_speedup": {
            "value": round(statistics.median(ratios), 4),
            "unit": "x (median of per-round other / package update times)",
            "rounds_faster": sum(ratio > 1 for ratio in ratios),
            "rounds": rounds,
        },
    }


def parameters_after_updates(max_seq_len: int, n_updates: int, compile_model: bool = False) -> dict[str, th.Tensor]:
    """The reference model's state after :func:`trained_model`'s warm-up and ``n_updates`` more
    updates from its seeded start and replay (:func:`make_model` seeds the model and its envs): on
    one thread the same tensors in every process, so two versions of the package can be compared
    bit for bit (``same_values.py``)."""
    model = trained_model(max_seq_len, compile_model=compile_model)
    model.train(gradient_steps=n_updates, batch_size=8)
    return {name: tensor.detach().clone() for name, tensor in model.policy.state_dict().items()}


def updates_per_second(
    max_seq_len: int,
    n_updates: int,
    mixed_precision: bool = False,
    device: str = "cpu",
    compile_model: bool = False,
    continuous: bool = False,
) -> float:
    """Updates/s of the reference model (``continuous``: with Box actions, whose critics run once per
    discount factor, in place of Discrete(4))."""
    model = trained_model(max_seq_len, mixed_precision, device, compile_model, continuous)
    synchronize = th.cuda.synchronize if model.device.type == "cuda" else lambda: None
    synchronize()
    start = time.perf_counter()
    model.train(gradient_steps=n_updates, batch_size=8)
    synchronize()
    return n_updates / (time.perf_counter() - start)


@dataclass(frozen=True)
class TensorSpec:
    """What a replayed tensor must match: shape, strides, dtype."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: th.dtype

    def make(self) -> th.Tensor:
        """Random values (zeros for integer tensors) laid out as recorded (expanded views included)."""
        storage = 1 + sum((size - 1) * step for size, step in zip(self.shape, self.stride)) if all(self.shape) else 0
        flat = th.randn(storage).to(self.dtype) if self.dtype.is_floating_point else th.zeros(storage, dtype=self.dtype)
        return flat.as_strided(self.shape, self.stride)


class MatrixOpRecorder(TorchDispatchMode):
    """Records each matrix product that runs under it: the op and its arguments with every tensor
    replaced by its :class:`TensorSpec`."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, tuple, dict]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in MATRIX_OPS:
            self.calls.append((func, tree_map(_spec, args), tree_map(_spec, kwargs)))
        return func(*args, **kwargs)


def _spec(x: Any) -> Any:
    return TensorSpec(tuple(x.shape), tuple(x.stride()), x.dtype) if isinstance(x, th.Tensor) else x


def replay_seconds(calls: list[tuple[Any, tuple, dict]], repeats: int) -> float:
    """Seconds the recorded matrix products take at their best: each is replayed alone on fresh
    tensors made just before it, once to warm up and then ``repeats`` times, and its fastest run
    counts. Its operands are in the caches then, as in the update, where the kernel before a product
    has just written them. (A pass over all the products, each on its own tensors made up front,
    read every operand from memory: on a 2-core Zen 4 EPYC it took 38-44 ms at L = 64 against 30.6
    ms this way, more than the products take inside the running update, about 32.5 ms by
    ``profile_update.py``.)"""

    def make(x: Any) -> Any:
        return x.make() if isinstance(x, TensorSpec) else x

    total = 0.0
    for func, spec_args, spec_kwargs in calls:
        total += best_seconds(functools.partial(func, *tree_map(make, spec_args), **tree_map(make, spec_kwargs)), repeats)
    return total


def peak_gemm_flops(dtype: th.dtype, size: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of a ``size``-cubed matrix product in ``dtype`` (best of ``repeats``), by the library the
    package's layers use (:func:`sb3_amago.nets.cpu_matmul.linear`)."""
    a, b = th.randn(size, size).to(dtype), th.randn(size, size).to(dtype)
    return 2 * size**3 / best_seconds(lambda: cpu_matmul.linear(a, b), repeats)


def best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """The best of ``repeats`` timed calls of ``fn``, after one untimed (oneDNN builds a kernel per
    shape on its first call; the caches warm up)."""
    fn()
    return min(_timed(fn) for _ in range(repeats))


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class OperatorCounter(TorchDispatchMode):
    """Counts the operators that run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.calls += 1
        return func(*args, **(kwargs or {}))


def operators_per_update(model: AMAGO) -> int:
    counter = OperatorCounter()
    with counter:
        model.train(gradient_steps=1, batch_size=8)
    return counter.calls


#: Runs of ``n_updates`` updates timed for the roofline's update and floor (their best counts, as
#: the products' replay takes each product's best).
TIMED_REPEATS = 3


def roofline(max_seq_len: int, n_updates: int, mixed_precision: bool = False, compile_model: bool = False) -> dict[str, float]:
    """The update's matrix-product FLOPs, their replay time at the update's shapes, the share of an
    update's time that replay accounts for, and the overhead floor (see the module docstring).

    ``compile_model``: the timed update and floor are compiled. The compiled update runs the eager
    one's matrix products (inductor leaves them to ATen on a CPU), so they are recorded on the
    eager model; its fused kernels are not ATen operators, so no operator count is given."""
    model = trained_model(max_seq_len, mixed_precision)
    recorder = MatrixOpRecorder()
    counter = FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS)
    with recorder, counter:
        model.train(gradient_steps=1, batch_size=8)
    timed = trained_model(max_seq_len, mixed_precision, compile_model=True) if compile_model else model
    update_s = best_seconds(lambda: timed.train(gradient_steps=n_updates, batch_size=8), TIMED_REPEATS) / n_updates
    matrix_s = replay_seconds(recorder.calls, repeats=5)
    flops = float(counter.get_total_flops())
    with every_product_routed():
        floor = trained_model(max_seq_len, mixed_precision, compile_model=compile_model, policy_kwargs=FLOOR_POLICY)
        floor_s = best_seconds(lambda: floor.train(gradient_steps=n_updates, batch_size=8), TIMED_REPEATS) / n_updates
        floor_operators = None if compile_model else operators_per_update(floor)
    operators = (
        {}
        if compile_model
        else {"operators_per_update": operators_per_update(model), "floor_operators_per_update": floor_operators}
    )
    return {
        "update_ms": 1e3 * update_s,
        "matrix_ms": 1e3 * matrix_s,
        "matrix_share": matrix_s / update_s,
        "overhead_floor_ms": 1e3 * floor_s,
        "elementwise_ms": 1e3 * (update_s - matrix_s - floor_s),
        **operators,
        "gflop_per_update": flops / 1e9,
        "attainable_gflops_at_update_shapes": flops / matrix_s / 1e9,
        "achieved_gflops": flops / update_s / 1e9,
        "matrix_ops_per_update": len(recorder.calls),
    }


def collection(n_envs: int, steps: int) -> dict[str, float]:
    model = make_model(n_envs=n_envs, max_seq_len=256, buffer_size=200_000)
    model.learn(n_envs * 4)
    start = time.perf_counter()
    model.learn(n_envs * steps, reset_num_timesteps=False)
    elapsed = time.perf_counter() - start
    obs = model.env.reset()
    state, latencies = None, []
    for _ in range(steps):
        t0 = time.perf_counter()
        action, state = model.predict(obs, state=state, deterministic=False)
        latencies.append(time.perf_counter() - t0)
        obs, *_ = model.env.step(action)
    return {"env_steps_per_s": n_envs * steps / elapsed, "predict_ms_16_envs_median": 1e3 * float(np.median(latencies))}


def sampling_share(window: int, n_updates: int) -> dict[str, float]:
    model = make_model(n_envs=4, max_seq_len=window, buffer_size=100_000)
    model.learn(4 * (window + 200))
    model.train(gradient_steps=1, batch_size=24)
    start = time.perf_counter()
    for _ in range(n_updates):
        model.replay_buffer.sample(24)
    sample_s = (time.perf_counter() - start) / n_updates
    start = time.perf_counter()
    model.train(gradient_steps=n_updates, batch_size=24)
    step_s = (time.perf_counter() - start) / n_updates
    return {"sample_ms": 1e3 * sample_s, "train_step_ms": 1e3 * step_s, "sampling_share": sample_s / step_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--name", help="the results' file name (default: updates, updates_quick with --quick)")
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    if args.device != "cpu":
        gpu_figures(args.threads, n=5 if args.quick else 50)
        return
    n = 3 if args.quick else 20
    figures: dict[str, dict] = {}
    for dtype in (th.float32, th.bfloat16) if cpu_has_native_bf16() else (th.float32,):
        name = str(dtype).removeprefix("torch.")
        peak = peak_gemm_flops(dtype)
        library = "onednn" if cpu_matmul.ONEDNN or dtype != th.float32 else "blas"  # sb3_amago.nets.cpu_matmul
        figures[f"peak_gemm_{name}"] = {
            "value": peak / 1e9,
            "unit": "GFLOP/s",
            "size": "2048 x 2048 x 2048",
            "library": library,
        }
        print(f"peak {name} GEMM: {peak / 1e9:.0f} GFLOP/s")
    for length in (64, 256):
        ups = updates_per_second(length, n)
        figures[f"updates_per_s_L{length}"] = {"value": ups, "unit": "updates/s"}
        print(f"L={length}: {ups:.2f} updates/s")
        bf16 = updates_per_second(length, n, mixed_precision=True)
        figures[f"updates_per_s_L{length}_bf16_autocast"] = {"value": bf16, "unit": "updates/s", "ratio_vs_fp32": bf16 / ups}
        print(f"L={length} bf16 autocast: {bf16:.2f} updates/s")
        for mixed_precision in (False, True) if cpu_has_native_bf16() else (False,):
            for compiled in (False, True):
                name = (
                    f"roofline_share_L{length}"
                    + ("_bf16_autocast" if mixed_precision else "")
                    + ("_compiled" if compiled else "")
                )
                roof = roofline(length, n, mixed_precision, compiled)
                figures[name] = {"value": roof.pop("matrix_share"), "unit": "fraction of an update", **roof}
                print(f"{name}: {figures[name]}")
    box = updates_per_second(64, max(1, n // 4), continuous=True)
    figures["updates_per_s_L64_box"] = {"value": box, "unit": "updates/s", "actions": "Box(-1, 1, (2,))"}
    print(f"L=64 Box actions: {box:.2f} updates/s")
    coll = collection(n_envs=16, steps=20 if args.quick else 200)
    figures["collect_env_steps_per_s_16_envs"] = {"value": coll["env_steps_per_s"], "unit": "env steps/s"}
    figures["predict_latency_16_envs"] = {"value": coll["predict_ms_16_envs_median"], "unit": "ms per call (median)"}
    print(coll)
    share = sampling_share(window=64 if args.quick else 1024, n_updates=2 if args.quick else 5)
    figures["replay_sampling_share_B24_W1024"] = {
        "value": share["sampling_share"],
        "unit": "fraction of one training step",
        **share,
    }
    print(share)
    config = {
        "batch_size": 8,
        "d_model": 128,
        "n_layers": 3,
        "n_heads": 8,
        "n_critics": 4,
        "n_gammas": len(MULTIGAMMAS) + 1,
        "actions": "Discrete(4)",
        "precision": "fp32",
        "threads": args.threads,
        "quick": args.quick,
    }
    write_results(args.name or ("updates_quick" if args.quick else "updates"), config, figures)


def gpu_figures(threads: int, n: int) -> None:
    """Updates per second on the GPU at L = 64, 256 and 1,024 in fp32 and bf16 autocast, and at L = 256
    with the compiled update too, in both (``updates_cuda.*``)."""
    figures: dict[str, dict] = {}
    modes = {"fp32": (False, False), "bf16": (True, False), "fp32_compiled": (False, True), "bf16_compiled": (True, True)}
    for length, label in [
        (64, "fp32"),
        (64, "bf16"),
        (256, "fp32"),
        (256, "bf16"),
        (256, "fp32_compiled"),
        (256, "bf16_compiled"),
        (1024, "fp32"),
        (1024, "bf16"),
    ]:
        bf16, compiled = modes[label]
        ups = updates_per_second(length, n, mixed_precision=bf16, device="cuda", compile_model=compiled)
        figures[f"updates_per_s_L{length}_{label}"] = {"value": ups, "unit": "updates/s"}
        print(f"L={length} {label}: {ups:.2f} updates/s", flush=True)
    config = {"batch_size": 8, "d_model": 128, "n_layers": 3, "n_heads": 8, "n_gammas": len(MULTIGAMMAS) + 1}
    write_results("updates_cuda", {**config, "device": th.cuda.get_device_name(), "threads": threads}, figures)


if __name__ == "__main__":
    main()
