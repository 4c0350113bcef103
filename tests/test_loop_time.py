"""benchmarks/loop_time.py's timing: the share of a learn call spent in update rounds."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from loop_time import timed_learn
from test_amago import CountingEnv, tiny_model

from sb3_amago import PrevRewardWrapper


def test_timed_learn_splits_the_loop_between_updates_and_collection() -> None:
    model = tiny_model(PrevRewardWrapper(CountingEnv()), learning_starts=8, train_freq=4)
    model.learn(8)
    train = model.train

    def slow_train(*args, **kwargs) -> None:
        time.sleep(0.05)
        train(*args, **kwargs)

    model.train = slow_train
    elapsed, share = timed_learn(model, 16)  # four rounds of updates
    assert model.num_timesteps == 24 and model._n_updates == 4
    assert elapsed >= 0.2 and 0.2 / elapsed <= share < 1.0
    assert model.train is slow_train, "the model keeps the train it had"
