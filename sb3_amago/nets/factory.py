"""Build a trajectory encoder by name."""

from typing import Any

from sb3_amago.nets.base import TrajEncoder
from sb3_amago.nets.ff import FFTrajEncoder
from sb3_amago.nets.gru import GRUTrajEncoder
from sb3_amago.nets.transformer import TransformerTrajEncoder

TRAJ_ENCODERS: dict[str, type[TrajEncoder]] = {
    "transformer": TransformerTrajEncoder,
    "gru": GRUTrajEncoder,
    "ff": FFTrajEncoder,
}


def make_traj_encoder(name: str, d_in: int, max_seq_len: int, **kwargs: Any) -> TrajEncoder:
    """Build the trajectory encoder called ``name`` (``"transformer"``, ``"gru"`` or ``"ff"``).

    :param name: encoder name
    :param d_in: size of each timestep embedding
    :param max_seq_len: training window length
    :param kwargs: passed to the encoder's constructor
    """
    if name not in TRAJ_ENCODERS:
        raise ValueError(f"Unknown trajectory encoder '{name}', expected one of {sorted(TRAJ_ENCODERS)}")
    return TRAJ_ENCODERS[name](d_in, max_seq_len, **kwargs)
