"""Names of the observation keys shared by the envs, the wrappers, the replay and the networks.

A leaf module (it imports nothing from the package), so that the network layers can name the
keys without importing the env-side goal convention or the wrappers.
"""

#: The key of a non-Dict observation wherever observations are handled as a dict of parts (the
#: replay's storage, the timestep encoder, the features extractor), and the key under which
#: :class:`sb3_amago.wrappers.PrevRewardWrapper` puts such an observation.
OBS_KEY = "observation"
#: The reward received on arriving at the step, ``(1,)`` float32 (0 at the first step).
PREV_REWARD_KEY = "prev_reward"
#: Meta-RL: 1 at the first step of each new trial within a rollout.
TRIAL_RESET_KEY = "trial_reset"
#: Instruction-following envs: the goal tokens to reach, in order (see :mod:`sb3_amago.goals`).
INSTRUCTION_KEY = "instruction"
#: Instruction-following envs: the goal tokens achieved on arriving at the step (hidden from the policy).
ACHIEVED_KEY = "achieved"
