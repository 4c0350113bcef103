"""sb3-amago: AMAGO as a Stable-Baselines3 algorithm.

Importing the package registers its gymnasium env ids (``amago-*``).
"""

from sb3_amago import envs  # noqa: F401  (registers the amago-* env ids)
from sb3_amago.amago import AMAGO
from sb3_amago.interrupt import TrainingInterrupted
from sb3_amago.policies import AmagoState, TransformerPolicy
from sb3_amago.wrappers import PrevRewardWrapper

__version__ = "0.1.0"
__all__ = ["AMAGO", "AmagoState", "PrevRewardWrapper", "TrainingInterrupted", "TransformerPolicy"]
