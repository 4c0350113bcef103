"""Argument and action checks shared by the package's envs (a leaf module: no env imports it back)."""

from numbers import Integral
from typing import Any

import numpy as np
from gymnasium import spaces


def check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` as an int, or a ``ValueError`` naming ``name`` and the valid range (bools rejected)."""
    if (
        not isinstance(value, Integral)
        or isinstance(value, bool)
        or int(value) < low
        or (high is not None and int(value) > high)
    ):
        valid = f"an integer in [{low}, {high}]" if high is not None else f"an integer >= {low}"
        raise ValueError(f"{name} must be {valid}, got {value!r}.")
    return int(value)


def check_action(space: spaces.Space, action: Any) -> None:
    """Raise a ``ValueError`` naming the valid range when ``action`` is outside ``space``.

    Box actions are checked by shape and bounds only (any float dtype is accepted).
    """
    if isinstance(space, spaces.Box):
        arr = np.asarray(action, dtype=np.float64)
        if arr.shape == space.shape and np.all(arr >= space.low) and np.all(arr <= space.high):
            return
        valid = f"float arrays of shape {space.shape} within [{space.low.min()}, {space.high.max()}]"
    elif isinstance(space, spaces.Discrete):
        if space.contains(action):
            return
        valid = f"integers in [{space.start}, {space.start + space.n - 1}]"
    elif isinstance(space, spaces.MultiDiscrete):
        if space.contains(np.asarray(action)):
            return
        valid = f"integer arrays of shape {space.nvec.shape} with 0 <= a[i] < nvec[i], nvec = {space.nvec.tolist()}"
    elif space.contains(action):
        return
    else:
        valid = f"members of {space}"
    raise ValueError(f"Action {action!r} is outside the action space {space}: valid actions are {valid}.")
