"""POPGym (Morad et al., ICLR 2023) for AMAGO: the 48 envs of popgym 1.0.7 as ``amago-popgym-<Name>-v0``.

Each id is popgym's env with the previous reward in the observation (:class:`PrevRewardWrapper`),
action checking (a ``ValueError`` naming the valid range) and, for the Labyrinth envs, maze
generation seeded from the env's own seed stream. Observation and action spaces are popgym's:
Tuple observations become Dict keys ``observation_0, observation_1, ...``; MultiDiscrete
observations and actions are kept. ``<Name>`` is popgym's id name (``popgym-<Name>-v0``; note
popgym's spelling ``VelocityOnlyCartpole``); the helpers below accept any capitalisation and
popgym's or this package's full ids.

Episode ends, checked per env in popgym's code and by rollouts (``tests/test_envs_core.py``):

============================  ==========================================  =================================
family                        terminated                                  truncated (time limit)
============================  ==========================================  =================================
Autoencode, CountRecall,      the game is over: every card dealt /        never
HigherLower, RepeatFirst,     recited (a fixed-length game; no reward
RepeatPrevious                can follow, so this is a true end)
Battleship                    all ships sunk                              board_size**2 shots
Concentration                 all pairs found                             ceil(2n - n / (2n - 1)) flips
MineSweeper                   a mine, or every free cell cleared          cells - mines clicks
MultiarmedBandit              never                                       200 / 400 / 600 pulls
LabyrinthEscape               the exit reached                            1023 steps
LabyrinthExplore              every free cell visited                     1023 steps
*CartPole (3 families)        the pole fell or the cart left the track    200 / 400 / 600 (Noisy: 200)
*Pendulum (2 families)        never                                       200 / 150 / 100 (Noisy: 200)
============================  ==========================================  =================================

No env reports ``terminated`` at a pure time limit, so no flag is rewritten.

Return ranges (:data:`POPGYM_RETURN_RANGES`) are the least and greatest episodic return popgym's
reward code allows, derived from popgym 1.0.7's source (per-step reward scales times the number of
steps) and checked by rollouts, with scripted best and worst policies where they can be written
(tests). :func:`popgym_normalized_score` maps them to 0 and 1:

==========================  ===================  ===================  ===================
family                      Easy                 Medium               Hard
==========================  ===================  ===================  ===================
Battleship                  [-64/52, 1]          [-100/88, 1]         [-144/132, 1]
HigherLower                 [-51/52, 51/52]      [-103/104, 103/104]  [-155/156, 155/156]
LabyrinthEscape             [-1023/1024, 1023/1024] (all three)
LabyrinthExplore            [-1023/1024, 1] (all three)
*CartPole (3 families)      [0, 1] (all)
the other 9 families        [-1, 1] (all)
==========================  ===================  ===================  ===================

Battleship's least return is a miss on every one of the ``B^2`` shots (``-1 / (B^2 - 12)`` each);
HigherLower has ``N - 1`` guesses of ``+-1/N`` for an ``N``-card deck; the Labyrinths pay ``-1/L``
(``L = 1024``) per step for ``L - 1`` steps, and Escape ``+1`` at the exit, reachable on the first step
at best. gymnasium 1.x's CartPole pays ``+1`` on every step, the terminating one included, so popgym's
``-1`` failure reward never fires: returns are ``steps / limit`` in ``[0, 1]`` (0 is a bound; the
fastest fall takes a few steps).

Solved: a normalised score near 1 (AMAGO reports a mean of 0.95 over the 39 envs of the POPGym paper).
Each env's spaces, episode and rewards are documented in popgym's classes (``popgym.envs``).
"""

import copy
import difflib
import random
from typing import Any

import gymnasium as gym
import numpy as np

from sb3_amago.envs.checks import check_action
from sb3_amago.envs.popgym_ranges import POPGYM_RETURN_RANGES
from sb3_amago.wrappers import PrevRewardWrapper

_INSTALL_HINT = "install the envs extra: pip install 'sb3-amago[envs]'"
_BY_LOWER = {name.lower(): name for name in POPGYM_RETURN_RANGES}
DIFFICULTIES = ("easy", "medium", "hard")


def popgym_env_name(env_name_or_id: str) -> str:
    """The canonical POPGym name for ``"RepeatPreviousEasy"``, ``"popgym-RepeatPreviousEasy-v0"``,
    ``"amago-popgym-RepeatPreviousEasy-v0"`` (any capitalisation).

    :raises ValueError: for a name that is not one of the 48 envs
    """
    key = str(env_name_or_id).lower()
    for prefix in ("amago-popgym-", "popgym-"):
        key = key.removeprefix(prefix)
    key = key.removesuffix("-v0")
    if key not in _BY_LOWER:
        close = difflib.get_close_matches(key, list(_BY_LOWER), n=3)
        hint = f" Did you mean {', '.join(_BY_LOWER[c] for c in close)}?" if close else ""
        raise ValueError(
            f"Unknown POPGym env {env_name_or_id!r}.{hint} Valid names: popgym_env_names() "
            f"({len(POPGYM_RETURN_RANGES)} envs, e.g. RepeatPreviousEasy)."
        )
    return _BY_LOWER[key]


