"""The least and greatest episodic return of each POPGym env, by name.

Data only (no popgym import), so that registering the ``amago-popgym-*`` ids needs no env module;
:mod:`sb3_amago.envs.popgym_envs` explains how the ranges are derived and scores returns with them.
"""

_LABYRINTH_STEPS = 1024  # popgym's episode_length for every Labyrinth; episodes last one step less
# (L - 1) steps of -1/L at worst; at best the exit on the first step (Escape): 1 - 1/L.
_LABYRINTH_BOUND = (_LABYRINTH_STEPS - 1) / _LABYRINTH_STEPS


def _family(name: str, ranges: tuple[tuple[float, float], ...]) -> dict[str, tuple[float, float]]:
    """``{name}Easy/Medium/Hard`` -> their ``(min, max)`` returns."""
    return {f"{name}{level}": r for level, r in zip(("Easy", "Medium", "Hard"), ranges)}


def _same(low: float, high: float) -> tuple[tuple[float, float], ...]:
    """The same range for all three difficulties."""
    return ((low, high),) * 3


#: ``name -> (min, max)`` episodic return of each POPGym env (see the module docstring).
POPGYM_RETURN_RANGES: dict[str, tuple[float, float]] = {
    **_family("Autoencode", _same(-1.0, 1.0)),
    **_family("Battleship", tuple((-(b * b) / (b * b - 12), 1.0) for b in (8, 10, 12))),
    **_family("Concentration", _same(-1.0, 1.0)),
    **_family("CountRecall", _same(-1.0, 1.0)),
    **_family("HigherLower", tuple((-(n - 1) / n, (n - 1) / n) for n in (52, 104, 156))),
    **_family("LabyrinthEscape", _same(-_LABYRINTH_BOUND, _LABYRINTH_BOUND)),
    **_family("LabyrinthExplore", _same(-_LABYRINTH_BOUND, 1.0)),
    **_family("MineSweeper", _same(-1.0, 1.0)),
    **_family("MultiarmedBandit", _same(-1.0, 1.0)),
    **_family("NoisyPositionOnlyCartPole", _same(0.0, 1.0)),
    **_family("NoisyPositionOnlyPendulum", _same(-1.0, 1.0)),
    **_family("PositionOnlyCartPole", _same(0.0, 1.0)),
    **_family("PositionOnlyPendulum", _same(-1.0, 1.0)),
    **_family("RepeatFirst", _same(-1.0, 1.0)),
    **_family("RepeatPrevious", _same(-1.0, 1.0)),
    **_family("VelocityOnlyCartpole", _same(0.0, 1.0)),
}
