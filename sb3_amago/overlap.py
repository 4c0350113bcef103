"""Collection beside training (``AMAGO(overlap_collection=True)``): an update round runs in a worker
thread while the main thread collects the next round of env steps.

The main thread acts with a copy of the policy holding the weights from before the round in flight,
so the data it collects is one round older than in sequential training (as an off-policy learner's
actors usually are). Its transitions are held back until the round ends and then stored in order,
so every round samples the replay exactly as it stood when the round started (and normalises
with ``VecNormalize``'s statistics as they stood then). The worker thread
runs torch operators, which release Python's global lock, while the main thread steps the envs and
acts; on a machine whose cores the update alone does not fill, the collection's time is hidden.

What differs from sequential training: the round's statistics are logged when it ends (one
collection round later); the update and the collection draw from the same global RNGs (numpy's,
torch's) in an order set by thread timing, so runs are not reproducible bit for bit.
"""

import copy
import threading
from collections.abc import Callable
from typing import Any

import torch as th
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.vec_env import VecNormalize

from sb3_amago.policies import TransformerPolicy


class HeldTransitions:
    """Stands in for the replay during a round: keeps each ``add`` call to replay later, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def add(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append((args, kwargs))

    def store_into(self, replay: ReplayBuffer) -> None:
        """Make every held ``add`` call on ``replay``, oldest first, and forget them."""
        calls, self.calls = self.calls, []
        for args, kwargs in calls:
            replay.add(*args, **kwargs)


def frozen_statistics(venv: VecNormalize | None) -> VecNormalize | None:
    """A shallow copy of ``venv`` with copies of its running statistics: a round normalises its
    batches with it as the original did when the round started, while the original keeps updating
    them as the envs step."""
    if venv is None:
        return None
    frozen = object.__new__(type(venv))
    frozen.__dict__.update(venv.__dict__)
    frozen.obs_rms, frozen.ret_rms = copy.deepcopy(venv.obs_rms), copy.deepcopy(venv.ret_rms)
    return frozen


def acting_copy(learner: TransformerPolicy) -> TransformerPolicy:
    """A copy of ``learner`` to act with (no gradients, eval mode) sharing its optimizer object,
    which the copy never steps."""
    optimizer = learner.optimizer
    learner.optimizer = None  # type: ignore[assignment]  # not copied: only the learner steps it
    try:
        acting = copy.deepcopy(learner)
    finally:
        learner.optimizer = optimizer
    acting.optimizer = optimizer
    acting.requires_grad_(False)
    acting.set_training_mode(False)
    return acting


class OverlappedRound:
    """At most one update round in a worker thread, the acting copy of the policy beside it, and
    the transitions collected meanwhile."""

    def __init__(self) -> None:
        self.learner: TransformerPolicy | None = None
        self.acting: TransformerPolicy | None = None
        self.held = HeldTransitions()
        self._thread: threading.Thread | None = None
        self._result: Any = None
        self._error: BaseException | None = None
        self._pairs: tuple[list[th.Tensor], list[th.Tensor]] = ([], [])

    @property
    def in_flight(self) -> bool:
        """Whether a round has started and not been finished."""
        return self._thread is not None

    def start(self, learner: TransformerPolicy, update_round: Callable[[], Any]) -> TransformerPolicy:
        """Bring the acting copy to ``learner``'s weights, run ``update_round`` (which trains
        ``learner``) in a worker thread, and return the acting copy."""
        if self.in_flight:
            raise RuntimeError("An update round is already in flight: finish() it first.")
        if self.learner is not learner or self.acting is None:
            self.learner, self.acting = learner, acting_copy(learner)
            acting_state, learner_state = self.acting.state_dict(keep_vars=True), learner.state_dict(keep_vars=True)
            self._pairs = ([acting_state[k] for k in learner_state], list(learner_state.values()))
        with th.no_grad():
            th._foreach_copy_(*self._pairs)
        self._result, self._error = None, None
        self._thread = threading.Thread(target=self._run, args=(update_round,), name="amago-update", daemon=True)
        self._thread.start()
        return self.acting

    def _run(self, update_round: Callable[[], Any]) -> None:
        try:
            self._result = update_round()
        except BaseException as error:  # noqa: BLE001  # raised in the main thread by finish()
            self._error = error

    def finish(self) -> Any:
        """Wait for the round in flight; return its result, or raise the error it raised."""
        assert self._thread is not None, "no update round in flight"
        self._thread.join()
        self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
        return self._result
