"""MazeRunner: visit 1 to 3 cells of a random maze in a given order, seeing only local wall distances.

Each episode draws a new ``size x size`` maze (a perfect maze from a randomized depth-first search
over the cells: exactly one path joins any two cells), a random start cell, and an instruction of
``min_goals..max_goals`` distinct goal cells (none of them the start cell).

* Observation ``"observation"``: ``Box(0, 1, (6,), float32)``:
  ``[up, right, down, left, row, col]`` where the first four are the number of cells the agent could
  move in that direction before a wall, divided by ``size - 1`` (a lidar reading), and ``row, col``
  are the agent's cell divided by ``size - 1`` (row 0 is the top).
  Plus ``"instruction"`` (``MultiDiscrete([size**2 + 1] * max_goals)``), ``"achieved"``
  (``MultiDiscrete([size**2 + 1])``) and ``"prev_reward"``, see :mod:`sb3_amago.envs.instruction`.
* Goal tokens: cell ``(row, col)`` is token ``row * size + col + 1``. ``achieved`` at a step is the
  cell the agent stands on (0 at reset).
* Actions: ``Discrete(5)``: 0 up, 1 right, 2 down, 3 left, 4 stay. Moving into a wall stays put.
* Reward: 1 (``success_reward``) on arriving at the current goal cell, goals in order.
* Episode: terminates when the last goal is reached; truncated after ``horizon`` steps, default
  ``4 * size**2``: an agent that remembers what it has seen can explore the whole maze depth-first
  (fewer than ``2 * size**2`` moves, passing every cell) and still walk back along shortest paths
  (each shorter than ``size**2`` moves) to the two goals it may have passed before their turn.
* Solved: success rate 1, i.e. a return equal to the number of goals (mean 2 with the default 1-3).

:func:`shortest_path` and :meth:`MazeRunner.solver_action` are a BFS solver that knows the maze.
"""

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from sb3_amago.envs.checks import check_int
from sb3_amago.envs.instruction import InstructionEnv
from sb3_amago.keys import OBS_KEY

MIN_SIZE, MAX_SIZE = 3, 30
#: (row, col) offsets of the move actions 0 up, 1 right, 2 down, 3 left.
MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))
STAY = 4
OPPOSITE = (2, 3, 0, 1)


def generate_maze(size: int, rng: np.random.Generator) -> np.ndarray:
    """A perfect ``size x size`` maze by randomized depth-first search.

    :return: ``(size, size, 4)`` bool, ``passages[r, c, d]`` is True when the agent can move from
        cell ``(r, c)`` in direction ``d`` (0 up, 1 right, 2 down, 3 left)
    """
    passages = np.zeros((size, size, 4), dtype=bool)
    visited = np.zeros((size, size), dtype=bool)
    start = (int(rng.integers(size)), int(rng.integers(size)))
    visited[start] = True
    stack = [start]
    while stack:
        row, col = stack[-1]
        unvisited = [
            d
            for d, (dr, dc) in enumerate(MOVES)
            if 0 <= row + dr < size and 0 <= col + dc < size and not visited[row + dr, col + dc]
        ]
        if not unvisited:
            stack.pop()
            continue
        d = unvisited[int(rng.integers(len(unvisited)))]
        nxt = (row + MOVES[d][0], col + MOVES[d][1])
        passages[row, col, d] = True
        passages[nxt][OPPOSITE[d]] = True
        visited[nxt] = True
        stack.append(nxt)
    return passages