def popgym_env_names(difficulty: str | None = None) -> list[str]:
    """The POPGym env names, all 48 or those of one difficulty (``"easy"``, ``"medium"``, ``"hard"``).

    :raises ValueError: for another difficulty
    """
    if difficulty is None:
        return list(POPGYM_RETURN_RANGES)
    if str(difficulty).lower() not in DIFFICULTIES:
        raise ValueError(f"Unknown POPGym difficulty {difficulty!r}: use one of {DIFFICULTIES} or None for all.")
    suffix = str(difficulty).lower().capitalize()
    return [name for name in POPGYM_RETURN_RANGES if name.endswith(suffix)]


def popgym_return_range(env_name_or_id: str) -> tuple[float, float]:
    """``(min, max)`` episodic return of a POPGym env (see the module docstring)."""
    return POPGYM_RETURN_RANGES[popgym_env_name(env_name_or_id)]


def popgym_normalized_score(env_name_or_id: str, episodic_return: float) -> float:
    """``(R - min) / (max - min)``: 0 at the env's least possible return, 1 at its greatest.

    :raises ValueError: for an unknown env
    """
    low, high = popgym_return_range(env_name_or_id)
    return (float(episodic_return) - low) / (high - low)


def _popgym_class(name: str) -> type[gym.Env]:
    """popgym's env class for a canonical name; ImportError naming the extra if popgym is missing."""
    try:
        import popgym.envs
    except ImportError as err:
        raise ImportError(f"The POPGym envs need popgym: {_INSTALL_HINT}") from err
    classes = {spec["id"].removeprefix("popgym-").removesuffix("-v0"): cls for cls, spec in popgym.envs.ALL.items()}
    if name not in classes:
        if name.startswith("Labyrinth") and not popgym.envs.has_mazelib():
            raise ImportError(f"The POPGym Labyrinth envs need mazelib: {_INSTALL_HINT}")
        raise ImportError(f"The installed popgym has no env {name!r}; sb3-amago's POPGym table is popgym 1.0.7's.")
    return classes[name]


class POPGymAdapter(gym.Wrapper):
    """Checks actions, copies infos and, for mazes, seeds maze generation from the env's seed stream.

    Infos are deep-copied because some popgym envs (CountRecall, MultiarmedBandit) return their
    internal arrays in them, which later steps would overwrite.

    popgym's Labyrinths draw mazes from Python's and NumPy's *global* generators (reseeding them on
    ``reset(seed=...)``). Here each reset draws a maze seed from the adapter's own generator (seeded
    by ``reset(seed=...)``), generates the maze with it and restores the global generators, so mazes
    are reproducible per env and other code's randomness is left alone.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        try:
            from popgym.core.maze import MazeEnv
        except ImportError:  # no mazelib, hence no maze envs
            self._is_maze = False
        else:
            self._is_maze = isinstance(env.unwrapped, MazeEnv)
        self._maze_rng: np.random.Generator | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset the popgym env; mazes are drawn from this adapter's generator."""
        if self._is_maze:
            obs, info = self._reset_maze(seed, options)
        else:
            obs, info = self.env.reset(seed=seed, options=options)
        return obs, copy.deepcopy(info)

    def _reset_maze(self, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        if seed is not None or self._maze_rng is None:
            self._maze_rng = np.random.default_rng(seed)
        maze_seed = int(self._maze_rng.integers(2**31))
        py_state, np_state = random.getstate(), np.random.get_state()
        try:
            # popgym reseeds both global generators itself when given a seed: pass the maze seed then
            random.seed(maze_seed)
            np.random.seed(maze_seed)
            return self.env.reset(seed=None if seed is None else maze_seed, options=options)
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Check the action, then step the popgym env."""
        check_action(self.action_space, action)
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, copy.deepcopy(info)


def make_popgym(name: str) -> gym.Env:
    """The registered ``amago-popgym-<name>-v0`` env: popgym's env, adapted, with the previous reward.

    :param name: a POPGym name or id (see :func:`popgym_env_name`)
    :raises ValueError: for an unknown name
    :raises ImportError: naming the ``envs`` extra if popgym (or, for Labyrinths, mazelib) is missing
    """
    return PrevRewardWrapper(POPGymAdapter(_popgym_class(popgym_env_name(name))()))
