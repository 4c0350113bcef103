"""How a HigherLowerEasy player guesses, against the task's two reference players.

POPGym's HigherLower deals one 52-card deck; before each card the player guesses whether it ranks
higher (action 0) or lower (action 1) than the card showing, for +1/52 when right, -1/52 when
wrong and 0 on a tie. Two scripted players bound what a learner can score:

- ``memoryless``: the best guess from the card showing alone, higher below the middle rank (the 7;
  popgym ranks the ace lowest), lower above it (either at the 7): the ceiling of a player without memory;
- ``counting``: counts the cards already seen and guesses the side with more cards left (the
  middle-rank rule on a tie): what memory can add.

Each player, and each saved model given (``AMAGO.save`` zips; greedy, carrying its context through
``predict``), plays the same ``--episodes`` decks (one env, reset with seeds ``--seed``,
``--seed`` + 1, ...). Readings per player:

- ``score``: POPGym-normalised mean return (``popgym_normalized_score``) and its standard error;
- ``p_higher`` per rank of the card showing: the share of those steps it guessed higher;
- ``agree_memoryless`` / ``agree_counting``: the share of its guesses that match the reference's,
  over the steps where the reference prefers a side (ties left out).

    python benchmarks/higher_lower_probe.py [MODEL.zip ...] --episodes 2000 --name higher_lower_probe

Results: ``benchmarks/results/<name>.json`` / ``.md``; a model's row is labelled with its env steps
where a ``meta.json`` of ``learning.py``'s checkpoints lies beside it.
"""

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from common import checkpoint_label, run_metadata
from curves import EVAL_SEED_OFFSET, table_report, write_report

import sb3_amago  # noqa: F401  (registers the envs)
from sb3_amago import AMAGO
from sb3_amago.envs.popgym_envs import popgym_normalized_score

ENV_ID = "amago-popgym-HigherLowerEasy-v0"
N_RANKS = 13
MIDDLE = N_RANKS // 2
HIGHER, LOWER = 0, 1

#: ``(rank showing, cards of each rank not yet shown (N_RANKS,)) -> guess``, or None for no preference.
Preference = Callable[[int, np.ndarray], int | None]
#: One episode's player: ``(rank showing, cards of each rank not yet shown, env observation) -> guess``.
Player = Callable[[int, np.ndarray, dict[str, Any]], int]


def memoryless_preference(rank: int, unseen: np.ndarray) -> int | None:
    """The best guess from the card showing alone (None at the middle rank, where both sides tie)."""
    return None if rank == MIDDLE else HIGHER if rank < MIDDLE else LOWER


def counting_preference(rank: int, unseen: np.ndarray) -> int | None:
    """The side with more cards not yet shown (None when both sides have as many)."""
    higher, lower = unseen[rank + 1 :].sum(), unseen[:rank].sum()
    return None if higher == lower else HIGHER if higher > lower else LOWER


REFERENCES: dict[str, Preference] = {"memoryless": memoryless_preference, "counting": counting_preference}


def scripted(preference: Preference) -> Callable[[], Player]:
    """A player that follows ``preference`` and breaks its ties by the middle-rank rule."""

    def guess(rank: int, unseen: np.ndarray, obs: dict[str, Any]) -> int:
        choice = preference(rank, unseen)
        return choice if choice is not None else HIGHER if rank < MIDDLE else LOWER

    return lambda: guess


def greedy_model(model: AMAGO) -> Callable[[], Player]:
    """A saved model acting greedily, its context carried from step to step by ``predict``."""

    def new_episode() -> Player:
        context: dict[str, Any] = {"state": None, "start": np.array([True])}

        def guess(rank: int, unseen: np.ndarray, obs: dict[str, Any]) -> int:
            action, context["state"] = model.predict(obs, context["state"], context["start"], deterministic=True)
            context["start"] = np.array([False])
            return int(action)

        return guess

    return new_episode


def play(new_player: Callable[[], Player], episodes: int, seed: int) -> dict[str, Any]:
    """The readings of one player over ``episodes`` decks (see the module docstring)."""
    env = gym.make(ENV_ID)
    returns = np.zeros(episodes)
    guesses = np.zeros((N_RANKS, 2))  # (rank showing, guess): counts
    agree = {name: np.zeros(2) for name in REFERENCES}  # (matches, steps with a preference)
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        player = new_player()
        unseen = np.full(N_RANKS, 4)  # one deck: four cards of each rank
        done = False
        while not done:
            rank = int(obs["observation"])
            unseen[rank] -= 1
            choice = player(rank, unseen, obs)
            guesses[rank, choice] += 1
            for name, preference in REFERENCES.items():
                wanted = preference(rank, unseen)
                if wanted is not None:
                    agree[name] += (choice == wanted, 1)
            obs, reward, terminated, truncated, _ = env.step(choice)
            returns[episode] += float(reward)
            done = terminated or truncated
    env.close()
    scores = np.array([popgym_normalized_score(ENV_ID, r) for r in returns])
    shown = guesses.sum(1)
    return {
        "score": float(scores.mean()),
        "score_se": float(scores.std(ddof=1) / np.sqrt(episodes)) if episodes > 1 else float("nan"),
        "p_higher": [float(g[HIGHER] / n) if n else float("nan") for g, n in zip(guesses, shown, strict=True)],
        **{f"agree_{name}": float(matches / steps) for name, (matches, steps) in agree.items()},
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", type=Path, help="saved models (.zip)")
    parser.add_argument("--episodes", type=int, default=2_000, help="decks each player plays")
    parser.add_argument("--seed", type=int, default=EVAL_SEED_OFFSET, help="the first deck's reset seed")
    parser.add_argument("--name", default="higher_lower_probe", help="results file name")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    th.set_num_threads(1)
    players: list[tuple[str, Callable[[], Player]]] = [(name, scripted(pref)) for name, pref in REFERENCES.items()]
    players += [(checkpoint_label(path), greedy_model(AMAGO.load(path, device="cpu"))) for path in args.models]
    rows = []
    for name, player in players:
        row = {"player": name, **play(player, args.episodes, args.seed)}
        print({k: v for k, v in row.items() if k != "p_higher"}, flush=True)
        rows.append(row)
    header = ("player", "score", "agrees with memoryless", "agrees with counting", "P(higher) by rank showing, A (low) to K")
    table = [
        (
            row["player"],
            f"{row['score']:.4f} ± {row['score_se']:.4f}",
            f"{row['agree_memoryless']:.3f}",
            f"{row['agree_counting']:.3f}",
            " ".join(f"{p:.2f}" for p in row["p_higher"]),
        )
        for row in rows
    ]
    meta = run_metadata()
    description = (
        f"{args.episodes} decks of HigherLowerEasy (reset seeds {args.seed} on), the same for every player; "
        "score: POPGym-normalised mean return ± its standard error. Players and readings: see the docstring "
        "of `benchmarks/higher_lower_probe.py`."
    )
    lines = table_report(args.name, meta, description, header, table)
    write_report(args.out_dir, args.name, {"episodes": args.episodes, "seed": args.seed, "rows": rows, **meta}, lines)


if __name__ == "__main__":
    main()
