"""AMAGO as an SB3 off-policy algorithm: collection with a per-env context, training on windows of
whole rollouts with one loss (see :mod:`sb3_amago.loss`), and SB3's learn / predict / save / load."""

import contextlib
import dataclasses
import functools
import inspect
import pathlib
import time
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, ConvertCallback, ProgressBarCallback
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.noise import ActionNoise
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.save_util import save_to_pkl
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, RolloutReturn, Schedule, TrainFreq
from stable_baselines3.common.utils import configure_logger
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from sb3_amago.arguments import (
    DEFAULT_N_CRITICS,
    check_arguments,
    check_episode_train_freq,
    check_observation_space,
    check_sb3_arguments,
    chosen_exploration,
    critics_from_policy_kwargs,
    n_step_setting,
    warn_short_replay,
    warn_unused_schedule,
    warn_without_reward_input,
)
from sb3_amago.buffers import TrajectoryReplayBuffer
from sb3_amago.checkpoint import check_model_file, read_replay, run_state, set_run_state, write_atomically
from sb3_amago.clipped_step import clipped_step
from sb3_amago.compiled_update import compile_update
from sb3_amago.cpu_memory import keep_freed_memory
from sb3_amago.datasets import dataset_rollouts, write_minari_dataset
from sb3_amago.distributed import DataParallel, SingleProcess
from sb3_amago.exploration import Exploration, epsilon_schedule
from sb3_amago.interrupt import sigterm_raises_interrupt
from sb3_amago.loss import LOSS_DEFAULTS, LossConfig, update_forward
from sb3_amago.nets import TransformerTrajEncoder, cpu_kernels
from sb3_amago.overlap import OverlappedRound, frozen_statistics
from sb3_amago.policies import AmagoState, TransformerPolicy
from sb3_amago.precision import warn_if_bf16_is_emulated
from sb3_amago.relabel import visible_space
from sb3_amago.wrappers import FlatDictObservation, VecFlatDictObservation, is_structured

if TYPE_CHECKING:  # pragma: no cover
    from minari import MinariDataset

SelfAMAGO = TypeVar("SelfAMAGO", bound="AMAGO")
T = TypeVar("T")


class UpdatesProgressBar(ProgressBarCallback):
    """SB3's progress bar counting the updates of :meth:`AMAGO.learn_offline` (one per callback step)."""

    def _on_training_start(self) -> None:
        from tqdm import TqdmExperimentalWarning
        from tqdm.rich import tqdm

        with warnings.catch_warnings():  # as SB3's progress bar: rich's tqdm is marked experimental
            warnings.simplefilter("ignore", TqdmExperimentalWarning)
            self.pbar = tqdm(total=self.locals["gradient_steps"])

    def _on_step(self) -> bool:
        self.pbar.update(1)
        return True


DEFAULT_MULTIGAMMAS = (0.1, 0.9, 0.95, 0.97, 0.99, 0.995)
#: Updates after which the TD targets are checked for nearly constant heads (see PopArt).
POPART_CHECK_UPDATES = 1_000


def waits_for_update(method: Callable[..., T]) -> Callable[..., T]:
    """An AMAGO method that finishes the update round in flight first (``overlap_collection``), so
    that it sees the latest weights and a replay holding every transition collected."""

    @functools.wraps(method)
    def wrapper(self: "AMAGO", *args: Any, **kwargs: Any) -> T:
        self._finish_overlapped_round()
        return method(self, *args, **kwargs)

    return wrapper


