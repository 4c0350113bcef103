"""sb3-amago: AMAGO as a Stable-Baselines3 algorithm."""

from sb3_amago.wrappers import PrevRewardWrapper

__version__ = "0.1.0"
__all__ = ["PrevRewardWrapper"]
