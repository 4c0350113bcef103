"""Observation spaces a user brings, taken as they are: each builds a model, is collected into the
replay, trains, and is acted on by predict (raw observations of the user's env); non-finite values
are refused with the part named; images of every size get a CNN that fits them, or a clear error."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.torch_layers import NatureCNN
from test_amago import TINY

from sb3_amago import AMAGO
from sb3_amago.distributions import make_action_type
from sb3_amago.nets.obs_extractors import NATURE_CNN_MIN_SIZE, SmallImageCNN
from sb3_amago.wrappers import flat_dict_obs, flat_dict_space


class SpaceEnv(gym.Env):
    """Observations drawn from ``observation_space`` (its own RNG); episodes of 5 steps; reward 1 for
    action 1. ``nan_at`` puts NaN into every float part of the observation returned at that step."""

    def __init__(self, observation_space: spaces.Space, nan_at: int | None = None) -> None:
        self.observation_space = observation_space
        self.action_space = spaces.Discrete(2)
        self.nan_at = nan_at
        self.t = 0

    def _obs(self):
        obs = self.observation_space.sample()
        return poison(obs) if self.t == self.nan_at else obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(None if seed is None else seed + 1)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action), self.t >= 5, False, {}


def poison(obs):
    """``obs`` with NaN in every float array inside it (tuples and dicts followed)."""
    if isinstance(obs, dict):
        return {k: poison(v) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(poison(v) for v in obs)
    if isinstance(obs, np.ndarray) and np.issubdtype(obs.dtype, np.floating):
        return np.full_like(obs, np.nan)
    return obs


def has_float_part(space: spaces.Space) -> bool:
    return any(
        isinstance(s, spaces.Box) and np.issubdtype(s.dtype, np.floating) for s in flat_dict_space(space).spaces.values()
    )


SPACES = {
    "tuple": spaces.Tuple((spaces.Box(-1, 1, (3,)), spaces.Discrete(4), spaces.MultiBinary(2))),
    "nested_dict": spaces.Dict(
        {
            "a": spaces.Box(-1, 1, (2,)),
            "b": spaces.Dict(
                {"c": spaces.Discrete(3), "d": spaces.Tuple((spaces.Box(-1, 1, (1,)), spaces.MultiDiscrete([2, 3])))}
            ),
        }
    ),
    "multibinary": spaces.MultiBinary(5),
    "multibinary_2d": spaces.MultiBinary([2, 3]),
    "box_rank1": spaces.Box(-1, 1, (4,)),
    "box_rank2": spaces.Box(-1, 1, (3, 4)),
    "box_rank3_float": spaces.Box(-1, 1, (2, 3, 4)),
    "box_rank3_uint8_not_image": spaces.Box(0, 10, (2, 3, 4), dtype=np.uint8),
    "int_box": spaces.Box(0, 1000, (3,), dtype=np.int64),
    "discrete_start": spaces.Discrete(4, start=-2),
    "multidiscrete_start": spaces.MultiDiscrete([3, 4], start=[5, -1]),
}


def tiny_model(env, **kwargs) -> AMAGO:
    params = {"max_seq_len": 4, "learning_starts": 10, "batch_size": 4, "seed": 0, "policy_kwargs": TINY}
    params.update(kwargs)
    return AMAGO("TransformerPolicy", env, **params)


@pytest.mark.parametrize("name", list(SPACES))
def test_space_builds_collects_trains_and_predicts(name: str) -> None:
    space = SPACES[name]
    env = SpaceEnv(space)
    model = tiny_model(env)
    model.learn(20)
    assert model._n_updates > 0
    assert model.replay_buffer.size() > 0
    for param in model.policy.parameters():
        assert th.isfinite(param).all()
    raw_env = SpaceEnv(space)
    obs, _ = raw_env.reset(seed=1)
    action, state = model.predict(obs)
    assert raw_env.action_space.contains(action)
    obs, *_ = raw_env.step(action)
    action, _ = model.predict(obs, state=state)
    assert raw_env.action_space.contains(action)


def test_tuple_vec_env_and_save_load(tmp_path) -> None:
    """A VecEnv of Tuple observations (terminal observations included) and a reload with the raw env."""
    space = SPACES["tuple"]
    vec_env = make_vec_env(lambda: SpaceEnv(space), n_envs=2, seed=0)
    model = tiny_model(vec_env)
    model.learn(24)
    assert model._n_updates > 0
    obs = vec_env.reset()
    assert isinstance(obs, tuple)
    actions, _ = model.predict(obs)
    assert actions.shape == (2,)
    model.save(tmp_path / "model")
    loaded = AMAGO.load(tmp_path / "model", env=SpaceEnv(space))
    single, _ = SpaceEnv(space).reset(seed=0)
    np.testing.assert_array_equal(model.predict(single, deterministic=True)[0], loaded.predict(single, deterministic=True)[0])
    loaded.learn(8)


def test_integer_box_is_normalised_like_a_float_box() -> None:
    model = tiny_model(SpaceEnv(SPACES["int_box"]))
    model.learn(20)
    (norm,) = model.policy.timestep_encoder.obs_norms.values()
    assert float(norm.mean.mean()) > 100.0  # values drawn from [0, 1000]


def test_flat_names_and_values() -> None:
    space = SPACES["nested_dict"]
    flat = flat_dict_space(space)
    assert list(flat.spaces) == ["a", "b/c", "b/d_0", "b/d_1"]
    obs = space.sample()
    by_space, by_structure = flat_dict_obs(obs, space), flat_dict_obs(obs)
    assert by_space.keys() == by_structure.keys() == flat.spaces.keys()
    np.testing.assert_array_equal(by_space["b/d_1"], obs["b"]["d"][1])
    assert list(flat_dict_space(SPACES["tuple"]).spaces) == ["observation_0", "observation_1", "observation_2"]


def test_discrete_start_offsets_reach_the_same_one_hot_codes() -> None:
    """Discrete(4, start=-2) value v is embedded exactly as Discrete(4) value v + 2."""
    shifted = tiny_model(SpaceEnv(SPACES["discrete_start"]))
    plain = tiny_model(SpaceEnv(spaces.Discrete(4)))
    plain.policy.load_state_dict(shifted.policy.state_dict())
    for value in range(-2, 2):
        expected, _ = plain.policy.predict(np.array(value + 2), deterministic=True)
        got, _ = shifted.policy.predict(np.array(value), deterministic=True)
        assert got == expected
    with th.no_grad():
        a = shifted.policy.observe(th.tensor([[-2], [1]], device=shifted.device), shifted.policy.initial_state(2))[0]
        b = plain.policy.observe(th.tensor([[0], [3]], device=plain.device), plain.policy.initial_state(2))[0]
    assert all(th.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", [name for name, space in SPACES.items() if has_float_part(space)])
def test_non_finite_values_are_refused_with_the_part_named(name: str) -> None:
    space = SPACES[name]
    model = tiny_model(SpaceEnv(space))
    obs = poison(space.sample())
    part = "observation"
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        part = next(key for key, s in flat_dict_space(space).spaces.items() if isinstance(s, spaces.Box))
    with pytest.raises(ValueError, match=f"'{part}'.*NaN or infinite"):
        model.predict(obs)
    with pytest.raises(ValueError, match="NaN or infinite"):
        tiny_model(SpaceEnv(space, nan_at=3)).learn(8)


# --------------------------------------------------------------------------------------------
# Images of any size
# --------------------------------------------------------------------------------------------
IMAGE_SHAPES = {
    "3x3x3": (3, 3, 3),
    "5x5x3": (5, 5, 3),
    "7x7x3": (7, 7, 3),
    "odd_5x9x3": (5, 9, 3),
    "channel_first_3x5x9": (3, 5, 9),
    "35x35x1_largest_small": (35, 35, 1),
    "36x36x3_smallest_nature": (36, 36, 3),
    "64x64x3": (64, 64, 3),
    "84x84x1": (84, 84, 1),
}


def image_space(shape: tuple[int, ...]) -> spaces.Box:
    return spaces.Box(0, 255, shape, dtype=np.uint8)


def _image_cnn(model: AMAGO) -> th.nn.Module:
    (encoder,) = model.policy.timestep_encoder.features_extractor.encoders.values()
    return encoder.cnn


@pytest.mark.parametrize("name", list(IMAGE_SHAPES))
def test_images_of_any_size_build_train_and_predict(name: str) -> None:
    shape = IMAGE_SHAPES[name]
    model = tiny_model(
        SpaceEnv(image_space(shape)), policy_kwargs={**TINY, "features_extractor_kwargs": {"cnn_features_dim": 16}}
    )
    expected = NatureCNN if min(sorted(shape)[1:]) >= NATURE_CNN_MIN_SIZE else SmallImageCNN
    assert isinstance(_image_cnn(model), expected)
    model.learn(14)
    assert model._n_updates > 0
    obs, _ = SpaceEnv(image_space(shape)).reset(seed=0)
    action, _ = model.predict(obs)
    assert action in (0, 1)


@pytest.mark.parametrize("cnn", ["impala", "small"])
def test_small_odd_image_with_each_cnn_and_beside_other_keys(cnn: str) -> None:
    space = spaces.Dict({"image": image_space((5, 9, 3)), "vector": spaces.Box(-1, 1, (2,))})
    kwargs = {"cnn": cnn, "cnn_features_dim": 16}
    model = tiny_model(SpaceEnv(space), policy_kwargs={**TINY, "features_extractor_kwargs": kwargs})
    model.learn(14)
    assert model._n_updates > 0
    obs, _ = SpaceEnv(space).reset(seed=0)
    assert model.predict(obs)[0] in (0, 1)


def test_image_too_small_for_the_chosen_cnn_fails_at_construction_with_the_fix() -> None:
    env = SpaceEnv(image_space((7, 7, 3)))
    with pytest.raises(ValueError, match=r"at least 36x36.*got 7x7.*cnn='auto'"):
        tiny_model(env, policy_kwargs={**TINY, "features_extractor_kwargs": {"cnn": "nature"}})
    with pytest.raises(
        ValueError, match=r"NatureCNN cannot take the image observations.*36x36.*features_extractor_class unset"
    ):
        tiny_model(env, policy_kwargs={**TINY, "features_extractor_class": NatureCNN})
    with pytest.raises(ValueError, match="Unknown cnn"):
        tiny_model(env, policy_kwargs={**TINY, "features_extractor_kwargs": {"cnn": "resnet"}})


# --------------------------------------------------------------------------------------------
# Action spaces: one ActionType each
# --------------------------------------------------------------------------------------------
ACTION_TYPE_SPACES = {
    "discrete": spaces.Discrete(5),
    "multidiscrete": spaces.MultiDiscrete([2, 3, 4]),
    "box": spaces.Box(np.array([-2.0, 0.0], dtype=np.float32), np.array([2.0, 10.0], dtype=np.float32)),
    "box_float64": spaces.Box(-1.0, 3.0, shape=(2, 2), dtype=np.float64),
}


@pytest.mark.parametrize("name", list(ACTION_TYPE_SPACES))
def test_action_type_round_trips_env_actions_and_samples_in_the_buffer_form(name: str) -> None:
    """Env actions -> buffer form -> env actions gives them back (in the space's dtype); sampled and
    explored actions are buffer actions of the space; the encoding and log-prob have the documented widths."""
    space = ACTION_TYPE_SPACES[name]
    space.seed(0)
    action_type = make_action_type(space)
    env_actions = np.array([space.sample() for _ in range(6)])
    buffer = action_type.to_buffer(env_actions)
    assert buffer.shape == (6, action_type.action_dim) and buffer.dtype == np.float32
    back = action_type.to_env(buffer)
    assert back.dtype == np.asarray(space.sample()).dtype
    np.testing.assert_allclose(back, env_actions, rtol=1e-5, atol=1e-5)
    th.manual_seed(0)
    raw = th.randn(6, 3, action_type.actor_output_dim)  # (N, G, raw outputs)
    actor_out = action_type.actor_output(raw)
    main = action_type.select_gamma(actor_out, -1)
    for deterministic in (True, False):
        sampled = action_type.sample(main, deterministic)
        explored = action_type.explore(sampled, th.full((6, 1), 1.0))
        for actions in (sampled, explored):
            assert actions.shape == (6, action_type.action_dim)
            assert all(space.contains(a) for a in action_type.to_env(actions.numpy()))
    assert action_type.encode(th.as_tensor(buffer)).shape == (6, action_type.encoded_dim)
    log_prob = action_type.log_prob(actor_out, th.as_tensor(buffer))  # (N, G): every gamma scores each action
    assert log_prob.shape == (6, 3) and bool(th.isfinite(log_prob).all())
    assert action_type.entropy(actor_out).shape == (6, 3)


@pytest.mark.parametrize("nvec", [[4], [3, 5, 2]])
def test_categorical_actor_output_is_the_clamped_softmax_of_each_sub_action(nvec: list[int]) -> None:
    """Probabilities ``(..., G, sum(nvec))``: per sub-action the softmax of its logits (computed over a
    transposed layout for speed), clamped to [0.001, 0.99] and renormalised."""
    space = spaces.Discrete(nvec[0]) if len(nvec) == 1 else spaces.MultiDiscrete(nvec)
    action_type = make_action_type(space)
    th.manual_seed(0)
    raw = 3 * th.randn(2, 5, 19, sum(nvec))  # (B, L, G, A)
    probs = action_type.actor_output(raw).probs
    assert probs.shape == raw.shape and probs.is_contiguous()
    for part_probs, part_raw in zip(probs.split(nvec, -1), raw.split(nvec, -1), strict=True):
        expected = th.softmax(part_raw, -1).clamp(0.001, 0.99)
        th.testing.assert_close(part_probs, expected / expected.sum(-1, keepdim=True))


@pytest.mark.parametrize("nvec", [[4], [3, 5, 2]])
def test_categorical_log_prob_is_the_log_softmax_and_keeps_its_gradient_below_the_clamp(nvec: list[int]) -> None:
    """The log-likelihood of a buffer action is the sum over sub-actions of the log-softmax of the
    logits, not the log of the clamped probabilities: an action the policy holds at 1e-13, far below
    the clamp, still gets the log-softmax's gradient ``1 - p`` on its logit (the clamp would give 0)."""
    space = spaces.Discrete(nvec[0]) if len(nvec) == 1 else spaces.MultiDiscrete(nvec)
    action_type = make_action_type(space)
    th.manual_seed(0)
    raw = 3 * th.randn(2, 5, 19, sum(nvec))  # (B, L, G, A)
    raw[..., 0] = -30.0  # the first choice of the first sub-action: probability ~1e-13
    raw.requires_grad_(True)
    buffer = th.stack([th.randint(n, (2, 5)) for n in nvec], dim=-1).float()  # (B, L, d)
    buffer[..., 0] = 0.0
    log_prob = action_type.log_prob(action_type.actor_output(raw), buffer)  # (B, L, G)
    parts = raw.split(nvec, -1)
    expected = sum(
        th.log_softmax(part, -1).gather(-1, buffer[..., i].long()[..., None, None].expand(2, 5, 19, 1)).squeeze(-1)
        for i, part in enumerate(parts)
    )
    th.testing.assert_close(log_prob, expected)
    assert bool((log_prob < math.log(0.001)).all()), "below what the clamped probabilities could express"
    log_prob.sum().backward()
    assert raw.grad is not None
    th.testing.assert_close(raw.grad[..., 0], th.ones(2, 5, 19), atol=1e-6, rtol=0)


def test_action_type_factory_names_unsupported_spaces() -> None:
    with pytest.raises(ValueError, match="Discrete, MultiDiscrete and Box"):
        make_action_type(spaces.MultiBinary(3))