class AMAGO(OffPolicyAlgorithm):
    """AMAGO: off-policy actor-critic over one long-context sequence model (Grigsby et al., 2024).

    SB3's arguments keep their SB3 meaning; ``batch_size`` counts sequences (windows of
    ``max_seq_len + 1`` steps), ``gamma`` is the main discount (the head the agent acts with) and
    ``tau`` the EMA rate of the target actor/critic heads. ``policy_kwargs=dict(net_arch=...)``
    sets the hidden sizes of the actor and critic heads, as for SAC (see :class:`TransformerPolicy`).
    The README's table "SB3 arguments and what they mean for AMAGO" lists every argument SB3's
    off-policy algorithms share; the ones below differ from SB3 or are AMAGO's own.

    :param buffer_size: transitions the replay holds, split evenly between the envs (at least one
        per env, as in SB3). A replay that holds less than one window per env trains on the shorter
        windows it holds (with a warning)
    :param batch_size: windows per batch, drawn with replacement as SB3 draws transitions, so a
        batch may be larger than what the replay holds
    :param replay_buffer_class: a :class:`~sb3_amago.buffers.TrajectoryReplayBuffer` subclass (None:
        that class); SB3's transition replays, ``HerReplayBuffer`` included, are refused (hindsight
        relabeling is ``relabeler=``)
    :param replay_buffer_kwargs: passed to the replay, after AMAGO's ``max_seq_len`` (and relabeler)
    :param optimize_memory_usage: accepted, True or False: SB3's "store each observation once" is what
        AMAGO's replay always does. ``model.optimize_memory_usage`` stays False, since SB3 reads True as
        a request to cut the replay's last trajectory at a new ``learn``, a fix its memory-efficient
        replay needs and AMAGO's does not (it closes the interrupted rollouts itself)
    :param n_steps: SB3's n-step returns: the loss's ``n_step`` (n-step TD targets within each window), set by
        either name
    :param use_sde: gSDE, which AMAGO lacks: only False (``sde_sample_freq`` and ``use_sde_at_warmup``
        are then ignored, as in SB3); explore Box actions with the default schedule or ``action_noise``
    :param monitor_wrapper: SB3's: wrap an env AMAGO makes or vectorises in a ``Monitor``
    :param max_seq_len: training window and acting context length
    :param multigammas: extra discount factors learned beside ``gamma``
    :param n_critics: critics in the ensemble (``policy_kwargs=dict(n_critics=...)``, as SAC and TQC
        take it, sets it too)
    :param n_target_critics: the loss settings ``n_target_critics``, ``reward_multiplier``,
        ``critic_weight``, ``pg_weight``, ``bc_weight``, ``filter_kind``, ``filter_beta``,
        ``filter_clip``, ``n_step`` (n-step TD targets) and ``pure_bc`` (behaviour cloning alone): see :class:`~sb3_amago.loss.LossConfig`, which documents them and holds their
        defaults (the model keeps them as attributes, so ``load(..., reward_multiplier=...)`` changes them)
    :param max_grad_norm: gradient-norm clip
    :param warmup_steps: linear learning-rate warm-up (updates)
    :param epsilon_start: exploration at the start (epsilon-greedy / Gaussian noise std in [-1, 1] units)
    :param epsilon_end: exploration after ``exploration_steps`` env steps
    :param exploration_steps: env steps over which epsilon is annealed linearly
    :param rollout_exploration_horizon: if set, the "bi-level" schedule: epsilon also decays within
        each rollout, linearly to 5% of its value at this time index
    :param exploration: an :class:`~sb3_amago.exploration.Exploration` of your own, in place of the
        epsilon schedule that the four arguments above build
    :param action_noise: SB3's ``ActionNoise`` for Box actions, applied as TD3 applies it (added to the
        policy's action in [-1, 1] units, then clipped), in place of the epsilon schedule: it becomes
        ``exploration`` (an :class:`~sb3_amago.exploration.ActionNoiseExploration`), and SB3's own
        ``action_noise`` attribute stays None so that SB3's loop does not add or reset it a second time
    :param relabeler: a :class:`sb3_amago.relabel.Relabeler` (hindsight instruction relabeling)
    :param mixed_precision: bf16 autocast in training
    :param compile_model: ``torch.compile`` the update's forward (``sb3_amago.loss.update_forward``: the
        sequence model, the TD target, PopArt's move and the loss) as one graph
    :param overlap_collection: collection beside training: each update round of ``learn`` runs in a
        worker thread while the next round of env steps is collected with a copy of the policy one
        round older (see :mod:`sb3_amago.overlap`; runs are then not reproducible bit for bit).
        ``predict``, ``save`` and ``get_parameters`` wait for the round in flight
    :param distributed: data-parallel training over ``torch.distributed`` (launch with ``torchrun``;
        see :mod:`sb3_amago.distributed`): every rank collects into its own replay, gradients,
        PopArt and observation statistics are summed across ranks, only rank 0 logs, runs
        callbacks and saves
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "TransformerPolicy": TransformerPolicy,
        "MlpPolicy": TransformerPolicy,
        "CnnPolicy": TransformerPolicy,
        "MultiInputPolicy": TransformerPolicy,
    }
    policy: TransformerPolicy
    replay_buffer: TrajectoryReplayBuffer
    exploration: Exploration

    def __init__(
        self,
        policy: str | type[TransformerPolicy] = "TransformerPolicy",
        env: GymEnv | str | None = None,
        learning_rate: float | Schedule = 1e-4,
        buffer_size: int = 1_000_000,
        learning_starts: int = 1_000,
        batch_size: int = 24,
        tau: float = 0.003,
        gamma: float = 0.999,
        train_freq: int | tuple[int, str] = (4, "step"),
        gradient_steps: int = 1,
        replay_buffer_class: type[ReplayBuffer] | None = None,
        replay_buffer_kwargs: dict[str, Any] | None = None,
        optimize_memory_usage: bool = False,
        n_steps: int = 1,
        max_seq_len: int = 64,
        multigammas: tuple[float, ...] = DEFAULT_MULTIGAMMAS,
        n_critics: int = DEFAULT_N_CRITICS,
        n_target_critics: int = LOSS_DEFAULTS.n_target_critics,
        reward_multiplier: float = LOSS_DEFAULTS.reward_multiplier,
        critic_weight: float = LOSS_DEFAULTS.critic_weight,
        pg_weight: float = LOSS_DEFAULTS.pg_weight,
        bc_weight: float = LOSS_DEFAULTS.bc_weight,
        filter_kind: str = LOSS_DEFAULTS.filter_kind,
        filter_beta: float = LOSS_DEFAULTS.filter_beta,
        filter_clip: float = LOSS_DEFAULTS.filter_clip,
        n_step: int = LOSS_DEFAULTS.n_step,
        pure_bc: bool = LOSS_DEFAULTS.pure_bc,
        max_grad_norm: float = 1.0,
        warmup_steps: int = 500,
        epsilon_start: float = 1.0,
        epsilon_end: float = 0.05,
        exploration_steps: int = 1_000_000,
        rollout_exploration_horizon: int | None = None,
        exploration: Exploration | None = None,
        action_noise: ActionNoise | None = None,
        relabeler: Any = None,
        mixed_precision: bool = False,
        compile_model: bool = False,
        overlap_collection: bool = False,
        distributed: bool = False,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: th.device | str = "auto",
        monitor_wrapper: bool = True,
        use_sde: bool = False,
        sde_sample_freq: int = -1,
        use_sde_at_warmup: bool = False,
        _init_setup_model: bool = True,
    ) -> None:
        n_step = n_step_setting(n_steps, n_step)
        # Checked now, not at the first update; kept as attributes, read back by loss_config.
        loss_settings = dataclasses.asdict(LossConfig.from_settings(locals()))
        if env is None and _init_setup_model:
            raise ValueError("AMAGO needs an env (a gymnasium env, an env id or a VecEnv)")
        policy_kwargs, n_critics = critics_from_policy_kwargs(policy_kwargs, n_critics)
        check_arguments(env, batch_size, max_seq_len, n_critics, gamma, multigammas, tau)
        check_sb3_arguments(replay_buffer_class, use_sde, sde_sample_freq, use_sde_at_warmup)
        super().__init__(
            policy,
            env,  # type: ignore[arg-type]  # None only where SB3's load builds the model before setting its env
            learning_rate,
            buffer_size,
            learning_starts,
            batch_size,
            tau,
            gamma,
            train_freq,
            gradient_steps,
            action_noise=None,
            replay_buffer_class=replay_buffer_class or TrajectoryReplayBuffer,
            replay_buffer_kwargs=replay_buffer_kwargs,
            optimize_memory_usage=False,  # see the docstring: AMAGO's replay stores each observation once anyway
            n_steps=1,
            policy_kwargs=policy_kwargs,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            verbose=verbose,
            device=device,
            seed=seed,
            support_multi_env=True,
            monitor_wrapper=monitor_wrapper,
            sde_support=False,
            supported_action_spaces=(spaces.Discrete, spaces.MultiDiscrete, spaces.Box),
        )
        if self.env is not None:
            check_episode_train_freq(train_freq, self.n_envs)
            warn_short_replay(buffer_size, int(max_seq_len), self.n_envs)
        self.max_seq_len = int(max_seq_len)
        self.multigammas = tuple(float(g) for g in multigammas)
        self.n_critics = int(n_critics)
        self.__dict__.update(loss_settings)
        self.max_grad_norm = max_grad_norm
        self.warmup_steps = warmup_steps
        self.epsilon_start = epsilon_start
        self.epsilon_end = epsilon_end
        self.exploration_steps = exploration_steps
        self.rollout_exploration_horizon = rollout_exploration_horizon
        self.exploration = chosen_exploration(exploration, action_noise)  # type: ignore[assignment]  # None: built at setup
        self._exploration_from_args = self.exploration is None
        if not self._exploration_from_args:
            warn_unused_schedule(self.exploration, vars(self), inspect.signature(AMAGO.__init__))
        self.relabeler = relabeler
        self.mixed_precision = mixed_precision
        self.compile_model = compile_model
        self.overlap_collection = overlap_collection
        self.distributed = distributed
        self._overlap = OverlappedRound()
        self._overlapping = False  # True inside learn when overlap_collection is set
        self._dist = SingleProcess(self.device)
        self._collect_state: AmagoState | None = None
        self._warned_near_constant = False
        if _init_setup_model:
            self._setup_model()

    @staticmethod
    def _wrap_env(env: GymEnv, verbose: int = 0, monitor_wrapper: bool = True) -> VecEnv:
        """SB3's wrapping (Monitor, DummyVecEnv, VecTransposeImage), after turning a Tuple or nested
        Dict observation space, which SB3 cannot store, into one flat Dict
        (:class:`~sb3_amago.wrappers.FlatDictObservation`, or its VecEnv version for a VecEnv)."""
        if is_structured(env.observation_space):
            env = VecFlatDictObservation(env) if isinstance(env, VecEnv) else FlatDictObservation(env)
        return OffPolicyAlgorithm._wrap_env(env, verbose, monitor_wrapper)

    @property
    def loss_config(self) -> LossConfig:
        """The loss settings, read from the model's attributes (so ``load(..., reward_multiplier=...)``
        and RL Zoo's continued training change them like any other hyperparameter)."""
        return LossConfig.from_settings(vars(self))

    @property
    def gammas(self) -> tuple[float, ...]:
        """All discount factors, the main one last."""
        return (*self.multigammas, float(self.gamma))

    def _setup_model(self) -> None:
        check_observation_space(self.observation_space)
        if self.overlap_collection and self.distributed:
            raise ValueError(
                "overlap_collection runs each update in a worker thread, where its collectives would interleave "
                "with the collection's across ranks: set overlap_collection=False or distributed=False."
            )
        # With distributed: join the process group, take this rank's device, log on rank 0 only.
        self._dist = DataParallel(self.device) if self.distributed else SingleProcess(self.device)
        self.device = self._dist.device
        if not self._dist.is_main:
            self.set_logger(Logger(folder=None, output_formats=[]))
        self._setup_lr_schedule()
        self.set_random_seed(self.seed)
        if self.relabeler is not None:
            self.relabeler.check(self.observation_space)
        if self._exploration_from_args:  # built afresh, so that load(..., exploration_steps=...) changes it
            self.exploration = epsilon_schedule(
                self.epsilon_start, self.epsilon_end, self.exploration_steps, self.rollout_exploration_horizon
            )
        self.exploration.check(self.action_space)
        buffer_kwargs = {"max_seq_len": self.max_seq_len, **self.replay_buffer_kwargs}
        if self.relabeler is not None:
            buffer_kwargs["relabeler"] = self.relabeler
        assert self.replay_buffer_class is not None
        self.replay_buffer = self.replay_buffer_class(  # type: ignore[assignment]
            self.buffer_size,
            self.observation_space,
            self.action_space,
            device=self.device,
            n_envs=self.n_envs,
            optimize_memory_usage=self.optimize_memory_usage,
            **buffer_kwargs,
        )
        self.policy = self.policy_class(  # type: ignore[assignment]
            visible_space(self.observation_space, self.relabeler),
            self.action_space,
            self.lr_schedule,
            gammas=self.gammas,
            max_seq_len=self.max_seq_len,
            n_critics=self.n_critics,
            **self.policy_kwargs,
        ).to(self.device)
        if self.device.type == "cpu":
            if isinstance(self.policy.traj_encoder, TransformerTrajEncoder):
                cpu_kernels.load()  # before anything is compiled: a compiled update traces the kernels it finds
            keep_freed_memory()  # after the kernels load: they hold the freed-block cache
        # The update's forward, compiled or not, as one function: the sequence model, the TD target,
        # PopArt's move and the loss (one graph: each boundary between compiled functions cost about
        # 1% of a compiled update at L = 64 on a 2-core AMD EPYC). Random draws (the target's
        # critic picks, sampled actions) come from torch's generator as in eager code, so a seed
        # gives the eager update's draws (the options: ``sb3_amago.compiled_update``).
        if self.compile_model:
            self._update_forward = compile_update(update_forward, self.device)
        else:
            self._update_forward = update_forward
        self._convert_train_freq()
        self._dist.attach(self.policy)
        assert isinstance(self.train_freq, TrainFreq)
        self._dist.check_collection(
            self.train_freq, n_envs=self.n_envs, gradient_steps=self.gradient_steps, learning_starts=self.learning_starts
        )

    def set_random_seed(self, seed: int | None = None) -> None:
        """SB3's seeding; with ``distributed``, each rank uses its own seed (see
        :meth:`sb3_amago.distributed.DataParallel.rank_seed`)."""
        super().set_random_seed(self._dist.rank_seed(seed, self.n_envs))

    # ----------------------------------------------------------------------------------------
    # Collection
    # ----------------------------------------------------------------------------------------
    def learn(
        self: SelfAMAGO,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 4,
        tb_log_name: str = "AMAGO",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfAMAGO:
        """SB3's learn; runs log to TensorBoard as ``AMAGO_<n>`` by default, as SAC's do as ``SAC_<n>``.

        A ``KeyboardInterrupt``, or a SIGTERM (raised as :class:`~sb3_amago.interrupt.TrainingInterrupted`, a
        ``KeyboardInterrupt``, while the process has no SIGTERM handler of its own), stops training
        and propagates: files saved before it stay intact (saves are atomic), and the model in
        memory stays usable: ``predict``, ``save``, and ``learn`` again, which resets the envs
        and starts new rollouts (the replay closes the interrupted ones unfinished).
        """
        with sigterm_raises_interrupt():
            self._overlapping = self.overlap_collection
            try:
                super().learn(total_timesteps, callback, log_interval, tb_log_name, reset_num_timesteps, progress_bar)
                self._finish_overlapped_round()
            except BaseException as error:
                self._finish_overlapped_round(raise_error=False)  # the error already raised is the one to report
                if isinstance(error, KeyboardInterrupt):
                    # Forget the collection in progress (the interrupt may have come between an env step and its
                    # storage): the next learn resets the envs, and the replay's running rollouts end here.
                    self._last_obs = None
                    self._collect_state = None
                    if isinstance(self.replay_buffer, TrajectoryReplayBuffer):
                        self.replay_buffer.end_running_rollouts()
                raise
            finally:
                self._overlapping = False
        return self

    def _setup_learn(
        self,
        total_timesteps: int,
        callback: MaybeCallback = None,
        reset_num_timesteps: bool = True,
        tb_log_name: str = "run",
        progress_bar: bool = False,
    ) -> tuple[int, BaseCallback]:
        fresh_env = reset_num_timesteps or self._last_obs is None
        total, callback = super()._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar)
        if fresh_env or self._collect_state is None or self._collect_state.n_envs != self.n_envs:
            self._collect_state = self.policy.initial_state(self.n_envs)
            self.exploration.reset(self.n_envs)
        if self.verbose >= 1 and reset_num_timesteps:
            warn_without_reward_input(self.observation_space)
        return total, callback

    def epsilon(self) -> float | None:
        """The exploration level at the current env step (None for an exploration without one)."""
        return self.exploration.epsilon(self.num_timesteps)

    def _sample_action(self, learning_starts: int, action_noise: Any = None, n_envs: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Step every env's context with the new observation, then act: uniformly at random before
        ``learning_starts``, else from the main-gamma policy with exploration."""
        assert self._collect_state is not None and self._last_obs is not None
        policy = self.policy
        obs, _ = policy.env_obs_to_tensor(self._last_obs)
        with th.no_grad():
            actor_out, state = policy.observe(obs, self._collect_state)
            if self.num_timesteps < learning_starts:
                env_action = np.array([self.action_space.sample() for _ in range(n_envs)])
                buffer_action = th.as_tensor(policy.action_type.to_buffer(env_action), device=self.device)
            else:
                action = policy.select_action(actor_out, deterministic=False)
                buffer_action = self.exploration.explore(action, state.time_idx, self.num_timesteps, policy.action_type)
            self._collect_state = policy.commit_action(state, buffer_action)
        return policy.to_env_action(buffer_action), buffer_action.cpu().numpy()

    def _store_transition(
        self,
        replay_buffer: ReplayBuffer,
        buffer_action: np.ndarray,
        new_obs: np.ndarray | dict[str, np.ndarray],
        reward: np.ndarray,
        dones: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        held = self._overlap.held if self._overlap.in_flight else replay_buffer  # stored once the round ends
        super()._store_transition(held, buffer_action, new_obs, reward, dones, infos)  # type: ignore[arg-type]
        if np.any(dones):
            assert self._collect_state is not None
            self._collect_state = self.policy.reset_state(self._collect_state, dones)
            self.exploration.end_rollouts(dones)

    def _init_callback(self, callback: MaybeCallback, progress_bar: bool = False) -> BaseCallback:
        """SB3's callback setup; with ``distributed``, callbacks and the progress bar run on rank 0 only."""
        if not self._dist.is_main:
            callback, progress_bar = None, False
        return super()._init_callback(callback, progress_bar)

    def collect_rollouts(self, *args: Any, **kwargs: Any) -> RolloutReturn:
        """SB3's collection round; with ``distributed``, every rank then learns whether another
        rank's collection failed (and raises) or its callbacks asked to stop (and stops too)."""
        return self._dist.collection_round(functools.partial(super().collect_rollouts, *args, **kwargs))

    # ----------------------------------------------------------------------------------------
    # Training
    # ----------------------------------------------------------------------------------------
    def train(self, gradient_steps: int, batch_size: int = 24) -> None:
        """One round of ``gradient_steps`` updates. Inside ``learn`` with ``overlap_collection``, the
        round that ran beside the last collection is finished first and this one starts in a worker
        thread, with ``self.policy`` the acting copy until it ends (see :mod:`sb3_amago.overlap`)."""
        self._finish_overlapped_round()
        if self.mixed_precision:
            warn_if_bf16_is_emulated(self.device)
        self._update_learning_rate(self.policy.optimizer)
        lr = self.lr_schedule(self._current_progress_remaining)
        if self._overlapping:
            update_round = functools.partial(
                self._update_round, self.policy, gradient_steps, batch_size, lr, frozen_statistics(self._vec_normalize_env)
            )
            self.policy = self._overlap.start(self.policy, update_round)
        else:
            self._log_round(self._update_round(self.policy, gradient_steps, batch_size, lr, self._vec_normalize_env))

    def _update_round(
        self, policy: TransformerPolicy, gradient_steps: int, batch_size: int, lr: float, normalize_env: VecNormalize | None
    ) -> dict[str, th.Tensor]:
        """``gradient_steps`` updates of ``policy`` at learning rate ``lr`` (before warm-up), on
        batches normalised by ``normalize_env``; returns the mean of each loss statistic. Reads
        nothing that collection changes but the replay."""
        policy.set_training_mode(True)
        optimizer = policy.optimizer
        params = policy.online_parameters()
        autocast = (
            th.autocast(device_type=self.device.type, dtype=th.bfloat16) if self.mixed_precision else contextlib.nullcontext()
        )
        sums: dict[str, th.Tensor] = {}
        loss_config = self.loss_config
        for _ in range(gradient_steps):
            warmup = min(1.0, (self._n_updates + 1) / max(1, self.warmup_steps))
            for group in optimizer.param_groups:
                group["lr"] = lr * warmup
            batch = self.replay_buffer.sample(batch_size, env=normalize_env)
            with autocast:
                loss, stats, popart = self._update_forward(policy, batch, loss_config)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if popart is not None:  # PopArt's move, which the loss read, before the optimizer's step
                policy.popart.load(popart)
            self._dist.average_gradients(params, n_real=batch.real[:, 1:].sum())
            stats["grad_norm"] = clipped_step(optimizer, params, self.max_grad_norm)
            policy.update_targets(self.tau)
            self._n_updates += 1
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + value.detach().float()
        return {k: v / gradient_steps for k, v in sums.items()}

    def _finish_overlapped_round(self, raise_error: bool = True) -> None:
        """Wait for the update round in flight, if any: the learner becomes ``self.policy`` again,
        the transitions held meanwhile go into the replay, and the round's statistics are logged.

        :param raise_error: raise the error the round raised (else drop it: an error of the caller's is on its way)
        """
        if not self._overlap.in_flight:
            return
        assert self._overlap.learner is not None
        self.policy = self._overlap.learner
        try:
            stats = self._overlap.finish()
        except BaseException:
            if raise_error:
                raise
            return
        finally:
            self._overlap.held.store_into(self.replay_buffer)
        self._log_round(stats)

    def _log_round(self, stats: dict[str, th.Tensor]) -> None:
        self._log_train_stats(stats, self.policy.optimizer.param_groups[0]["lr"])
        self._warn_near_constant_targets()

    def _warn_near_constant_targets(self) -> None:
        """From ``POPART_CHECK_UPDATES`` updates on, until it has warned once: name the discount factors
        whose targets PopArt finds nearly constant (:meth:`~sb3_amago.nets.popart.PopArt.near_constant_heads`)."""
        popart = self.policy.popart
        if self._warned_near_constant or self._n_updates < POPART_CHECK_UPDATES or self.loss_config.pure_bc:
            return
        heads = popart.near_constant_heads()
        if not heads:
            return
        self._warned_near_constant = True
        w = popart.w.detach()
        details = ", ".join(
            f"gamma {self.gammas[i]:g} (mean {float(popart.mu[i]):.3g}, std {float(popart.sigma[i]):.2g}, w {float(w[i]):.0f})"
            for i in heads
        )
        warnings.warn(
            f"The TD targets of {details} are nearly constant, so PopArt scales their critic outputs far above "
            f"the other heads' (median w {float(w.abs().median()):.1f}): their errors, mostly noise, dominate the gradient of the "
            "critics' shared layers and the clipped gradient norm. A per-step reward that never changes "
            "(CartPole's +1) leaves a short horizon nothing to learn: remove these discount factors from multigammas.",
            stacklevel=2,
        )

    # ----------------------------------------------------------------------------------------
    # Learning from data
    # ----------------------------------------------------------------------------------------
    @waits_for_update
    def add_dataset(self, dataset: "MinariDataset | Iterable[Any]", protected: bool = False) -> None:
        """Store a dataset's episodes in the replay, each as a whole rollout (see :mod:`sb3_amago.datasets`).

        Everything is checked before anything is stored, and on error (a ValueError naming the
        episode, or both spaces) the replay is unchanged: the spaces (a Minari dataset's against
        the model's; observations may lack the ``prev_reward`` the model expects, which is then
        built from the rewards), each episode's array lengths (``T + 1`` observations, ``T`` of
        the rest), NaN and values outside the spaces, an end that is a termination or a time limit
        at the last step only, and the replay's room for the whole dataset.

        Episodes stored unprotected go into the rings, where newer data evicts them like collected
        data; the rollouts running there end (the next ``learn`` starts its envs afresh). Protected
        ones are never evicted (they take memory beside the rings, at most ``buffer_size`` rows in
        all); ``replay_buffer_kwargs=dict(protected_share=...)`` sets their share of each batch.

        :param dataset: a ``minari.MinariDataset`` (``minari.load_dataset(...)``), or an iterable of
            episodes: Minari's ``EpisodeData`` or mappings with ``observations``, ``actions`` (in the
            env's format), ``rewards``, ``terminations`` and ``truncations``
        :param protected: keep the episodes out of eviction (demonstrations kept for a whole run)
        """
        replay = self.replay_buffer
        if not isinstance(replay, TrajectoryReplayBuffer):
            raise ValueError(f"add_dataset stores rollouts in a TrajectoryReplayBuffer, not a {type(replay).__name__}")
        capacity = replay.buffer_size * replay.n_envs
        rollouts, names = dataset_rollouts(dataset, replay.observation_space, self.policy.action_type, capacity)
        replay.add_rollouts(rollouts, protected=protected, names=names)
        if not protected:  # the replay ended its running rollouts: the envs start afresh, as after an interrupt
            self._last_obs = None
            self._collect_state = None

    def save_dataset(self, dataset_id: str, **minari_kwargs: Any) -> "MinariDataset":
        """Write the replay's finished rollouts (the protected ones first; running rollouts and those
        that lost their beginning to eviction are left out) as the Minari dataset ``dataset_id``, in
        Minari's local datasets folder (``MINARI_DATASETS_PATH``). ``add_dataset`` reads it back as
        the same rollouts. ``minari_kwargs`` go to ``minari.create_dataset_from_buffers``
        (``author``, ``description``, ``env``, ...).

        :return: the new ``minari.MinariDataset``
        """
        rollouts = self.replay_buffer.rollouts()
        if not rollouts:
            raise ValueError("The replay holds no finished rollout to write: collect or add episodes first.")
        return write_minari_dataset(
            dataset_id, rollouts, self.replay_buffer.observation_space, self.policy.action_type, **minari_kwargs
        )

    def learn_offline(
        self: SelfAMAGO,
        gradient_steps: int,
        callback: MaybeCallback = None,
        log_interval: int = 100,
        tb_log_name: str = "AMAGO",
        progress_bar: bool = False,
    ) -> SelfAMAGO:
        """Train on what the replay holds, with no env steps: ``gradient_steps`` updates of
        ``batch_size`` windows, with SB3's logging, callbacks and progress bar.

        Each update is one callback step (an ``EvalCallback``'s ``eval_freq`` counts updates; it
        evaluates in its own env, and ``num_timesteps`` stays as it is); the logs are dumped every
        ``log_interval`` updates and at the end, at step ``n_updates``. The learning-rate schedule
        runs over the ``gradient_steps``. A later ``learn`` continues online from the same replay,
        optimizer and update count (offline-to-online: set ``learning_starts`` and the exploration
        for it). KeyboardInterrupt and SIGTERM stop it as they stop ``learn``.

        :raises ValueError: if the replay holds nothing to train on, or with ``distributed``
        """
        if self.distributed:
            raise ValueError("learn_offline runs in one process: build the model with distributed=False.")
        if self.replay_buffer.num_rollouts() == 0:
            raise ValueError("The replay holds nothing to train on: add_dataset(...) first.")
        if int(gradient_steps) < 1:
            raise ValueError(f"gradient_steps must be >= 1, got {gradient_steps}")
        self.start_time = time.time_ns()
        first_update = self._n_updates
        if not self._custom_logger:
            self._logger = configure_logger(self.verbose, self.tensorboard_log, tb_log_name, reset_num_timesteps=True)
        if isinstance(callback, list):
            callback = CallbackList(callback)
        if callback is not None and not isinstance(callback, BaseCallback):
            callback = ConvertCallback(callback)
        if progress_bar:  # SB3's bar counts env steps: this one counts updates
            callback = CallbackList([c for c in (callback, UpdatesProgressBar()) if c is not None])
        callback = self._init_callback(callback)
        callback.on_training_start(locals(), globals())
        with sigterm_raises_interrupt():
            for step in range(int(gradient_steps)):
                self._current_progress_remaining = 1.0 - step / int(gradient_steps)
                self.train(gradient_steps=1, batch_size=self.batch_size)
                callback.update_locals(locals())
                stop = not callback.on_step()
                done = stop or step + 1 == int(gradient_steps)
                if log_interval and ((step + 1) % log_interval == 0 or done):
                    self._dump_offline_logs(first_update)
                if stop:
                    break
        callback.on_training_end()
        return self

    def _dump_offline_logs(self, first_update: int) -> None:
        elapsed = max((time.time_ns() - self.start_time) / 1e9, 1e-9)
        self.logger.record("time/time_elapsed", int(elapsed), exclude="tensorboard")
        self.logger.record("time/updates_per_second", int((self._n_updates - first_update) / elapsed))
        self.logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")
        self.logger.dump(step=self._n_updates)

    def _log_train_stats(self, stats: dict[str, th.Tensor], lr: float) -> None:
        record = self.logger.record
        record("train/n_updates", self._n_updates, exclude="tensorboard")
        record("train/learning_rate", lr)
        popart = self.policy.popart
        for key, value in {**stats, "popart_mu": popart.mu, "popart_sigma": popart.sigma}.items():
            if value.ndim == 0:
                record(f"train/{key}", value.item())
            else:  # one value per discount factor
                for g, per_gamma in zip(self.gammas, value.tolist()):
                    record(f"train/{key}_gamma_{g:g}", per_gamma)
        record("replay/bytes", self.replay_buffer.nbytes())
        epsilon = self.epsilon()
        if epsilon is not None:
            record("rollout/exploration_epsilon", epsilon)

    # ----------------------------------------------------------------------------------------
    # Save / load
    # ----------------------------------------------------------------------------------------
    def _excluded_save_params(self) -> list[str]:
        # An exploration built from the model's arguments is built again at load, from the loaded arguments.
        rebuilt = ["exploration"] if self._exploration_from_args else []
        of_this_process = [
            "_collect_state",
            "_update_forward",
            "distributed",
            "_dist",
            "_overlap",
            "_overlapping",
        ]
        return [*super()._excluded_save_params(), *rebuilt, *of_this_process]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        """The policy and its optimizer (AdamW's moments), as SAC saves its optimizers."""
        return ["policy", "policy.optimizer"], []

    @waits_for_update
    def save(self, path: str | pathlib.Path | Any, exclude: Any = None, include: Any = None) -> None:
        """SB3's save, plus the optimizer state and the run state (:func:`sb3_amago.checkpoint.run_state`),
        so that :meth:`load` resumes the run exactly. Written to a temporary file first and moved
        into place, so an error while saving never leaves a half-written file over an earlier save.
        With ``distributed``, only rank 0 writes (every rank holds the same weights)."""
        if not self._dist.is_main:
            return
        self._run_state = run_state(self)
        try:
            write_atomically(path, ".zip", functools.partial(super().save, exclude=exclude, include=include))
        finally:
            del self._run_state

    @waits_for_update
    def save_replay_buffer(self, path: str | pathlib.Path | Any) -> None:
        """SB3's save_replay_buffer (a pickle, ``.pkl`` added to a path without suffix), written to a
        temporary file and moved into place: a save interrupted half-way (KeyboardInterrupt, full
        disk) never replaces an earlier good file."""
        write_atomically(path, ".pkl", functools.partial(save_to_pkl, obj=self.replay_buffer, verbose=self.verbose))

    @waits_for_update
    def load_replay_buffer(self, path: str | pathlib.Path | Any, truncate_last_traj: bool = True) -> None:
        """SB3's load_replay_buffer, checked before it replaces the model's replay: a file that is
        truncated or not a replay, from another sb3-amago replay format, or for other spaces or
        another number of envs raises a ValueError and the model keeps its replay.

        :param path: a file from :meth:`save_replay_buffer`
        :param truncate_last_traj: SB3's argument for HER buffers; unused (a resumed run continues
            the stored rollouts, a fresh env closes them, see the README's "Resuming a run")
        """
        buffer = read_replay(path, self.observation_space, self.action_space, self.n_envs, self.verbose)
        buffer.device = self.device
        buffer.max_seq_len = self.max_seq_len  # windows are cut when sampled: the model's length applies
        self.replay_buffer = buffer

    @waits_for_update
    def predict(
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """SB3's predict (see :meth:`~sb3_amago.policies.TransformerPolicy.predict` for the context it carries)."""
        return super().predict(observation, state, episode_start, deterministic)

    @waits_for_update
    def get_parameters(self) -> dict[str, dict]:
        """SB3's get_parameters."""
        return super().get_parameters()

    @waits_for_update
    def set_parameters(
        self, load_path_or_dict: str | dict[str, th.Tensor], exact_match: bool = True, device: th.device | str = "auto"
    ) -> None:
        """SB3's set_parameters."""
        super().set_parameters(load_path_or_dict, exact_match, device)

    @classmethod
    def load(
        cls: type[SelfAMAGO],
        path: str | pathlib.Path | Any,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> SelfAMAGO:
        """SB3's load, with clear errors for files that are not AMAGO models, and the run state put back."""
        check_model_file(path, custom_objects)
        model = super().load(
            path,
            env=env,
            device=device,
            custom_objects=custom_objects,
            print_system_info=print_system_info,
            force_reset=force_reset,
            **kwargs,
        )
        saved = model.__dict__.pop("_run_state", None)
        if saved is not None:
            set_run_state(model, saved)  # after SB3's load, which reseeds the RNGs while building the model
        if model._dist.per_rank_rng:
            model.set_random_seed(model.seed)  # the file's RNG states are rank 0's: each rank takes its own again
        return model
