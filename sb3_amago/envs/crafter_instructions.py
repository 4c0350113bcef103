"""Crafter with instructions: up to 5 goals, each an achievement or a region to travel to, in order.

A gymnasium adapter around Crafter (Hafner 2021; the ``crafter`` package uses the old gym API),
driven by instructions instead of Crafter's own reward:

* Goal tokens: ``1 .. 22`` are Crafter's achievements in ``crafter.constants.achievements`` order
  (``collect_coal`` ... ``wake_up``); then one token per region of a ``region_grid x region_grid``
  grid over the world (region ``(i, j)`` covers ``x`` in the ``i``-th and ``y`` in the ``j``-th
  slice of the area): "travel there". :meth:`CrafterInstructions.goal_token` and
  :attr:`CrafterInstructions.goal_names` convert between names and tokens.
* ``achieved`` at a step: every achievement whose count went up this step (it counts each time, not
  only the first), then the token of the region the player stands in; 0 pads. It is all zeros at
  reset.
* Instruction: ``min_goals..max_goals`` distinct goals drawn uniformly from every achievement and
  every region but the start region (the player starts at the centre of the world).
  ``reset(options={"instruction": [...]})`` sets one, e.g. the paper's
  ``[env.goal_token("make_stone_pickaxe"), env.goal_token("collect_iron")]``.
* Observation: ``"image"``: ``Box(0, 255, (image_size, image_size, 3), uint8)``, Crafter's local
  view with the inventory below it; plus ``"instruction"``, ``"achieved"`` and ``"prev_reward"``,
  see :mod:`sb3_amago.envs.instruction`.
* Actions: ``Discrete(17)``, Crafter's (``noop``, four moves, ``do``, ``sleep``, place and make ...).
* Reward: 1 (``success_reward``) per goal completed in order; Crafter's own reward is not used.
* Episode: terminates when the instruction is complete or the player dies; truncated after
  ``horizon`` steps (Crafter's own default length, 10,000).
* Seeding: each reset draws a world seed from the env's ``np_random``, so ``reset(seed=s)``
  reproduces the world and, with the same actions, the whole episode.
* Solved: success rate 1. Instructions are hard: the AMAGO paper reports about 40% success on
  "make stone pickaxe, collect iron".

Needs the ``crafter`` package (the ``envs`` extra: ``pip install 'sb3-amago[envs]'``).
"""

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
from gymnasium import spaces

from sb3_amago.envs.checks import check_int
from sb3_amago.envs.instruction import InstructionEnv

IMAGE_KEY = "image"


def import_crafter() -> ModuleType:
    """Import crafter, or raise an ImportError that names the ``envs`` extra."""
    try:
        import crafter
    except ImportError as err:
        raise ImportError(
            "CrafterInstructions needs the crafter package: pip install 'sb3-amago[envs]' (or pip install crafter)"
        ) from err
    return crafter


class CrafterInstructions(InstructionEnv):
    """Crafter driven by instructions (see the module docstring for the full spec).

    :param min_goals: fewest goals per instruction (drawn uniformly between min and max per episode)
    :param max_goals: most goals per instruction, the width of ``"instruction"``
    :param region_grid: the travel goals split the world into ``region_grid x region_grid`` regions
    :param area: side of Crafter's square world (64 in Crafter; smaller worlds generate faster)
    :param image_size: side of the square image observation
    :param horizon: steps before truncation
    :param success_reward: reward per goal completed
    :param render_mode: ``"rgb_array"`` (the current image) or None
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        min_goals: int = 1,
        max_goals: int = 5,
        region_grid: int = 4,
        area: int = 64,
        image_size: int = 64,
        horizon: int = 10_000,
        success_reward: float = 1.0,
        render_mode: str | None = None,
    ) -> None:
        self._crafter_module = import_crafter()
        self.area = check_int("area", area, 16)
        self.region_grid = check_int("region_grid", region_grid, 1, self.area)
        self.image_size = check_int("image_size", image_size, 9)
        self.achievements: tuple[str, ...] = tuple(self._crafter_module.constants.achievements)
        regions = [f"travel_{i}_{j}" for i in range(self.region_grid) for j in range(self.region_grid)]
        #: ``goal_names[token]``, ``""`` for the empty token 0.
        self.goal_names: tuple[str, ...] = ("", *self.achievements, *regions)
        check_int("max_goals", max_goals, 1, len(self.goal_names) - 2)
        super().__init__(
            task_spaces={IMAGE_KEY: spaces.Box(0, 255, shape=(self.image_size, self.image_size, 3), dtype=np.uint8)},
            n_actions=len(self._crafter_module.constants.actions),
            n_tokens=len(self.goal_names),
            achieved_size=len(self.achievements) + 1,
            min_goals=min_goals,
            max_goals=max_goals,
            horizon=horizon,
            success_reward=success_reward,
            render_mode=render_mode,
        )
        self._crafter_env: Any = None
        self._image = np.zeros((self.image_size, self.image_size, 3), dtype=np.uint8)
        self._counts = np.zeros(len(self.achievements), dtype=np.int64)
        # Crafter places the player at the centre of the area at every reset.
        self._start_region = self._region_token((self.area // 2, self.area // 2))

    def goal_token(self, name: str) -> int:
        """The token of an achievement (``"collect_wood"``) or a region (``"travel_1_2"``)."""
        if name not in self.goal_names[1:]:
            raise ValueError(f"Unknown goal {name!r}: expected one of {list(self.goal_names[1:])}")
        return self.goal_names.index(name)

    def _region_token(self, position: Sequence[int]) -> int:
        i, j = (int(p) * self.region_grid // self.area for p in position)
        return 1 + len(self.achievements) + i * self.region_grid + j

    def _reset_task(self) -> None:
        seed = int(self.np_random.integers(2**31 - 1))
        self._crafter_env = self._crafter_module.Env(
            area=(self.area, self.area),
            size=(self.image_size, self.image_size),
            reward=False,
            length=None,
            seed=seed,
        )
        self._image = self._crafter_env.reset()
        self._counts = np.zeros(len(self.achievements), dtype=np.int64)

    def _sample_goals(self, n: int) -> Sequence[int]:
        pool = np.delete(np.arange(1, len(self.goal_names)), self._start_region - 1)
        return self.np_random.choice(pool, size=n, replace=False).tolist()

    def _act(self, action: int) -> tuple[Sequence[int], bool]:
        self._image, _, _, info = self._crafter_env.step(action)
        counts = np.array([info["achievements"][name] for name in self.achievements], dtype=np.int64)
        unlocked = (np.flatnonzero(counts > self._counts) + 1).tolist()
        self._counts = counts
        dead = info["discount"] == 0
        return [*unlocked, self._region_token(info["player_pos"])], dead

    def _task_obs(self) -> dict[str, np.ndarray]:
        return {IMAGE_KEY: self._image.copy()}

    def render(self) -> np.ndarray | None:
        """``"rgb_array"``: the current image observation."""
        return self._image.copy() if self.render_mode == "rgb_array" else None
