"""Networks: timestep encoders, trajectory encoders (sequence models) and their building blocks."""

from sb3_amago.nets.base import TrajEncoder
from sb3_amago.nets.factory import TRAJ_ENCODERS, make_traj_encoder, traj_encoder_class
from sb3_amago.nets.ff import FFState, FFTrajEncoder
from sb3_amago.nets.gru import GRUState, GRUTrajEncoder
from sb3_amago.nets.sigma_reparam import SigmaReparamLinear
from sb3_amago.nets.transformer import TransformerState, TransformerTrajEncoder

__all__ = [
    "TRAJ_ENCODERS",
    "FFState",
    "FFTrajEncoder",
    "GRUState",
    "GRUTrajEncoder",
    "SigmaReparamLinear",
    "TrajEncoder",
    "TransformerState",
    "TransformerTrajEncoder",
    "make_traj_encoder",
    "traj_encoder_class",
]
