"""Collection beside training (``overlap_collection=True``): each update round runs in a worker
thread on the replay as it stood when the round started, collection acts with a copy of the policy
holding the weights from before the round, and whatever reads the model waits for the round."""

import time

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
from test_amago import ACTION_SPACES, CountingEnv, tiny_model

from sb3_amago import AMAGO, PrevRewardWrapper
from sb3_amago.buffers import TrajectoryReplayBuffer


class SizeRecordingReplay(TrajectoryReplayBuffer):
    """Records how many transitions it holds, and how many observations the normalisation
    statistics it is given have seen, each time a batch is drawn; it draws slowly, so that
    collection goes on meanwhile."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sizes_at_sample: list[int] = []
        self.counts_at_sample: list[float] = []

    def sample(self, batch_size, env=None):
        time.sleep(0.01)
        self.sizes_at_sample.append(self.size())
        if env is not None:
            self.counts_at_sample.append(float(env.ret_rms.count))
        return super().sample(batch_size, env=env)


class Probe(BaseCallback):
    """Calls ``on_step(model, n_calls)`` at every env step of ``learn``."""

    def __init__(self, on_step) -> None:
        super().__init__()
        self.on_step_fn = on_step

    def _on_step(self) -> bool:
        self.on_step_fn(self.model, self.n_calls)
        return True


def overlapped_model(**kwargs) -> AMAGO:
    params = {"learning_starts": 8, "train_freq": 4, "overlap_collection": True}
    return tiny_model(PrevRewardWrapper(CountingEnv(length=5)), **{**params, **kwargs})


def test_rounds_sample_the_replay_as_it_stood_when_they_started() -> None:
    model = overlapped_model(replay_buffer_class=SizeRecordingReplay, gradient_steps=2)
    learners, acting_steps = [], []

    def watch(model: AMAGO, step: int) -> None:
        if model._overlap.in_flight:
            acting_steps.append(step)
            learners.append(model._overlap.learner)

    model.learn(40, callback=Probe(watch))
    # Rounds start after steps 12, 16, ..., 40 (past learning_starts 8), two updates each.
    assert model._n_updates == 16
    sizes = model.replay_buffer.sizes_at_sample
    assert len(sizes) == 16 and all(size % 4 == 0 for size in sizes), sizes
    assert sizes == sorted(sizes) and sizes[0] == 12 and sizes[-1] == 40
    assert model.replay_buffer.size() == 40, "every transition held during a round is stored"
    # Collection after the first round acted beside a round in flight, with a copy of the policy.
    assert acting_steps and min(acting_steps) == 13
    assert all(learner is model.policy for learner in learners)
    assert not model._overlap.in_flight and model.logger.name_to_value["train/n_updates"] == 16


def test_rounds_normalise_with_the_statistics_of_their_start() -> None:
    env = VecNormalize(DummyVecEnv([lambda: PrevRewardWrapper(CountingEnv(length=5))]))
    model = tiny_model(env, learning_starts=8, train_freq=4, overlap_collection=True, replay_buffer_class=SizeRecordingReplay)
    model.learn(40)
    counts = model.replay_buffer.counts_at_sample
    assert len(counts) == 8
    # The return statistics count one reward per env step (from a tiny prior count): rounds start after steps 12, 16, ...
    assert [round(c) for c in counts] == [12, 16, 20, 24, 28, 32, 36, 40]
    assert env.ret_rms.count == pytest.approx(40, abs=0.01), "the envs' own statistics went on moving"


def test_held_transitions_are_stored_in_order() -> None:
    """CountingEnv rewards 10 * t + action on leaving step t: every stored rollout must agree."""
    model = overlapped_model()
    model.learn(60)
    rollouts = model.replay_buffer.rollouts()
    assert len(rollouts) >= 10
    for rollout in rollouts:
        steps = rollout.observations["observation"][:, 0]
        np.testing.assert_array_equal(steps, np.arange(len(steps)))
        actions = rollout.actions.argmax(-1) if rollout.actions.shape[-1] > 1 else rollout.actions[:, 0]
        np.testing.assert_allclose(rollout.rewards, 10.0 * np.arange(len(rollout.rewards)) + actions)


def test_collection_acts_with_the_weights_from_before_the_round() -> None:
    model = overlapped_model()
    model.learn(16)  # a replay to train on; the last round has been finished by learn
    learner = model.policy
    before = {k: v.clone() for k, v in learner.state_dict().items()}
    model._overlapping = True  # as inside learn
    model.train(gradient_steps=2, batch_size=4)
    acting = model.policy
    assert acting is not learner and model._overlap.in_flight
    assert all(not p.requires_grad for p in acting.parameters()) and not acting.training
    model._finish_overlapped_round()
    model._overlapping = False
    assert model.policy is learner
    for key, value in acting.state_dict().items():
        th.testing.assert_close(value, before[key], msg=key)
    changed = [k for k, v in learner.state_dict().items() if not th.equal(v, before[k])]
    assert any("traj_encoder" in k for k in changed), "the round trained the learner"


def test_predict_and_save_inside_learn_wait_for_the_round(tmp_path) -> None:
    seen = []

    def use_model(model: AMAGO, step: int) -> None:
        if step in (14, 23):
            assert model._overlap.in_flight
            model.predict(model._last_obs)
            seen.append((model._overlap.in_flight, model.policy is model._overlap.learner))
            model.save(tmp_path / f"at_{step}")

    model = overlapped_model()
    model.learn(32, callback=Probe(use_model))
    assert seen == [(False, True), (False, True)]
    loaded = AMAGO.load(tmp_path / "at_23")
    assert loaded.overlap_collection and not loaded._overlap.in_flight
    loaded.set_env(model.get_env())
    loaded.learn(8, reset_num_timesteps=False)


def test_an_error_in_the_round_reaches_learn_and_the_model_stays_usable(monkeypatch: pytest.MonkeyPatch) -> None:
    model = overlapped_model()
    learner = model.policy

    def failing_round(*args, **kwargs):
        raise FloatingPointError("loss went NaN")

    monkeypatch.setattr(model, "_update_round", failing_round)
    with pytest.raises(FloatingPointError, match="loss went NaN"):
        model.learn(40)
    assert model.policy is learner and not model._overlap.in_flight
    monkeypatch.undo()
    model.learn(16)
    assert model._n_updates > 0


def test_an_interrupt_during_collection_finishes_the_round_and_keeps_every_transition() -> None:
    def interrupt(model: AMAGO, step: int) -> None:
        if step == 30:
            raise KeyboardInterrupt

    model = overlapped_model()
    learner = model.policy
    with pytest.raises(KeyboardInterrupt):
        model.learn(100, callback=Probe(interrupt))
    assert model.policy is learner and not model._overlap.in_flight
    assert model.replay_buffer.size() == 29, "steps 1-29 were stored, step 30 was interrupted before storage"
    assert model._n_updates == 5  # rounds after steps 12, 16, 20, 24, 28
    model.learn(16)


def test_overlap_with_distributed_is_refused() -> None:
    with pytest.raises(ValueError, match="overlap_collection=False or distributed=False"):
        tiny_model(CountingEnv(), overlap_collection=True, distributed=True)


@pytest.mark.parametrize("space", sorted(ACTION_SPACES))
def test_every_action_space_trains_beside_collection(space: str) -> None:
    env = DummyVecEnv([lambda: PrevRewardWrapper(CountingEnv(length=5, action_space=ACTION_SPACES[space]))] * 2)
    model = tiny_model(env, learning_starts=8, train_freq=2, gradient_steps=-1, overlap_collection=True)
    model.learn(40)
    # Rounds at 12, 16, ..., 40 env steps (past learning_starts), each of as many updates as env steps (-1): 8 x 4.
    assert model.replay_buffer.size() == 40 and model._n_updates == 32
    assert np.isfinite(model.logger.name_to_value["train/critic_loss"])
