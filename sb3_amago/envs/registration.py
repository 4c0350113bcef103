"""Gymnasium registration of the package's env ids, one small function per env family.

Each family function returns :class:`EnvRegistration` records; :data:`ENV_FAMILIES` lists the
family functions and :func:`register_envs` registers them all (skipping ids already registered, so
importing twice is harmless). To add a family, write a function returning its records and append it
to :data:`ENV_FAMILIES`.

Entry points are ``"module:callable"`` strings, so an env module is imported only when one of its
ids is made, and optional dependencies (popgym, mazelib, mujoco) only when an env needs them.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from sb3_amago.envs.popgym_ranges import POPGYM_RETURN_RANGES

#: Prefix of every id registered by this package.
ID_PREFIX = "amago-"

#: T-maze corridor lengths with their own id (``amago-TMaze<H>-v0``), from Ni et al. (2023) up to AMAGO's 10,000.
TMAZE_LENGTHS = (50, 100, 500, 1000, 10_000)


@dataclass(frozen=True)
class EnvRegistration:
    """One gymnasium registration: ``gym.register(id, entry_point, kwargs=kwargs)``."""

    id: str
    entry_point: str
    kwargs: dict[str, Any] = field(default_factory=dict)


def tmaze_family() -> list[EnvRegistration]:
    """``amago-TMaze-v0`` (H = 50, override with ``corridor_length=``) and ``amago-TMaze<H>-v0``."""
    entry = "sb3_amago.envs.tmaze:make_tmaze"
    regs = [EnvRegistration(f"{ID_PREFIX}TMaze-v0", entry, {"corridor_length": 50})]
    regs += [EnvRegistration(f"{ID_PREFIX}TMaze{h}-v0", entry, {"corridor_length": h}) for h in TMAZE_LENGTHS]
    return regs


def popgym_family() -> list[EnvRegistration]:
    """``amago-popgym-<Name>-v0`` for each of POPGym 1.0.7's 48 envs (names from the return table)."""
    return [
        EnvRegistration(f"{ID_PREFIX}popgym-{name}-v0", "sb3_amago.envs.popgym_envs:make_popgym", {"name": name})
        for name in POPGYM_RETURN_RANGES
    ]


def meta_rl_family() -> list[EnvRegistration]:
    """The meta-RL envs, each inside the trials wrapper: dark key-to-door and HalfCheetah-Vel."""
    return [
        EnvRegistration(f"{ID_PREFIX}DarkKeyToDoor-v0", "sb3_amago.envs.key_door:make_dark_key_to_door"),
        EnvRegistration(f"{ID_PREFIX}HalfCheetahVel-v0", "sb3_amago.envs.cheetah_vel:make_half_cheetah_vel"),
    ]


def instruction_family() -> list[EnvRegistration]:
    """The instruction-following envs: ``amago-MazeRunner-v0`` (15 x 15), ``amago-MazeRunner7-v0`` (7 x 7, for quick examples),
    ``amago-PackageDelivery-v0`` and ``amago-CrafterInstructions-v0`` (needs the ``envs`` extra).
    """
    maze = "sb3_amago.envs.maze_runner:MazeRunner"
    return [
        EnvRegistration(f"{ID_PREFIX}MazeRunner-v0", maze, {"size": 15}),
        EnvRegistration(f"{ID_PREFIX}MazeRunner7-v0", maze, {"size": 7}),
        EnvRegistration(f"{ID_PREFIX}PackageDelivery-v0", "sb3_amago.envs.package_delivery:PackageDelivery"),
        EnvRegistration(f"{ID_PREFIX}CrafterInstructions-v0", "sb3_amago.envs.crafter_instructions:CrafterInstructions"),
    ]


#: The family functions :func:`register_envs` registers; append yours here.
ENV_FAMILIES: list[Callable[[], list[EnvRegistration]]] = [tmaze_family, popgym_family, meta_rl_family, instruction_family]


def registered_ids() -> list[str]:
    """Every id the package registers, in family order."""
    return [reg.id for family in ENV_FAMILIES for reg in family()]


def register_envs() -> None:
    """Register every family's ids with gymnasium (ids already present are left as they are)."""
    for family in ENV_FAMILIES:
        for reg in family():
            if reg.id not in gym.registry:
                gym.register(id=reg.id, entry_point=reg.entry_point, kwargs=reg.kwargs)
