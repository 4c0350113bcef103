"""Data-parallel AMAGO over ``torch.distributed``: every rank collects with its own envs into its
own replay and computes the loss on its own batch; the gradients and the PopArt statistics are
summed across ranks, so that every rank takes the update that one process would take on the union
of the batches and all ranks keep identical parameters.

Launch an ordinary script with ``torchrun --nproc_per_node N script.py`` and build the model with
``AMAGO(..., distributed=True)``; the process group comes from torchrun's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), with ``gloo`` on CPU and
``nccl`` on GPUs (``gloo`` too where a node runs more ranks than it has GPUs), unless the script
initialised one itself.

Everything that differs under ``distributed=True`` is a method of :class:`DataParallel`; AMAGO
calls the same methods of :class:`SingleProcess` otherwise, where each does nothing.
"""

import atexit
import datetime
import os
from collections.abc import Callable

import torch as th
import torch.distributed as dist
from stable_baselines3.common.type_aliases import RolloutReturn, TrainFreq, TrainFrequencyUnit

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# How long a rank waits in a collective for the others (rank 0 may evaluate or save meanwhile).
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


def launched_by_torchrun() -> bool:
    """Whether this process's environment names a process group (as torchrun's does)."""
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def rank_device(device: th.device) -> th.device:
    """The device of this rank: ``cuda`` without an index becomes ``cuda:LOCAL_RANK``."""
    if device.type != "cuda" or device.index is not None:
        return device
    local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank() if dist.is_initialized() else 0))
    return th.device("cuda", local_rank % max(1, th.cuda.device_count()))


def gpus_shared() -> bool:
    """Whether this node runs more ranks than it has GPUs, so that some share one: NCCL refuses two
    ranks on one GPU, gloo (through host memory) does not."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > th.cuda.device_count()


class SingleProcess:
    """Training in one process: the interface of :class:`DataParallel`, with nothing to share.

    :param device: the model's device
    """

    #: Whether each rank seeds its own RNGs rather than taking those of a loaded file (rank 0's).
    per_rank_rng = False

    def __init__(self, device: th.device) -> None:
        self.device = device

    @property
    def is_main(self) -> bool:
        """Whether this process logs, evaluates and saves."""
        return True

    def rank_seed(self, seed: int | None, n_envs: int) -> int | None:
        """The seed this process uses for ``seed``."""
        return seed

    def attach(self, module: th.nn.Module) -> None:
        """Share ``module``'s parameters and batch statistics with the other processes."""

    def check_collection(self, train_freq: TrainFreq, **settings: int) -> None:
        """Raise a ValueError unless the processes can collect and update in step."""

    def average_gradients(self, params: list[th.nn.Parameter], n_real: th.Tensor) -> None:
        """Replace the gradients by those of the loss over every process's batch."""

    def collection_round(self, collect: Callable[[], RolloutReturn]) -> RolloutReturn:
        """Run one collection round, ``collect``, and settle with the other processes whether training goes on."""
        return collect()