def shortest_path(passages: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> list[int]:
    """The move actions of a shortest path from ``start`` to ``goal`` (breadth-first search).

    :return: a list of actions in ``0..3``, empty when ``start == goal``
    """
    came_from: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    frontier = deque([start])
    while frontier:
        cell = frontier.popleft()
        if cell == goal:
            break
        for d, (dr, dc) in enumerate(MOVES):
            nxt = (cell[0] + dr, cell[1] + dc)
            if passages[cell][d] and nxt not in came_from:
                came_from[nxt] = (cell, d)
                frontier.append(nxt)
    if goal not in came_from:
        raise ValueError(f"No path from {start} to {goal}")
    actions = []
    cell = goal
    while (link := came_from[cell]) is not None:
        cell, d = link
        actions.append(d)
    return actions[::-1]


class MazeRunner(InstructionEnv):
    """Visit goal cells of a random maze in order (see the module docstring for the full spec).

    :param size: side of the maze in cells, 3 to 30
    :param min_goals: fewest goals per instruction (drawn uniformly between min and max per episode)
    :param max_goals: most goals per instruction, the width of ``"instruction"``
    :param horizon: steps before truncation, default ``4 * size**2``
    :param success_reward: reward per goal reached
    :param render_mode: ``"ansi"`` or None
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"]}

    def __init__(
        self,
        size: int = 15,
        min_goals: int = 1,
        max_goals: int = 3,
        horizon: int | None = None,
        success_reward: float = 1.0,
        render_mode: str | None = None,
    ) -> None:
        self.size = check_int("size", size, MIN_SIZE, MAX_SIZE)
        check_int("max_goals", max_goals, 1, self.size**2 - 1)
        super().__init__(
            task_spaces={OBS_KEY: spaces.Box(0.0, 1.0, shape=(6,), dtype=np.float32)},
            n_actions=5,
            n_tokens=self.size**2 + 1,
            achieved_size=1,
            min_goals=min_goals,
            max_goals=max_goals,
            horizon=4 * self.size**2 if horizon is None else horizon,
            success_reward=success_reward,
            render_mode=render_mode,
        )
        self.passages = np.zeros((self.size, self.size, 4), dtype=bool)
        self.agent = (0, 0)

    def cell_token(self, row: int, col: int) -> int:
        """The goal token of cell ``(row, col)``."""
        check_int("row", row, 0, self.size - 1)
        check_int("col", col, 0, self.size - 1)
        return row * self.size + col + 1

    def token_cell(self, token: int) -> tuple[int, int]:
        """The cell ``(row, col)`` of a goal token."""
        row, col = divmod(check_int("token", token, 1, self.size**2) - 1, self.size)
        return row, col

    def _reset_task(self) -> None:
        self.passages = generate_maze(self.size, self.np_random)
        self.agent = (int(self.np_random.integers(self.size)), int(self.np_random.integers(self.size)))

    def _sample_goals(self, n: int) -> Sequence[int]:
        others = np.delete(np.arange(self.size**2), self.cell_token(*self.agent) - 1)
        return (self.np_random.choice(others, size=n, replace=False) + 1).tolist()

    def _act(self, action: int) -> tuple[Sequence[int], bool]:
        if action != STAY and self.passages[self.agent][action]:
            self.agent = (self.agent[0] + MOVES[action][0], self.agent[1] + MOVES[action][1])
        return [self.cell_token(*self.agent)], False

    def _task_obs(self) -> dict[str, np.ndarray]:
        scale = self.size - 1
        lidar = []
        for d, (dr, dc) in enumerate(MOVES):
            row, col = self.agent
            steps = 0
            while self.passages[row, col, d]:
                row, col, steps = row + dr, col + dc, steps + 1
            lidar.append(steps / scale)
        position = [self.agent[0] / scale, self.agent[1] / scale]
        return {OBS_KEY: np.array(lidar + position, dtype=np.float32)}

    def solver_action(self) -> int:
        """The first action of a shortest path to the current goal (``STAY`` once done or on it)."""
        goal = self.current_goal
        if goal == 0:
            return STAY
        path = shortest_path(self.passages, self.agent, self.token_cell(goal))
        return path[0] if path else STAY

    def render(self) -> str | None:
        """``"ansi"``: the maze as text, ``#`` walls, ``@`` the agent, ``1..k`` the goals left."""
        if self.render_mode != "ansi":
            return None
        side = 2 * self.size + 1
        grid = np.full((side, side), "#")
        for row in range(self.size):
            for col in range(self.size):
                grid[2 * row + 1, 2 * col + 1] = " "
                if self.passages[row, col, 1]:
                    grid[2 * row + 1, 2 * col + 2] = " "
                if self.passages[row, col, 2]:
                    grid[2 * row + 2, 2 * col + 1] = " "
        for slot in range(self._progress, self._n_goals):
            row, col = self.token_cell(int(self.instruction[slot]))
            grid[2 * row + 1, 2 * col + 1] = str(slot + 1)
        grid[2 * self.agent[0] + 1, 2 * self.agent[1] + 1] = "@"
        return "\n".join("".join(line) for line in grid)
