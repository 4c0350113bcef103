"""benchmarks/higher_lower_probe.py: the reference players of HigherLowerEasy and a model's readings."""

import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from higher_lower_probe import (
    HIGHER,
    LOWER,
    MIDDLE,
    N_RANKS,
    REFERENCES,
    counting_preference,
    main,
    memoryless_preference,
    play,
    scripted,
)
from test_amago import tiny_model


def test_memoryless_reference_guesses_away_from_the_middle_rank() -> None:
    unseen = np.full(N_RANKS, 4)
    assert [memoryless_preference(rank, unseen) for rank in range(N_RANKS)] == [HIGHER] * MIDDLE + [None] + [LOWER] * MIDDLE


def test_counting_reference_follows_the_cards_not_yet_shown() -> None:
    unseen = np.full(N_RANKS, 4)
    assert counting_preference(MIDDLE, unseen) is None, "a full deck ties at the middle rank"
    unseen[MIDDLE + 1 :] = 0  # every higher card shown
    assert counting_preference(MIDDLE, unseen) == LOWER
    assert counting_preference(2, unseen) == HIGHER, "the four ranks between still outnumber the two below"


def test_counting_reference_overrides_the_rank_rule_when_the_deck_says_so() -> None:
    unseen = np.zeros(N_RANKS, dtype=np.int64)
    unseen[0] = 4  # only aces (the lowest rank) left
    assert counting_preference(2, unseen) == LOWER, "below the middle, yet every card left is lower"
    unseen[:] = 0
    unseen[12] = 1
    assert counting_preference(10, unseen) == HIGHER, "above the middle, yet the one card left is higher"


@pytest.mark.parametrize("name", list(REFERENCES))
def test_a_scripted_player_agrees_with_its_own_reference(name: str) -> None:
    row = play(scripted(REFERENCES[name]), episodes=5, seed=0)
    assert row[f"agree_{name}"] == 1.0
    assert 0.0 <= row["score"] <= 1.0


def test_the_memoryless_player_guesses_by_rank_and_counting_scores_more_on_the_same_decks() -> None:
    memoryless = play(scripted(REFERENCES["memoryless"]), episodes=100, seed=0)
    counting = play(scripted(REFERENCES["counting"]), episodes=100, seed=0)
    assert memoryless["p_higher"] == [1.0] * MIDDLE + [0.0] * (MIDDLE + 1), "at the middle rank (a tie) it guesses lower"
    assert memoryless["agree_counting"] < 1.0 and counting["agree_memoryless"] < 1.0
    assert counting["score"] > memoryless["score"]


def test_probe_reads_a_saved_model_and_writes_the_report(tmp_path: Path) -> None:
    model = tiny_model(gym.make("amago-popgym-HigherLowerEasy-v0"), max_seq_len=16)
    model.learn(20)
    model.save(tmp_path / "model.zip")
    main([str(tmp_path / "model.zip"), "--episodes", "2", "--name", "probe", "--out-dir", str(tmp_path)])
    rows = json.loads((tmp_path / "probe.json").read_text())["rows"]
    assert [row["player"] for row in rows] == ["memoryless", "counting", str(tmp_path / "model.zip")]
    model_row = rows[2]
    assert 0.0 <= model_row["score"] <= 1.0
    assert all(0.0 <= model_row[f"agree_{name}"] <= 1.0 for name in REFERENCES)
    shown = [p for p in model_row["p_higher"] if not np.isnan(p)]  # NaN: a rank never shown
    assert shown and all(0.0 <= p <= 1.0 for p in shown)
    assert "| memoryless |" in (tmp_path / "probe.md").read_text()
