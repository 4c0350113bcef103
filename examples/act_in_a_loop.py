"""Acting by hand with a trained AMAGO: the per-env context travels in `state`, and
`episode_start` tells the model where a new rollout begins (as with RecurrentPPO).

    python examples/act_in_a_loop.py
"""

import numpy as np
from stable_baselines3.common.env_util import make_vec_env

import sb3_amago  # noqa: F401  (registers the amago-* env ids)
from sb3_amago import AMAGO


def main() -> None:
    env = make_vec_env("amago-TMaze-v0", n_envs=4, seed=0, env_kwargs={"corridor_length": 10})
    model = AMAGO("TransformerPolicy", env, max_seq_len=16, learning_starts=200, train_freq=1, exploration_steps=1_000, seed=0)
    model.learn(total_timesteps=3_000)

    obs = env.reset()
    state = None  # fresh context for every env
    episode_start = np.ones(env.num_envs, dtype=bool)
    returns, finished = np.zeros(env.num_envs), []
    while len(finished) < 20:
        action, state = model.predict(obs, state=state, episode_start=episode_start, deterministic=True)
        obs, reward, done, _ = env.step(action)
        returns += reward
        episode_start = done  # the context of these envs is cleared on the next call
        finished += list(returns[done])
        returns[done] = 0.0
    print(f"mean return over {len(finished)} episodes: {np.mean(finished):.3f}")


if __name__ == "__main__":
    main()
