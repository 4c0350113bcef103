"""Model and replay files: atomic writes, the checks a file passes before it replaces anything, and
the run state that lets a loaded model continue a run exactly.

The run state (:func:`run_state`) travels in the model file's data, where SB3 keeps ``_last_obs``,
which the collection context must match. Files of earlier versions load: their run state holds the
epsilon schedule's per-env multipliers as ``"explore_scale"``.
"""

import contextlib
import dataclasses
import os
import pathlib
import pickle
import random
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.save_util import load_from_pkl, load_from_zip_file

from sb3_amago.buffers import REPLAY_FORMAT_VERSION, TrajectoryReplayBuffer
from sb3_amago.policies import TransformerPolicy


@contextlib.contextmanager
def atomic_target(path: str | pathlib.Path, suffix: str) -> Iterator[pathlib.Path]:
    """A temporary path beside ``path`` (``suffix`` added to a path without one) to write to; moved
    onto it only if the block completes, removed in every case (an interrupted write never replaces
    a good file)."""
    target = pathlib.Path(path)
    if target.suffix == "":
        target = target.with_suffix(suffix)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}{target.suffix}")
    try:
        yield tmp
        with open(tmp, "rb+") as written:
            os.fsync(written.fileno())  # on disk before the rename, so a crash cannot leave an empty file
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomically(path: str | pathlib.Path | Any, suffix: str, write: Callable[[Any], None]) -> None:
    """``write(target)`` through :func:`atomic_target` where ``path`` names a file (``suffix`` added to
    one without), or straight into ``path`` where it is an open file object."""
    if not isinstance(path, (str, pathlib.Path)):
        write(path)
        return
    with atomic_target(path, suffix) as tmp:
        write(tmp)


# ------------------------------------------------------------------------------------------------
# Model files
# ------------------------------------------------------------------------------------------------
def check_model_file(path: Any, custom_objects: dict[str, Any] | None) -> None:
    """Raise a ValueError naming the problem unless ``path`` is an AMAGO model file that can resume a run."""
    try:
        data, params, _ = load_from_zip_file(path, device="cpu", load_data=True, custom_objects=custom_objects)
    except (zipfile.BadZipFile, EOFError, KeyError, RuntimeError, ValueError) as exc:
        raise ValueError(f"{path} is not a readable SB3 model file ({exc}); it may be corrupted or truncated.") from exc
    if data is None or "policy_class" not in data:
        raise ValueError(f"{path} holds no model data: was it saved with AMAGO.save()?")
    policy_class = data["policy_class"]
    if not (isinstance(policy_class, type) and issubclass(policy_class, TransformerPolicy)):
        name = getattr(policy_class, "__qualname__", policy_class)
        raise ValueError(f"{path} was saved by another algorithm (policy class {name}); load it with that algorithm's load().")
    if "policy.optimizer" not in (params or {}):
        raise ValueError(
            f"{path} was saved by an earlier sb3-amago that did not store the optimizer, so it cannot resume a run. "
            "To keep its weights, build the model as it was and load them: "
            "AMAGO(...same arguments...).set_parameters(path, exact_match=False)."
        )


def run_state(model: Any) -> dict[str, Any]:
    """What continuing the run of ``model`` (an AMAGO) exactly needs beyond the weights, the
    optimizer and what SB3 keeps in the model file itself (``num_timesteps``, ``_n_updates``,
    ``_last_obs``), as CPU copies:

    - ``"context"``: the per-env collection context (:class:`~sb3_amago.policies.AmagoState`:
      sequence-model cache, previous actions ``(N, action_dim)``, time indices ``(N,)``), or None
      before the first ``learn``
    - ``"exploration"``: the exploration's state (:meth:`~sb3_amago.exploration.Exploration.get_state`)
    - ``"rng"``: the states of torch's (and CUDA's), numpy's and python's global RNGs and of the
      action space's RNG (random actions before ``learning_starts``)
    """
    return {
        "context": map_tensors(model._collect_state, lambda t: t.detach().cpu().clone()),
        "exploration": model.exploration.get_state(),
        "rng": rng_state(model.action_space),
    }


def set_run_state(model: Any, state: dict[str, Any]) -> None:
    """Put back what :func:`run_state` returned: the context on the model's device, the exploration's
    state and the RNG states."""
    model._collect_state = map_tensors(state["context"], lambda t: t.to(model.device))
    model.exploration.set_state(state["exploration"] if "exploration" in state else {"scale": state["explore_scale"]})
    set_rng_state(state["rng"], model.action_space)


def rng_state(action_space: spaces.Space) -> dict[str, Any]:
    """The states of the global RNGs (torch, CUDA if present, numpy, python) and of ``action_space``'s."""
    rng = {
        "torch": th.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "action_space": action_space.np_random.bit_generator.state,
    }
    if th.cuda.is_available():
        rng["cuda"] = th.cuda.get_rng_state_all()
    return rng


def set_rng_state(rng: dict[str, Any], action_space: spaces.Space) -> None:
    """Put back what :func:`rng_state` returned (the CUDA states only onto as many devices)."""
    th.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    action_space.np_random.bit_generator.state = rng["action_space"]
    if "cuda" in rng and th.cuda.is_available() and len(rng["cuda"]) == th.cuda.device_count():
        th.cuda.set_rng_state_all(rng["cuda"])


def map_tensors(value: Any, fn: Callable[[th.Tensor], th.Tensor]) -> Any:
    """``value`` with ``fn`` applied to every tensor inside its dataclasses, tuples, lists and dicts."""
    if isinstance(value, th.Tensor):
        return fn(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: map_tensors(getattr(value, f.name), fn) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **fields)
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


# ------------------------------------------------------------------------------------------------
# Replay files
# ------------------------------------------------------------------------------------------------
def read_replay(
    path: Any, observation_space: spaces.Space, action_space: spaces.Space, n_envs: int, verbose: int = 0
) -> TrajectoryReplayBuffer:
    """The replay in ``path``, or a ValueError naming the problem: a file that is truncated or not a
    replay, from another replay format, or for other spaces or another number of envs."""
    try:
        buffer = load_from_pkl(path, verbose)
    except FileNotFoundError:
        raise
    except (EOFError, pickle.UnpicklingError, AttributeError, ImportError, IndexError, TypeError, ValueError) as exc:
        raise ValueError(
            f"{path} is not a readable replay file ({type(exc).__name__}: {exc}); it may be truncated or corrupted. "
            "The model keeps its replay."
        ) from exc
    if not isinstance(buffer, TrajectoryReplayBuffer):
        raise ValueError(
            f"{path} holds a {type(buffer).__name__}, not an AMAGO TrajectoryReplayBuffer: "
            "load a replay saved by AMAGO.save_replay_buffer."
        )
    version = getattr(buffer, "format_version", None)
    if version != REPLAY_FORMAT_VERSION:
        raise ValueError(
            f"{path} holds a replay in format version {version}, but this sb3-amago reads version "
            f"{REPLAY_FORMAT_VERSION}: load it with the sb3-amago version that saved it, or collect a new replay."
        )
    for name, saved, ours in (
        ("observation space", buffer.observation_space, observation_space),
        ("action space", buffer.action_space, action_space),
        ("number of envs", buffer.n_envs, n_envs),
    ):
        if saved != ours:
            raise ValueError(
                f"{path} holds a replay for {name} {saved}, but this model has {ours}: load it into a model "
                "built for the same env (and number of envs)."
            )
    return buffer