class DataParallel(SingleProcess):
    """This process's place in the process group and the collectives the training step needs.

    Joins the process group already initialised by the script, or initialises one from torchrun's
    environment (``nccl`` for a CUDA device with a GPU to each of the node's ranks, else ``gloo``,
    with :data:`DEFAULT_TIMEOUT`).

    :param device: the model's device; ``cuda`` without an index is mapped to the rank's GPU
    """

    per_rank_rng = True

    def __init__(self, device: th.device) -> None:
        super().__init__(rank_device(device))
        if self.device.type == "cuda":
            th.cuda.set_device(self.device)
        if not dist.is_initialized():
            if not launched_by_torchrun():
                raise RuntimeError(
                    "distributed=True needs a torch.distributed process group, and this process has none: launch the "
                    "script with `torchrun --nproc_per_node N script.py` (which sets RANK, WORLD_SIZE, MASTER_ADDR, "
                    "MASTER_PORT), call torch.distributed.init_process_group() before building the model, or drop "
                    "distributed=True to train in one process."
                )
            backend = "nccl" if self.device.type == "cuda" and not gpus_shared() else "gloo"
            dist.init_process_group(backend=backend, timeout=DEFAULT_TIMEOUT)
            atexit.register(dist.destroy_process_group)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        nccl = dist.get_backend() == "nccl"
        self.comm_device = th.device("cuda", th.cuda.current_device()) if nccl else th.device("cpu")

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs, evaluates and saves."""
        return self.rank == 0

    @th.compiler.disable  # a graph break in a compiled forward, rather than a collective traced into it
    def sum(self, values: th.Tensor) -> th.Tensor:
        """``values`` summed over all ranks (in float32 on the backend's device, returned in the input's dtype)."""
        buffer = values.detach().to(self.comm_device, th.float32)
        dist.all_reduce(buffer)
        return buffer.to(values.device, values.dtype)

    def rank_seed(self, seed: int | None, n_envs: int) -> int:
        """``seed + rank * n_envs``, so that the ranks' RNGs differ and their envs (seeded
        ``seed + i`` by SB3) get disjoint seeds; without a seed, rank 0 draws one for all."""
        if seed is None:
            drawn = th.tensor([int.from_bytes(os.urandom(4), "little") >> 1], device=self.comm_device)
            seed = int(self.broadcast(drawn).item())
        return seed + self.rank * n_envs

    def broadcast(self, tensor: th.Tensor) -> th.Tensor:
        """Rank 0's ``tensor`` on every rank (in place on the backend's device, copied back otherwise)."""
        buffer = tensor.detach().to(self.comm_device)
        dist.broadcast(buffer, src=0)
        if tensor.device != self.comm_device:
            tensor.copy_(buffer)
        return tensor

    @th.no_grad()
    def attach(self, module: th.nn.Module) -> None:
        """Give every rank rank 0's parameters and buffers in ``module``, and let its submodules
        that keep batch statistics (those with a ``reduce_moments`` attribute: PopArt, the
        observation normalisation) sum them over the ranks."""
        for tensor in module.state_dict().values():
            self.broadcast(tensor)
        for sub in module.modules():
            if hasattr(sub, "reduce_moments"):
                sub.reduce_moments = self.sum

    def check_collection(self, train_freq: TrainFreq, **settings: int) -> None:
        """Raise a ValueError on every rank unless ``train_freq`` counts steps and every rank has the same
        ``train_freq`` and ``settings`` (ranks collecting whole episodes would collect different
        numbers of steps and fall out of step)."""
        if train_freq.unit != TrainFrequencyUnit.STEP:
            raise ValueError(
                f"distributed=True needs train_freq in steps, got {train_freq}: ranks collecting whole episodes "
                "would collect different numbers of steps and fall out of step. Use e.g. train_freq=(4, 'step')."
            )
        self.check_same(train_freq=train_freq.frequency, **settings)

    def check_same(self, **settings: int) -> None:
        """Raise a ValueError on every rank unless every rank has the same ``settings`` (the
        collection and update counts, which keep the ranks' collectives in step)."""
        local = th.tensor(list(settings.values()), dtype=th.float64, device=self.comm_device)
        gathered = [th.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(gathered, local)
        for i, name in enumerate(settings):
            values = [int(g[i].item()) for g in gathered]
            if len(set(values)) > 1:
                raise ValueError(
                    f"{name} differs across ranks ({values}, by rank): data-parallel ranks must collect and update in "
                    "step, so build the model with the same settings and the same number of envs on every rank."
                )

    @th.no_grad()
    def average_gradients(self, params: list[th.nn.Parameter], n_real: th.Tensor) -> None:
        """Replace each rank's gradients by those of the loss over the union of all ranks' batches.

        The loss averages over a batch's real (non-padding) steps, ``n_real`` here, so a rank's
        gradient is its step sum divided by its own count; the union's gradient is the sum of
        ``n_real * gradient`` over ranks divided by the total count (a plain mean of the ranks'
        gradients would weigh a rank with more padding too much). One all-reduce carries the
        weighted gradients, the counts, and which parameters have a gradient on some rank.
        """
        count = n_real.detach().to(self.comm_device, th.float32).reshape(1)
        parts = [
            (p.grad.to(self.comm_device, th.float32) * count).reshape(-1)
            if p.grad is not None
            else th.zeros(p.numel(), device=self.comm_device)
            for p in params
        ]
        has_grad = th.tensor([p.grad is not None for p in params], dtype=th.float32, device=self.comm_device)
        flat = th.cat([*parts, has_grad, count])
        dist.all_reduce(flat)
        total = flat[-1].clamp(min=1.0)
        grads = flat[: -1 - len(params)].div_(total).split([p.numel() for p in params])
        for p, grad, present in zip(params, grads, flat[-1 - len(params) : -1].tolist()):
            p.grad = grad.view_as(p).to(p.device, p.dtype) if present > 0 else None

    def collection_round(self, collect: Callable[[], RolloutReturn]) -> RolloutReturn:
        """Run ``collect``; then every rank learns whether another rank's collection failed (and
        raises) or its callbacks asked to stop (and stops too)."""
        try:
            rollout = collect()
        except Exception:
            self.end_round(failed=True)
            raise
        stop = self.end_round(stop=not rollout.continue_training)
        return rollout._replace(continue_training=not stop)

    def end_round(self, failed: bool = False, stop: bool = False) -> bool:
        """The step every rank takes after each collection round: learn whether another rank
        failed (then raise a RuntimeError naming it, so that no rank waits for it in a collective)
        or asked to stop (a callback on rank 0); return whether training stops.

        :param failed: this rank's collection raised (it re-raises its own error after this call)
        :param stop: this rank's callbacks asked to stop training
        """
        status = th.zeros(self.world_size + 1, device=self.comm_device)
        status[self.rank] = float(failed)
        status[-1] = float(stop)
        dist.all_reduce(status)
        failed_ranks = [r for r in range(self.world_size) if status[r] > 0 and r != self.rank]
        if failed_ranks and not failed:
            raise RuntimeError(
                f"Rank(s) {failed_ranks} failed while collecting (their error is in their own output); rank "
                f"{self.rank} stops too rather than wait for them. Fix the error the failing rank reports."
            )
        return bool(status[-1] > 0)
