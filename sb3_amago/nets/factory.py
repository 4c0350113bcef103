"""Build a trajectory encoder from its name or its class."""

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


def traj_encoder_class(kind: str | type[TrajEncoder]) -> type[TrajEncoder]:
    """The encoder class named by ``kind`` (``"transformer"``, ``"gru"``, ``"ff"``), or ``kind`` itself
    if it is a :class:`~sb3_amago.nets.base.TrajEncoder` subclass (as SB3 takes ``features_extractor_class``)."""
    if isinstance(kind, type):
        if not issubclass(kind, TrajEncoder):
            raise ValueError(
                f"traj_encoder={kind.__name__} is not a sb3_amago.nets.TrajEncoder subclass: subclass TrajEncoder "
                f"(forward, init_state, reset_state, step) or pass one of the names {sorted(TRAJ_ENCODERS)}."
            )
        return kind
    if kind not in TRAJ_ENCODERS:
        raise ValueError(
            f"Unknown trajectory encoder '{kind}', expected one of {sorted(TRAJ_ENCODERS)} or a TrajEncoder subclass"
        )
    return TRAJ_ENCODERS[kind]


def make_traj_encoder(kind: str | type[TrajEncoder], d_in: int, max_seq_len: int, **kwargs: Any) -> TrajEncoder:
    """Build a trajectory encoder.

    :param kind: a name (``"transformer"``, ``"gru"``, ``"ff"``) or a ``TrajEncoder`` subclass
    :param d_in: size of each timestep embedding
    :param max_seq_len: training window length
    :param kwargs: passed to the encoder's constructor
    """
    return traj_encoder_class(kind)(d_in, max_seq_len, **kwargs)
