"""Benchmark envs and adapters, registered with gymnasium when ``sb3_amago`` is imported.

Every id has the form ``amago-<Name>-v0`` (no ``/`` namespace, so RL Zoo can build log paths
from it); :mod:`sb3_amago.envs.registration` lists them and registers them here, by entry-point
strings only: an env module (and its optional dependencies: popgym, mazelib, crafter, mujoco, the
``envs`` extra) is imported only when one of its ids is made.
"""

from sb3_amago.envs.registration import register_envs, registered_ids

register_envs()

__all__ = ["register_envs", "registered_ids"]
