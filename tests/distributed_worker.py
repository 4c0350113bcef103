"""One rank of the data-parallel tests in test_distributed.py, launched by torchrun or by the test
with torchrun's environment variables; ``python distributed_worker.py SCENARIO OUT_DIR``.

- ``identical``: AMAGO learns with updates on each rank's own envs, saves, resumes from rank 0's
  file on both ranks under a callback that stops it; each rank saves its parameters (after
  learning and after resuming) and the rewards in its replay.
- ``compiled``: the same learning with the compiled sequence model and bf16 autocast.
- ``equivalent``: one fixed batch of 2B windows; the data-parallel model updates on half of it per
  rank, a one-process model on all of it; rank 0 saves both results.
- ``failing``: rank 1's env raises part-way through collection.
"""

import os
import sys
from pathlib import Path

import torch as th
import torch.distributed as dist
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import DummyVecEnv
from test_amago import TINY, CountingEnv

from sb3_amago import AMAGO

th.set_num_threads(1)
K_UPDATES = 3
HALF_BATCH = 4


class BreakingEnv(CountingEnv):
    """A CountingEnv whose step raises once ``fail_at`` steps have been taken since construction."""

    def __init__(self, fail_at: int) -> None:
        super().__init__(length=6, random_length=True)
        self.fail_at = fail_at
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps >= self.fail_at:
            raise RuntimeError("the env broke on purpose")
        return super().step(action)


def model(env, **kwargs) -> AMAGO:
    params = {
        "max_seq_len": 8,
        "batch_size": HALF_BATCH,
        "seed": 0,
        "learning_starts": 16,
        "n_critics": 1,
        "warmup_steps": 1,
        "learning_rate": 1e-3,
        "policy_kwargs": {**TINY, "traj_encoder_kwargs": {**TINY["traj_encoder_kwargs"], "dropout": 0.0}},
    }
    params.update(kwargs)
    return AMAGO("TransformerPolicy", env, **params)


def counting_envs() -> DummyVecEnv:
    return DummyVecEnv([lambda: CountingEnv(length=6, random_length=True)] * 2)


def flat_state(m: AMAGO) -> th.Tensor:
    return th.cat([t.detach().float().reshape(-1) for t in m.policy.state_dict().values()])


class StopAfter(BaseCallback):
    """Marks the rank it runs on (a file in ``out``), and stops training at its ``calls``-th step."""

    def __init__(self, out: Path, calls: int) -> None:
        super().__init__()
        self.out, self.calls = out, calls

    def _on_step(self) -> bool:
        (self.out / f"callback_ran_on_rank{dist.get_rank()}").touch()
        return self.n_calls < self.calls


def identical(out: Path) -> None:
    m = model(counting_envs(), distributed=True, mixed_precision=True)
    rank = dist.get_rank()
    m.learn(16 + 2 * 4 * K_UPDATES)
    m.save(out / f"saved_by_rank{rank}.zip")
    dist.barrier()
    # Resumed on two ranks; rank 0's callback stops both in the third round, after two more updates.
    resumed = AMAGO.load(out / "saved_by_rank0.zip", env=counting_envs(), distributed=True)
    resumed.learn(1000, callback=StopAfter(out, calls=10), reset_num_timesteps=False)
    saved = {
        "state": flat_state(m),
        "n_updates": m._n_updates,
        "rewards": th.as_tensor(m.replay_buffer.rewards[:32]),
        "resumed_state": flat_state(resumed),
        "resumed_n_updates": resumed._n_updates,
    }
    th.save(saved, out / f"rank{rank}.pt")


def compiled(out: Path) -> None:
    m = model(counting_envs(), distributed=True, mixed_precision=True, compile_model=True)
    m.learn(16 + 2 * 4 * K_UPDATES)
    th.save({"state": flat_state(m), "n_updates": m._n_updates}, out / f"rank{dist.get_rank()}.pt")


def equivalent(out: Path) -> None:
    reference = model(counting_envs(), learning_starts=10**6)
    reference.learn(64)  # fills the replay the same way on both ranks, without updates
    th.manual_seed(1)
    batch = reference.replay_buffer.sample(2 * HALF_BATCH)
    rank = int(os.environ["RANK"])
    halves = [type(batch)(*(_rows(x, r) for x in batch)) for r in range(2)]

    parallel = model(counting_envs(), distributed=True, learning_starts=10**6, verbose=1)
    parallel.learn(48)  # sets up the logger (printing on rank 0 only) and collection; no updates
    initial = flat_state(reference)
    assert th.equal(flat_state(parallel), initial), "the ranks should start from the one-process initialisation"
    parallel.replay_buffer.sample = lambda *args, **kwargs: halves[rank]
    parallel.train(gradient_steps=K_UPDATES, batch_size=HALF_BATCH)
    reference.replay_buffer.sample = lambda *args, **kwargs: batch
    reference.train(gradient_steps=K_UPDATES, batch_size=2 * HALF_BATCH)
    if rank == 0:
        counts = [int(h.real[:, 1:].sum()) for h in halves]
        th.save(
            {"initial": initial, "parallel": flat_state(parallel), "reference": flat_state(reference), "valid_counts": counts},
            out / "rank0.pt",
        )


def _rows(x, rank: int):
    if isinstance(x, dict):
        return {k: _rows(v, rank) for k, v in x.items()}
    return x[rank * HALF_BATCH : (rank + 1) * HALF_BATCH]


def failing(_out: Path) -> None:
    fail_at = 30 if os.environ["RANK"] == "1" else 10**9  # each env's 30th step, after updates have begun
    m = model(DummyVecEnv([lambda: BreakingEnv(fail_at)] * 2), distributed=True)
    m.learn(400)


if __name__ == "__main__":
    scenario, out_dir = sys.argv[1], Path(sys.argv[2])
    {"identical": identical, "compiled": compiled, "equivalent": equivalent, "failing": failing}[scenario](out_dir)
