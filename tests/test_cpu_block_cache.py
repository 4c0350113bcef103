"""The freed-block cache in front of torch's CPU allocator (sb3_amago/nets/cpu_block_cache.cpp, applied by
sb3_amago/cpu_memory.py): a CPU AMAGO installs it, an update's blocks come from it, freed blocks are reused
last-freed first within the cap, oneDNN's scratch space goes through it, and the opt-out leaves torch's
allocator alone. Each case runs in a fresh process: the cache is process-wide."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sb3_amago.cpu_memory import BLOCK_CACHE_CAP, ENV_VARIABLE
from sb3_amago.nets import cpu_kernels

pytestmark = pytest.mark.skipif(
    not cpu_kernels.buildable(),
    reason="the cache is part of the package's CPU kernels, built for x86 CPUs with AVX2 or AVX-512 only",
)

# A small CPU AMAGO with a Transformer (it loads the kernels and applies the settings), two updates to
# warm up, then the cache's counters around a third.
AMAGO_SCRIPT = textwrap.dedent(
    """
    import json
    import torch as th
    from stable_baselines3.common.env_util import make_vec_env
    from sb3_amago import AMAGO
    from sb3_amago.cpu_memory import keep_freed_memory
    from sb3_amago.nets import cpu_kernels

    th.set_num_threads(1)
    model = AMAGO("TransformerPolicy", make_vec_env("amago-TMaze-v0", n_envs=2, seed=0, env_kwargs={"corridor_length": 10}), max_seq_len=12, batch_size=8,
                  learning_starts=10**9, seed=0, device="cpu",
                  policy_kwargs={"traj_encoder_kwargs": {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1}})
    model.learn(100)
    model.train(gradient_steps=2, batch_size=8)
    before = cpu_kernels.kernels().freed_block_stats()
    model.train(gradient_steps=1, batch_size=8)
    after = cpu_kernels.kernels().freed_block_stats()
    print(json.dumps({"settings": keep_freed_memory()._asdict(), "before": before, "after": after}))
    """
)


def run_json(script: str, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_cpu_amagos_update_takes_its_blocks_from_the_cache() -> None:
    result = run_json(AMAGO_SCRIPT)
    assert result["settings"]["block_cache"]
    (held_before, hits_before, misses_before), (_, hits_after, misses_after) = result["before"], result["after"]
    assert 0 < held_before <= BLOCK_CACHE_CAP
    # A third update asks for the sizes the first two freed: every block of 4 KiB or more is reused.
    assert hits_after - hits_before > 100
    assert misses_after == misses_before


def test_the_opt_out_leaves_torchs_allocator_alone() -> None:
    result = run_json(AMAGO_SCRIPT, **{ENV_VARIABLE: "0"})
    assert result["settings"] == {"glibc_heap": False, "block_cache": False}
    assert result["before"] == result["after"] == [0, 0, 0]


# The cache by itself, with a cap of four blocks of 16 KiB.
CACHE_SCRIPT = textwrap.dedent(
    """
    import json, os
    import torch as th
    from sb3_amago import cpu_memory
    from sb3_amago.nets import cpu_kernels

    assert cpu_kernels.load()
    first = cpu_memory.keep_freed_memory().block_cache
    kernels = cpu_kernels.kernels()
    stats = kernels.freed_block_stats
    result = {"installed": first and kernels.cache_freed_blocks(4 * 16384)}

    # Last freed, first reused, per exact size; small blocks are not the cache's.
    a, b = th.empty(4096), th.empty(4096)
    a_ptr, b_ptr = a.data_ptr(), b.data_ptr()
    del a, b  # a, then b, to the list of 16 KiB blocks
    hits = stats()[1]
    c = th.empty(4096)
    other_size = th.empty(4097)
    result["reuse"] = [c.data_ptr() == b_ptr, other_size.data_ptr() not in (a_ptr, b_ptr), stats()[1] - hits]
    hits, misses = stats()[1:]
    small = th.empty(100)
    result["small_counted"] = stats()[1:] != [hits, misses]
    del c, other_size, small
    kernels.release_freed_blocks()

    # The cap: eight blocks freed one by one never leave more than four blocks' bytes held.
    blocks = [th.empty(4096) for _ in range(8)]
    held = []
    while blocks:
        blocks.pop()
        held.append(stats()[0])
    result["held"] = held
    kernels.release_freed_blocks()
    result["released"] = stats()[0]

    # oneDNN's convolution takes its scratch space through raw_allocate: a data pointer that is its context.
    conv = th.nn.Conv2d(3, 8, 3)
    x = th.randn(2, 3, 16, 16, requires_grad=True)
    conv(x).square().sum().backward()
    result["conv_grad_finite"] = bool(x.grad.isfinite().all())

    # A forked child allocates and frees through the cache it inherited.
    pid = os.fork()
    if pid == 0:
        os._exit(0 if float(th.ones(8192).sum()) == 8192.0 else 1)
    result["child_status"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    print(json.dumps(result))
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the script forks")
def test_freed_blocks_are_reused_last_freed_first_within_the_cap() -> None:
    result = run_json(CACHE_SCRIPT)
    assert result["installed"]
    assert result["reuse"] == [True, True, 1]
    assert not result["small_counted"]
    assert max(result["held"]) <= 4 * 16384
    assert result["held"][:4] == [16384, 2 * 16384, 3 * 16384, 4 * 16384]
    # The fifth block would pass the cap: the lists are emptied and it alone is held.
    assert result["held"][4] == 16384
    assert result["released"] == 0
    assert result["conv_grad_finite"]
    assert result["child_status"] == 0
