"""Package Delivery: drive a truck along a forking road and drop 2 to 4 packages at addresses, in order.

The road runs from the depot (distance 0) to distance ``road_length - 1``; driving on from the last
position brings the truck back to the depot for a new trip. Each episode places ``n_forks`` forks at
distinct random distances in ``1 .. road_length - 2``; the same forks split every branch, so after
the ``j``-th fork the truck is on one of ``2**j`` branches, named by the bits of its choices so far
(``branch = sum(choice_i << i)``, choice 0 = left, 1 = right).

* Location and address: the truck at distance ``d >= 1`` on branch ``b`` is at address token
  ``1 + (d - 1) * 2**n_forks + b`` (``b`` holds only the choices made at forks before ``d``). The
  depot is no address. Learning this encoding is part of the task: to reach an address the truck
  takes, at its ``j``-th fork, the branch given by bit ``j`` of ``b``, and drops at distance ``d``.
* Instruction: ``min_packages..max_packages`` distinct addresses (each drawn as a uniform branch and
  a uniform distance), to be served in order.
* Observation ``"observation"``: ``Box(0, 1, (2,), float32)``: ``[d / (road_length - 1), at_fork]``.
  The truck does not see which branch it is on: it must remember its choices (and count the forks
  it has passed) within the trip. Plus ``"instruction"``
  (``MultiDiscrete([1 + (road_length - 1) * 2**n_forks] * max_packages)``), ``"achieved"``
  (``MultiDiscrete([same])``) and ``"prev_reward"``, see :mod:`sb3_amago.envs.instruction`.
* Actions: ``Discrete(3)``: 0 drive on (the left branch at a fork), 1 drive on (the right branch at
  a fork), 2 drop the next package here. ``achieved`` is the address where a drop was made this step,
  0 when the truck drove or dropped at the depot. A drop at the wrong address is refused: the
  package stays in the truck and the step is lost.
* Reward: 1 (``success_reward``) for each package dropped at its address, in order.
* Episode: terminates when the last package is delivered; truncated after ``horizon`` = 180 steps
  (AMAGO's setting). One trip takes ``road_length`` steps, so a truck that knows the road delivers
  every package with at most one trip each (at most ``max_packages * (road_length + 1)`` = 124 steps
  with the defaults): :meth:`PackageDelivery.solver_action` does exactly that.
* Solved: success rate 1, i.e. a return equal to the number of packages (mean 3 by default).
"""

from collections.abc import Sequence

import numpy as np
from gymnasium import spaces

from sb3_amago.envs.checks import check_int
from sb3_amago.envs.instruction import InstructionEnv
from sb3_amago.keys import OBS_KEY

#: Most forks allowed: the address vocabulary grows as ``2 ** n_forks``.
MAX_FORKS = 8
DROP = 2


class PackageDelivery(InstructionEnv):
    """Deliver packages to addresses along a forking road (see the module docstring for the full spec).

    :param road_length: positions from the depot to the road's end, >= 3
    :param n_forks: forks per episode, 0 to ``min(8, road_length - 2)``
    :param min_packages: fewest packages per episode (drawn uniformly between min and max)
    :param max_packages: most packages, the width of ``"instruction"``, at most ``road_length - 1``
    :param horizon: steps before truncation
    :param success_reward: reward per package delivered
    """

    def __init__(
        self,
        road_length: int = 30,
        n_forks: int = 3,
        min_packages: int = 2,
        max_packages: int = 4,
        horizon: int = 180,
        success_reward: float = 1.0,
    ) -> None:
        self.road_length = check_int("road_length", road_length, 3)
        self.n_forks = check_int("n_forks", n_forks, 0, min(MAX_FORKS, self.road_length - 2))
        # Every branch has road_length - 1 addresses, so this many distinct ones always exist.
        check_int("max_packages", max_packages, 1, self.road_length - 1)
        check_int("min_packages", min_packages, 1, max_packages)
        super().__init__(
            task_spaces={OBS_KEY: spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32)},
            n_actions=3,
            n_tokens=1 + (self.road_length - 1) * 2**self.n_forks,
            achieved_size=1,
            min_goals=min_packages,
            max_goals=max_packages,
            horizon=horizon,
            success_reward=success_reward,
        )
        self.forks = np.zeros(0, dtype=np.int64)
        self.distance = 0
        self.branch = 0

    def address_token(self, distance: int, branch: int) -> int:
        """The token of the address at ``distance`` on ``branch`` (bits of forks at or past
        ``distance`` are ignored)."""
        check_int("distance", distance, 1, self.road_length - 1)
        check_int("branch", branch, 0, 2**self.n_forks - 1)
        forks_before = int(np.count_nonzero(self.forks < distance))
        return 1 + (distance - 1) * 2**self.n_forks + (branch & ((1 << forks_before) - 1))

    def token_address(self, token: int) -> tuple[int, int]:
        """``(distance, branch)`` of an address token."""
        index = check_int("token", token, 1, self.n_tokens - 1) - 1
        distance, branch = divmod(index, 2**self.n_forks)
        return distance + 1, branch

    def _fork_index(self) -> int:
        """Which fork the truck is at (0 = the first), -1 when not at a fork."""
        hits = np.flatnonzero(self.forks == self.distance)
        return int(hits[0]) if len(hits) else -1

    def _reset_task(self) -> None:
        positions = self.np_random.choice(np.arange(1, self.road_length - 1), size=self.n_forks, replace=False)
        self.forks = np.sort(positions)
        self.distance = 0
        self.branch = 0

    def _sample_goals(self, n: int) -> Sequence[int]:
        goals: list[int] = []
        while len(goals) < n:
            distance = int(self.np_random.integers(1, self.road_length))
            token = self.address_token(distance, int(self.np_random.integers(2**self.n_forks)))
            if token not in goals:
                goals.append(token)
        return goals

    def _act(self, action: int) -> tuple[Sequence[int], bool]:
        if action == DROP:
            return ([self.address_token(self.distance, self.branch)] if self.distance > 0 else []), False
        fork = self._fork_index()
        if fork >= 0:
            self.branch |= action << fork
        self.distance += 1
        if self.distance == self.road_length:
            self.distance, self.branch = 0, 0
        return [], False

    def _task_obs(self) -> dict[str, np.ndarray]:
        at_fork = float(self._fork_index() >= 0)
        return {OBS_KEY: np.array([self.distance / (self.road_length - 1), at_fork], dtype=np.float32)}

    def solver_action(self) -> int:
        """What a driver who knows the encoding does: follow the current address's branch bits at
        forks and drop on arrival (drive on once every package is delivered)."""
        goal = self.current_goal
        if goal == 0:
            return 0
        if self.distance > 0 and self.address_token(self.distance, self.branch) == goal:
            return DROP
        _, branch = self.token_address(goal)
        fork = self._fork_index()
        return (branch >> fork) & 1 if fork >= 0 else 0
