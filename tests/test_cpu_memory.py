"""glibc keeps an update's freed memory: fewer page faults per update, and the opt-out works."""

import json
import os
import statistics
import subprocess
import sys
import textwrap

import pytest

from sb3_amago.cpu_memory import ENV_VARIABLE, _glibc

pytestmark = pytest.mark.skipif(_glibc() is None, reason="the setting applies to glibc only")

# Builds a CPU AMAGO on T-maze (101-step rollouts) whose critic ensemble's hidden layers are
# (4, 8 * 101, 256) floats (3 MiB each),
# runs updates and prints the minor page faults per update (8 windows of 2) and whether the setting was applied.
SCRIPT = textwrap.dedent(
    """
    import json, resource
    import torch as th
    from stable_baselines3.common.env_util import make_vec_env
    from sb3_amago import AMAGO
    from sb3_amago.cpu_memory import keep_freed_memory

    th.set_num_threads(1)
    model = AMAGO("TransformerPolicy", make_vec_env("amago-TMaze100-v0", n_envs=2, seed=0), max_seq_len=101, batch_size=8,
                  learning_starts=10**9, seed=0, device="cpu",
                  policy_kwargs={"traj_encoder_kwargs": {"d_model": 64, "n_heads": 4, "d_ff": 128, "n_layers": 1}})
    model.learn(400)
    model.train(gradient_steps=3, batch_size=8)
    faults = []
    for _ in range(8):  # per window of 2 updates: the heap still grows now and then, so the median counts
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        model.train(gradient_steps=2, batch_size=8)
        faults.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 2)
    print(json.dumps({"faults": faults, "applied": keep_freed_memory()}))
    """
)


def faults_per_update(keep: bool) -> tuple[float, bool]:
    """Median page faults per update over the windows, and whether the setting was applied."""
    env = {**os.environ, ENV_VARIABLE: "1" if keep else "0"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return statistics.median(result["faults"]), result["applied"]


def test_freed_memory_is_kept_and_the_opt_out_leaves_glibc_alone():
    (kept, applied), (default, applied_by_default) = faults_per_update(True), faults_per_update(False)
    assert applied and not applied_by_default
    # glibc's own thresholds hand the ensemble's blocks back and fault them in again at every update.
    assert default > 200
    assert kept < default / 4
