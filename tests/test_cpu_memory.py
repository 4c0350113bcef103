"""glibc keeps freed memory in the process: large blocks reuse their pages, and the opt-out works."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sb3_amago.cpu_memory import ENV_VARIABLE, _glibc

pytestmark = pytest.mark.skipif(_glibc() is None, reason="the setting applies to glibc only")

# Builds a CPU AMAGO (which applies the setting, or not), runs two updates, then allocates, fills and
# frees a 64 MiB block again and again and prints the minor page faults of each round after the first
# two. 64 MiB is above the largest threshold glibc's own allocator ever moves to (32 MiB), so by
# default every round maps the block afresh and faults in all of its 16,384 pages; with the setting
# the freed block stays in the heap and the next round reuses its pages. An update's ensemble
# temporaries take the same road at long windows (tens of MiB); the smaller ones only sometimes,
# as glibc's threshold moves, which is why the block, not the update, is counted.
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
    model.learn(200)
    model.train(gradient_steps=2, batch_size=8)
    faults = []
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = th.empty(16 * 2**20).fill_(1.0)
        del block
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"faults": faults[2:], "applied": keep_freed_memory().glibc_heap}))
    """
)

PAGES = 16 * 2**20 * 4 // 4096  # the block's 4 KiB pages


def block_faults(keep: bool) -> tuple[list[int], bool]:
    """Page faults of each round after the first two, and whether the setting was applied."""
    env = {**os.environ, ENV_VARIABLE: "1" if keep else "0"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["faults"], result["applied"]


def test_freed_memory_is_kept_and_the_opt_out_leaves_glibc_alone():
    (kept, applied), (default, applied_by_default) = block_faults(True), block_faults(False)
    assert applied and not applied_by_default
    # glibc's own setting maps the block afresh in every round and faults in every page.
    assert min(default) >= PAGES
    # Kept: the rounds reuse the freed pages (a round may still grow the heap once).
    assert sum(kept) <= PAGES * 1.5 and sorted(kept)[len(kept) // 2] < PAGES / 100
