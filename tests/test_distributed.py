"""Data-parallel AMAGO on two CPU processes (gloo), each a run of distributed_worker.py: identical
parameters across ranks (after learning and after resuming), saving, logging and callbacks on
rank 0 only, the same update as one process on the union of the batches, a failing rank stopping
every rank; and collection with SB3's SubprocVecEnv."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch as th
import torch.distributed as dist
from distributed_worker import flat_state
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv
from test_amago import CountingEnv, tiny_model

from sb3_amago import AMAGO
from sb3_amago.distributed import gpus_shared

WORKER = Path(__file__).with_name("distributed_worker.py")
ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 180  # a rank still running by then is hanging in a collective


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(**extra: object) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **{k: str(v) for k, v in extra.items()}}


def _run_ranks(scenario: str, out: Path) -> list[tuple[int, str]]:
    """Start the two ranks as torchrun would (its environment variables), wait for both; return
    each rank's exit status and output."""
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), scenario, str(out)],
            env=_env(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        outputs = [proc.communicate(timeout=TIMEOUT_S)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return [(proc.returncode, output) for proc, output in zip(procs, outputs)]


def test_ranks_launched_by_torchrun_hold_bit_identical_parameters(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2"]
    command += ["--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(WORKER), "identical", str(tmp_path)]
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [th.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert ranks[0]["n_updates"] == ranks[1]["n_updates"] == 3
    assert not th.equal(ranks[0]["rewards"], ranks[1]["rewards"]), "each rank should collect its own data"
    assert th.equal(ranks[0]["state"], ranks[1]["state"])
    assert not (tmp_path / "saved_by_rank1.zip").exists(), "only rank 0 saves"
    assert th.equal(flat_state(AMAGO.load(tmp_path / "saved_by_rank0.zip")), ranks[0]["state"])
    assert [p.name for p in tmp_path.glob("callback_ran_on_rank*")] == ["callback_ran_on_rank0"]
    assert ranks[0]["resumed_n_updates"] == ranks[1]["resumed_n_updates"] == 5, "rank 0's callback stops both ranks"
    assert th.equal(ranks[0]["resumed_state"], ranks[1]["resumed_state"])
    assert not th.equal(ranks[0]["resumed_state"], ranks[0]["state"])


@pytest.mark.slow
def test_compiled_sequence_model_keeps_ranks_bit_identical(tmp_path: Path) -> None:
    results = _run_ranks("compiled", tmp_path)
    assert [rc for rc, _ in results] == [0, 0], "\n".join(output for _, output in results)
    ranks = [th.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert ranks[0]["n_updates"] == ranks[1]["n_updates"] == 3
    assert th.equal(ranks[0]["state"], ranks[1]["state"])


def test_two_ranks_update_as_one_process_on_both_batches(tmp_path: Path) -> None:
    results = _run_ranks("equivalent", tmp_path)
    assert [rc for rc, _ in results] == [0, 0], "\n".join(output for _, output in results)
    assert "total_timesteps" in results[0][1] and "total_timesteps" not in results[1][1], "only rank 0 logs"
    saved = th.load(tmp_path / "rank0.pt")
    counts = saved["valid_counts"]
    assert counts[0] != counts[1], "the halves should hold different numbers of real steps"
    assert (saved["reference"] - saved["initial"]).abs().max() > 1e-3, "the updates should move the parameters"
    th.testing.assert_close(saved["parallel"], saved["reference"], rtol=1e-5, atol=1e-5)


def test_a_failing_env_on_one_rank_raises_on_every_rank(tmp_path: Path) -> None:
    (rc0, out0), (rc1, out1) = _run_ranks("failing", tmp_path)
    assert rc1 != 0 and "RuntimeError: the env broke on purpose" in out1, out1
    assert rc0 != 0 and "RuntimeError: Rank(s) [1] failed while collecting" in out0, out0


def test_subproc_vec_env_collects_and_trains_like_dummy_vec_env() -> None:
    def make() -> CountingEnv:
        return CountingEnv(length=6, random_length=True)

    models: list[AMAGO] = []
    for env in (DummyVecEnv([make] * 2), SubprocVecEnv([make] * 2, start_method="fork")):
        model = tiny_model(env, learning_starts=16)
        model.learn(48)
        env.close()
        models.append(model)
    dummy, subproc = models
    assert subproc._n_updates == dummy._n_updates > 0
    for a, b in zip(dummy.policy.state_dict().values(), subproc.policy.state_dict().values()):
        assert th.equal(a, b)


def test_distributed_without_a_process_group_names_the_launch_command(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="torchrun --nproc_per_node"):
        tiny_model(CountingEnv(), distributed=True)


def test_ranks_sharing_a_gpu_talk_through_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL refuses two ranks on one GPU: a node with more ranks than GPUs takes gloo."""
    monkeypatch.setattr(th.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert gpus_shared()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert not gpus_shared()


def test_distributed_refuses_episode_based_collection(tmp_path: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="train_freq in steps"):
            tiny_model(CountingEnv(), distributed=True, train_freq=(1, "episode"), learning_starts=8)
    finally:
        dist.destroy_process_group()
