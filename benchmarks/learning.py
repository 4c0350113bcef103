"""Learning benchmark: AMAGO against sb3-contrib's RecurrentPPO and a memoryless SB3 baseline
(DQN for discrete actions, SAC for continuous ones), same env-step budget and seeds for all; and
AMAGO against variants of itself (its GRU and feed-forward trajectory encoders; no relabeling).

    python benchmarks/learning.py --quick              # 2 tasks x 3 algos x 2 seeds x 10,000 steps: learning_quick.*
    python benchmarks/learning.py                      # every task, 3 seeds (about 12 hours of one core): learning.*
    python benchmarks/learning.py --tasks CountRecallEasy --algos amago --seeds 1 2
    python benchmarks/learning.py --tasks TMaze100 --algos amago ppo_lstm --seeds 0 1 2 3 4 --budget 200000
    python benchmarks/learning.py --report-only        # table, json and plots from the CSV as it stands
    python benchmarks/learning.py --tasks PositionOnlyPendulumEasy --algos amago --seeds 0 --checkpoint-dir ckpt

Each process runs its runs one after the other (``--threads`` torch threads, 1 by default). Several
processes may fill one CSV side by side with disjoint ``--tasks`` / ``--algos`` / ``--seeds``: each
drops only the unfinished rows of its own runs when it starts. ``--quick`` (RepeatFirstEasy and
RepeatPreviousEasy) takes about 15 minutes on one core of a 2-core AMD EPYC machine. AMAGO's
training dominates the full run: on one thread there, with the d_model-128 Transformer and one
update per 8 env steps, ~17 s per 1,000 env steps with windows of 52 steps (RepeatFirst), so about
15 minutes per POPGym run of 50,000 env steps at windows of 52, more for the 104- and 201-step
windows of Autoencode and the PositionOnly tasks.

Tasks, budgets (env steps per run; ``--budget`` sets one budget for every task) and algorithms:

========================  ======================================  =======  ============================  ==========================
task                      env id (kwargs)                         budget   score                         algorithms
========================  ======================================  =======  ============================  ==========================
RepeatPreviousEasy        amago-popgym-RepeatPreviousEasy-v0      50,000   POPGym-normalised return      the three, GRU, feed-forward
RepeatFirstEasy           amago-popgym-RepeatFirstEasy-v0         50,000   POPGym-normalised return      the three
CountRecallEasy           amago-popgym-CountRecallEasy-v0         50,000   POPGym-normalised return      the three
AutoencodeEasy            amago-popgym-AutoencodeEasy-v0          50,000   POPGym-normalised return      the three
HigherLowerEasy           amago-popgym-HigherLowerEasy-v0         50,000   POPGym-normalised return      the three
PositionOnlyCartPoleEasy  amago-popgym-PositionOnlyCartPoleEasy   50,000   POPGym-normalised return      the three
PositionOnlyPendulumEasy  amago-popgym-PositionOnlyPendulumEasy   50,000   POPGym-normalised return      the three (SAC: Box actions)
TMaze100                  amago-TMaze100-v0 (passive, H = 100)    100,000  success rate                  the three, GRU, feed-forward
DarkKeyToDoor5            amago-DarkKeyToDoor-v0 (5 x 5 room,     100,000  mean trial return / 2         the three
                          trials <= 20 steps, 100-step rollouts)
MazeRunner7               amago-MazeRunner7-v0                    50,000   success rate                  AMAGO relabeling "some"
                                                                                                         and "none"
========================  ======================================  =======  ============================  ==========================

Meta-RL: each evaluation also records the mean return of each of the first ``trials`` trials of a
rollout (``trial_returns``, ``;``-separated); the report shows them at the final evaluation, so
adaptation in context reads as a return that rises from the first trial to the last.

Hyperparameters: AMAGO takes the entry of the env id in ``sb3_amago/hyperparams/amago.yml`` (the
package's RL Zoo file). The peers take RL Zoo's published entries, read from the ``hyperparams``
folder of the installed rl_zoo3, for the zoo env most like each task (the zoo has one for every task,
so POPGym's own PPO settings, ``popgym/baselines/ppo.py``, are not needed):

=================================================  ===================================  ========================
tasks                                              RecurrentPPO (``ppo_lstm.yml``)      memoryless
=================================================  ===================================  ========================
RepeatPrevious, RepeatFirst, CountRecall,          ``CartPoleNoVel-v1`` (tuned; the     DQN, ``dqn.yml``
Autoencode, HigherLower, PositionOnlyCartPole,     zoo's discrete memory task)          ``CartPole-v1`` (tuned)
T-maze, dark key-to-door
PositionOnlyPendulum                               ``PendulumNoVel-v1`` (tuned)         SAC, ``sac.yml``
                                                                                        ``Pendulum-v1``
=================================================  ===================================  ========================

Each entry's ``n_timesteps`` gives way to the budget. Where the budget is below it, an exploration
schedule written in the entry keeps its share of training (``exploration_steps`` is scaled by
``budget / n_timesteps``; an ``exploration`` object, as in the T-maze entries, is taken as
written, its anneal already within the budget); ``buffer_size`` never exceeds the budget (a larger
replay would stay partly empty). ``learning_starts`` is kept: it sizes the first replay, not the run. Where a task
says so (``Task.amago_kwargs``), AMAGO's entry takes the d_model-128 Transformer of the POPGym
entries (T-maze, key-to-door, MazeRunner: the CPU scale), the window of a shortened rollout, and a
``learning_starts`` of one rollout per env; the report's JSON lists every setting as run. The zoo's own preprocessing turns ``lin_<x>`` values into linear schedules and
evaluates ``policy_kwargs`` strings; ``normalize: True`` wraps the training envs in ``VecNormalize``
(with the entry's gamma, as the zoo does) and the evaluation envs in a copy of its statistics that
leaves rewards raw.

Observations: AMAGO takes the ids' Dict observation (the env's observation and ``prev_reward``) and
tracks its previous action itself. The peers see the same Dict flattened by gymnasium's
``FlattenObservation`` (Discrete and MultiDiscrete parts become one-hots), the flat vector their
``MlpPolicy`` / ``MlpLstmPolicy`` take. Actions: every task but PositionOnlyPendulum (``Box(1)``) has
Discrete actions; none has MultiDiscrete ones (CountRecall's MultiDiscrete space is its observation),
so each peer runs on every task unchanged.

Known handicap of the published settings: ``CartPoleNoVel-v1``'s ``n_steps: 32`` cuts RecurrentPPO's
backpropagation through time at 32 steps, shorter than RepeatFirst's or the T-maze's memory span.

Evaluation: at step 0, every ``budget / evals`` env steps and at the end, ``--eval-episodes``
deterministic episodes (SB3's ``evaluate_policy``) on separate evaluation envs. A run stops at the
first env step count at or past the budget that its algorithm reaches (SB3 collects whole rollouts,
``train_freq`` steps or ``n_steps * n_envs`` at a time, so DQN and RecurrentPPO may go up to one
rollout past it); the CSV records the steps actually taken. Recorded per
evaluation: env steps, wall-clock seconds of training (since ``learn`` began, evaluations excluded),
mean and std of the return, and the score (POPGym: ``popgym_normalized_score`` of the mean return;
T-maze: the share of episodes with ``info["is_success"]``).

Results (``--out-dir``, default ``benchmarks/results``; ``<prefix>`` is ``learning`` or
``learning_quick``): ``<prefix>_curves.csv`` gets each evaluation's row as it happens, the last row of
a run marked ``final``. On a restart, rows of runs without a final row are dropped and those runs
start again; finished ``(task, algo, seed, budget)`` runs are skipped. With ``--checkpoint-dir DIR``
each run is saved there at every evaluation and a restart continues it from its last save instead
(its rows up to that evaluation kept; see ``RunCheckpoint``): the way to run a cell longer than one
sitting (a checkpoint lives on the machine that wrote it), e.g. AMAGO on PositionOnlyPendulumEasy
(Box critics over 201-step windows, once per gamma: about 1.1 s per update on one core, some two
hours for the run). The report (``<prefix>.md``,
``<prefix>.json``, ``<prefix>_<task>.png``) is written at the end and by ``--report-only`` from the
finished runs: final score mean +- std over seeds (population std), and the env steps and training
seconds at which the mean over seeds first reaches 0.9, with the number of seeds whose own curve does.
"""

import argparse
import copy
import json
import pickle
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import cloudpickle
import curves
import gymnasium as gym
import numpy as np
import rl_zoo3
import torch as th
from common import RESULTS_DIR, git_commit, run_metadata
from curves import EVAL_SEED_OFFSET, Curve, CurveStore, EvalRecorder, markdown_table, mean_curve, plot_curves, run_curve
from gymnasium.wrappers import FlattenObservation
from sb3_contrib import RecurrentPPO
from stable_baselines3 import DQN, SAC
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.vec_env import VecEnv, VecNormalize, sync_envs_normalization

from sb3_amago import AMAGO
from sb3_amago.envs.popgym_envs import popgym_normalized_score
from sb3_amago.relabel import HindsightInstructionRelabeler
from sb3_amago.zoo import HYPERPARAMS_FILE, read_zoo_entry

#: Score a run must reach to count as solving its task.
THRESHOLD = 0.9
#: The compared algorithms on every task: AMAGO, RecurrentPPO, and DQN or SAC by action space.
ALGOS = ("amago", "ppo_lstm", "memoryless")
#: AMAGO with one change to its zoo entry, for the ablation rows: name -> (label, changed arguments;
#: ``policy_kwargs`` changes are merged into the entry's).
AMAGO_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "amago": ("AMAGO", {}),
    "amago_gru": ("AMAGO (GRU encoder)", {"policy_kwargs": {"traj_encoder": "gru", "traj_encoder_kwargs": {}}}),
    "amago_ff": ("AMAGO (feed-forward encoder)", {"policy_kwargs": {"traj_encoder": "ff", "traj_encoder_kwargs": {}}}),
    "amago_no_relabel": ("AMAGO (no relabeling)", {"relabeler": HindsightInstructionRelabeler(strategy="none")}),
    "amago_bf16": ("AMAGO (bf16 autocast)", {"mixed_precision": True}),
    "amago_bf16_compiled": ("AMAGO (bf16 autocast, compiled update)", {"mixed_precision": True, "compile_model": True}),
}
#: Variants that every task runs when ``--algos`` names them, and none runs by default.
ON_REQUEST = ("amago_bf16", "amago_bf16_compiled")
#: Every algorithm name a task can list.
ALGO_CHOICES = (*ALGOS, *(name for name in AMAGO_VARIANTS if name not in ALGOS))
#: The memory-model ablation: the compared algorithms and AMAGO with GRU and feed-forward encoders.
WITH_ENCODER_ABLATION = (*ALGOS, "amago_gru", "amago_ff")
ZOO_HYPERPARAMS = Path(rl_zoo3.__file__).resolve().parent / "hyperparams"
#: Schedules counted in env steps, scaled by budget / n_timesteps when the budget is smaller.
BUDGET_SCALED_KEYS = ("exploration_steps",)
#: Evaluation envs run side by side (at most one per episode).
EVAL_ENVS = 8
#: CSV columns and their types.
FIELDS: dict[str, type] = {
    "task": str,
    "algo": str,
    "seed": int,
    "budget": int,
    "env_steps": int,
    "wall_s": float,
    "mean_return": float,
    "std_return": float,
    "score": float,
    "trial_returns": str,
    "final": int,
    "commit": str,
}
#: Columns added after the first results: their value in rows written before them.
FIELD_DEFAULTS = {"trial_returns": "", "commit": ""}

Row = dict[str, Any]


#: How a task's evaluation episodes become its score (each between 0 and 1).
SCORE_NAMES = {
    "popgym": "POPGym-normalised return",
    "success": "success rate",
    "trials": "mean trial return / best trial return",
    "return": "mean return",
}


@dataclass(frozen=True)
class Task:
    """One benchmark task: an env id, its budget, how its score is computed and who runs on it.

    :param score_kind: a key of :data:`SCORE_NAMES`
    :param algos: the algorithms (keys of :data:`ALGO_LABELS`) run on the task
    :param trials: meta-RL tasks: trials per rollout reported one by one (every rollout has at least this many)
    :param best_trial_return: meta-RL tasks: a trial's highest return (the score's scale)
    :param env_kwargs: keyword arguments of the env id (every algorithm gets the same env)
    :param amago_kwargs: changes to AMAGO's zoo entry that the task's size needs (``policy_kwargs``
        merged into the entry's): a smaller model, or the window of a shortened rollout
    """

    name: str
    env_id: str
    budget: int
    score_kind: str
    continuous: bool = False
    algos: tuple[str, ...] = ALGOS
    trials: int = 0
    best_trial_return: float = 1.0
    env_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)
    amago_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)

    @property
    def score_name(self) -> str:
        """What the score is, for tables and axis labels."""
        return SCORE_NAMES[self.score_kind]

    def score(self, returns: Sequence[float], successes: Sequence[bool], trial_returns: np.ndarray) -> float:
        """The score of a set of evaluation episodes (``trial_returns``: ``(episodes, trials)``)."""
        if self.score_kind == "success":
            return float(np.mean(successes))
        if self.score_kind == "trials":
            return float(trial_returns.mean() / self.best_trial_return)
        if self.score_kind == "return":
            return float(np.mean(returns))
        return popgym_normalized_score(self.name, float(np.mean(returns)))


#: The Transformer of the POPGym entries (d_model 128), for the tasks whose entries use the default 256.
SMALL_TRANSFORMER = {"d_model": 128, "n_heads": 8, "d_ff": 512, "n_layers": 3}
#: Dark key-to-door at a CPU scale: a 5 x 5 room, trials of at most 20 steps, 100-step rollouts (at
#: least 5 trials; the registered env is 9 x 9 with 500-step rollouts).
KEY_DOOR_KWARGS = {"size": 5, "trial_length": 20, "rollout_length": 100}


def _popgym(name: str, continuous: bool = False, algos: tuple[str, ...] = ALGOS) -> Task:
    return Task(name, f"amago-popgym-{name}-v0", 50_000, "popgym", continuous, algos)


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        _popgym("RepeatPreviousEasy", algos=WITH_ENCODER_ABLATION),
        _popgym("RepeatFirstEasy"),
        _popgym("CountRecallEasy"),
        _popgym("AutoencodeEasy"),
        _popgym("HigherLowerEasy"),
        _popgym("PositionOnlyCartPoleEasy"),
        _popgym("PositionOnlyPendulumEasy", continuous=True),
        Task(
            "TMaze100",
            "amago-TMaze100-v0",
            100_000,
            "success",
            algos=WITH_ENCODER_ABLATION,
            amago_kwargs={"policy_kwargs": {"traj_encoder_kwargs": SMALL_TRANSFORMER}},
        ),
        Task(
            "DarkKeyToDoor5",
            "amago-DarkKeyToDoor-v0",
            100_000,
            "trials",
            trials=5,
            best_trial_return=2.0,
            env_kwargs=KEY_DOOR_KWARGS,
            amago_kwargs={
                "learning_starts": 24 * KEY_DOOR_KWARGS["rollout_length"],
                "max_seq_len": KEY_DOOR_KWARGS["rollout_length"],
                "rollout_exploration_horizon": KEY_DOOR_KWARGS["rollout_length"],
                "policy_kwargs": {"traj_encoder_kwargs": SMALL_TRANSFORMER},
            },
        ),
        Task(
            "MazeRunner7",
            "amago-MazeRunner7-v0",
            50_000,
            "success",
            algos=("amago", "amago_no_relabel"),
            amago_kwargs={"learning_starts": 4_800, "policy_kwargs": {"traj_encoder_kwargs": SMALL_TRANSFORMER}},
        ),
    )
}
#: (peer, continuous actions) -> (class, RL Zoo hyperparameter file, entry).
PEERS: dict[tuple[str, bool], tuple[type[BaseAlgorithm], str, str]] = {
    ("ppo_lstm", False): (RecurrentPPO, "ppo_lstm.yml", "CartPoleNoVel-v1"),
    ("ppo_lstm", True): (RecurrentPPO, "ppo_lstm.yml", "PendulumNoVel-v1"),
    ("memoryless", False): (DQN, "dqn.yml", "CartPole-v1"),
    ("memoryless", True): (SAC, "sac.yml", "Pendulum-v1"),
}

#: What ``--quick`` runs unless ``--tasks``, ``--seeds``, ``--budget``... say otherwise.
QUICK = {"tasks": ("RepeatFirstEasy", "RepeatPreviousEasy"), "seeds": 2, "budget": 10_000, "eval_episodes": 16, "evals": 5}
#: The full run's defaults (budgets per task in :data:`TASKS`).
FULL = {"tasks": tuple(TASKS), "seeds": 3, "eval_episodes": 32, "evals": 20}


def algo_label(algo: str, task: Task) -> str:
    """The algorithm's class name on this task (the memoryless peer is DQN or SAC)."""
    if algo in AMAGO_VARIANTS:
        return AMAGO_VARIANTS[algo][0]
    return PEERS[(algo, task.continuous)][0].__name__


# ----------------------------------------------------------------------------------------------
# Hyperparameters
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSettings:
    """How one algorithm is built for one task and budget."""

    algo_class: type[BaseAlgorithm]
    source: str
    n_envs: int
    normalize: bool
    flatten: bool
    kwargs: dict[str, Any]
    env_wrapper: Callable[[gym.Env], gym.Env] | None = None


def runs_algo(task: Task, algo: str) -> bool:
    """Whether ``task`` runs ``algo`` when it is asked for: its own algorithms, and the :data:`ON_REQUEST` variants."""
    return algo in task.algos or algo in ON_REQUEST


def run_settings(task: Task, algo: str, budget: int, amago_file: Path = HYPERPARAMS_FILE) -> RunSettings:
    """The zoo entry of ``algo`` for ``task``, adapted to ``budget`` (see the module docstring);
    AMAGO's entries come from ``amago_file``."""
    if algo in AMAGO_VARIANTS:
        algo_class, path, name, flatten = AMAGO, amago_file, task.env_id, False
    else:
        algo_class, file_name, name = PEERS[(algo, task.continuous)]
        path, flatten = ZOO_HYPERPARAMS / file_name, True
    entry = read_zoo_entry(name, path)
    hyperparams = dict(entry.kwargs)
    if algo in AMAGO_VARIANTS:
        for changes in copy.deepcopy((task.amago_kwargs, AMAGO_VARIANTS[algo][1])):
            for key, value in changes.items():
                hyperparams[key] = {**hyperparams.get(key, {}), **value} if key == "policy_kwargs" else value
    scale = min(1.0, budget / float(entry.n_timesteps))
    for key in BUDGET_SCALED_KEYS:
        if key in hyperparams:
            hyperparams[key] = int(hyperparams[key] * scale)
    if "buffer_size" in hyperparams:
        hyperparams["buffer_size"] = min(int(hyperparams["buffer_size"]), budget)
    return RunSettings(
        algo_class, f"{path.name}: {name}", entry.n_envs, entry.normalize, flatten, hyperparams, entry.env_wrapper
    )


def make_envs(task: Task, settings: RunSettings, n_envs: int, seed: int, training: bool) -> VecEnv:
    """``n_envs`` seeded envs of the task, wrapped (the entry's ``env_wrapper``), flattened and
    normalised as ``settings`` say."""
    wrappers = [w for w in (settings.env_wrapper, FlattenObservation if settings.flatten else None) if w is not None]

    def wrap(env: gym.Env) -> gym.Env:
        for wrapper in wrappers:
            env = wrapper(env)
        return env

    venv = make_vec_env(task.env_id, n_envs=n_envs, seed=seed, wrapper_class=wrap, env_kwargs=task.env_kwargs)
    if settings.normalize:
        gamma = float(settings.kwargs.get("gamma", 0.99))
        venv = VecNormalize(venv, gamma=gamma, training=training, norm_reward=training)
    return venv


# ----------------------------------------------------------------------------------------------
# Training runs
# ----------------------------------------------------------------------------------------------
class RunKey(NamedTuple):
    """What identifies a run in the CSV."""

    task: str
    algo: str
    seed: int
    budget: int


def run_key(row: Row) -> RunKey:
    """The run a CSV row belongs to."""
    return RunKey(row["task"], row["algo"], row["seed"], row["budget"])


class Evaluation(NamedTuple):
    """What one evaluation of a model measured."""

    mean_return: float
    std_return: float
    score: float
    trial_returns: str


def evaluate_model(model: BaseAlgorithm, eval_env: VecEnv, task: Task, n_episodes: int) -> Evaluation:
    """``n_episodes`` deterministic episodes: return mean and std, the task's score and, for meta-RL
    tasks, the mean return of each of the first ``task.trials`` trials (``;``-separated)."""
    successes: list[bool] = []
    trial_returns: list[list[float]] = []

    def record_episode(locals_: dict[str, Any], _globals: dict[str, Any]) -> None:
        if locals_["done"]:
            info = locals_["info"]
            successes.append(bool(info.get("is_success", False)))
            if task.trials:
                trial_returns.append(list(info["trial_returns"][: task.trials]))

    returns, _ = evaluate_policy(
        model, eval_env, n_eval_episodes=n_episodes, deterministic=True, return_episode_rewards=True, callback=record_episode
    )
    per_trial = np.array(trial_returns, dtype=float).reshape(len(trial_returns), task.trials)  # (episodes, trials)
    trials_text = ";".join(f"{value:.4f}" for value in per_trial.mean(axis=0)) if task.trials else ""
    return Evaluation(float(np.mean(returns)), float(np.std(returns)), task.score(returns, successes, per_trial), trials_text)


def row_trial_returns(row: Row) -> list[float]:
    """The ``trial_returns`` column of a row as numbers, one per trial (empty on tasks without trials)."""
    return [float(value) for value in row["trial_returns"].split(";")] if row["trial_returns"] else []


class RunCheckpoint:
    """A run's state at its last evaluation, so that a run cut short continues from there in a later
    process (``--checkpoint-dir``): the model file, the replay (off-policy algorithms), the training
    envs pickled where they allow it, and ``meta.json`` (env steps and training seconds of the row it
    follows), written last, so a checkpoint without it is incomplete and ignored.

    A resumed run continues with the saved weights, optimizer, replay and RNG states; with the envs
    pickled it goes on from their saved state (the transition of the step being collected at the save
    is lost), else from fresh resets. Either way it is not the bit-identical run an uninterrupted
    process makes, and the CSV's rows after the checkpoint's are dropped and made again.
    """

    def __init__(self, root: Path, key: RunKey) -> None:
        self.dir = root / f"{key.task}-{key.algo}-seed{key.seed}-budget{key.budget}"

    def saved_at(self) -> tuple[int, float] | None:
        """``(env steps, wall_s)`` of a complete checkpoint, or None."""
        meta = self.dir / "meta.json"
        if not meta.exists():
            return None
        data = json.loads(meta.read_text())
        return int(data["env_steps"]), float(data["wall_s"])

    def save(self, model: BaseAlgorithm, env: VecEnv, env_steps: int, wall_s: float) -> None:
        (self.dir / "meta.json").unlink(missing_ok=True)  # incomplete until the new one is written
        model.save(self.dir / "model.zip")
        if isinstance(model, OffPolicyAlgorithm):
            model.save_replay_buffer(self.dir / "replay.pkl")
        try:
            (self.dir / "envs.pkl").write_bytes(cloudpickle.dumps(env))
        except (pickle.PicklingError, TypeError, AttributeError):  # envs that do not pickle restart from resets
            (self.dir / "envs.pkl").unlink(missing_ok=True)
        written = self.dir / "meta.json.tmp"
        written.write_text(json.dumps({"env_steps": env_steps, "wall_s": wall_s}))
        written.replace(self.dir / "meta.json")

    def load(self, settings: RunSettings, env: VecEnv, device: str) -> tuple[BaseAlgorithm, VecEnv]:
        """The saved model on the saved envs (or on ``env``, reset, where they were not saved)."""
        pickled = self.dir / "envs.pkl"
        if pickled.exists():
            env.close()
            env = pickle.loads(pickled.read_bytes())
        model = settings.algo_class.load(self.dir / "model.zip", env=env, device=device, force_reset=not pickled.exists())
        if isinstance(model, OffPolicyAlgorithm):
            model.load_replay_buffer(self.dir / "replay.pkl")
        return model, env

    def clear(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def train_run(key: RunKey, config: "Config") -> None:
    """Train one (task, algo, seed) under its budget, appending evaluation rows to the CSV; with
    ``config.checkpoint_dir``, save the run at each evaluation and continue a saved one."""
    task = TASKS[key.task]
    settings = run_settings(task, key.algo, key.budget)
    env = make_envs(task, settings, settings.n_envs, key.seed, training=True)
    eval_env = make_envs(task, settings, min(EVAL_ENVS, config.eval_episodes), key.seed + EVAL_SEED_OFFSET, training=False)
    checkpoint = RunCheckpoint(config.checkpoint_dir, key) if config.checkpoint_dir else None
    resumed_at = checkpoint.saved_at() if checkpoint else None
    if checkpoint and resumed_at:
        model, env = checkpoint.load(settings, env, config.device)
        print(f"    resumed at {resumed_at[0]:,} env steps from {checkpoint.dir}", flush=True)
    else:
        model = settings.algo_class(env=env, seed=key.seed, device=config.device, verbose=0, **settings.kwargs)

    def evaluate() -> dict[str, Any]:
        if settings.normalize:
            sync_envs_normalization(env, eval_env)
        return evaluate_model(model, eval_env, task, config.eval_episodes)._asdict()

    def on_row(row: Row) -> None:
        config.store.append(row)
        print(
            f"    {row['env_steps']:>10,} steps  score {row['score']:.3f}  return {row['mean_return']:.3f}  "
            f"train {row['wall_s']:,.0f} s",
            flush=True,
        )
        if checkpoint and not row["final"]:
            checkpoint.save(model, env, row["env_steps"], row["wall_s"])

    run_fields = {**key._asdict(), "commit": git_commit()}
    eval_freq = max(1, key.budget // config.evals)
    recorder = EvalRecorder(evaluate, eval_freq, key.budget, run_fields, on_row, resumed_at=resumed_at)
    remaining = key.budget - (resumed_at[0] if resumed_at else 0)
    model.learn(remaining, callback=recorder, reset_num_timesteps=resumed_at is None)
    env.close()
    eval_env.close()
    if checkpoint:
        checkpoint.clear()


# ----------------------------------------------------------------------------------------------
# CSV
# ----------------------------------------------------------------------------------------------
def curve_store(path: Path) -> CurveStore:
    """The CSV of evaluation rows at ``path`` (:data:`FIELDS`)."""
    return CurveStore(path, FIELDS, FIELD_DEFAULTS)


# ----------------------------------------------------------------------------------------------
# Configuration and the run loop
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """What to run and where results go."""

    tasks: tuple[Task, ...]
    algos: tuple[str, ...]
    seeds: tuple[int, ...]
    budgets: dict[str, int]
    eval_episodes: int
    evals: int
    threads: int
    device: str
    out_dir: Path
    prefix: str
    report_only: bool
    checkpoint_dir: Path | None = None

    @property
    def csv_path(self) -> Path:
        """Where evaluation rows are appended."""
        return self.out_dir / f"{self.prefix}_curves.csv"

    @property
    def store(self) -> CurveStore:
        """The CSV at :attr:`csv_path`."""
        return curve_store(self.csv_path)

    def run_keys(self) -> list[RunKey]:
        """Every run, task by task, algorithm by algorithm, seed by seed."""
        return [
            RunKey(task.name, algo, seed, self.budgets[task.name])
            for task in self.tasks
            for algo in self.algos
            if runs_algo(task, algo)
            for seed in self.seeds
        ]


def parse_config(argv: Sequence[str] | None = None) -> Config:
    """Command-line options -> :class:`Config` (``--quick`` changes the defaults, see :data:`QUICK`)."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=f"small run for a 2-core machine: {QUICK}")
    parser.add_argument(
        "--tasks", nargs="+", choices=list(TASKS), help=f"tasks (default: all; quick: {' '.join(QUICK['tasks'])})"
    )
    parser.add_argument(
        "--algos",
        nargs="+",
        choices=list(ALGO_CHOICES),
        default=[algo for algo in ALGO_CHOICES if algo not in ON_REQUEST],
        help=f"(default: every task's own; {', '.join(ON_REQUEST)} on request, on any task)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds (default 0 1 2; quick 0 1)")
    parser.add_argument("--budget", type=int, help="env steps per run for every task (default: per task; quick 12,000)")
    parser.add_argument("--eval-episodes", type=int, help="episodes per evaluation (default 32; quick 16)")
    parser.add_argument("--evals", type=int, help="evaluations per run besides the first and last (default 20; quick 6)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--device", default="cpu", help="torch device of every model (default cpu)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--report-only", action="store_true", help="write the report from the CSV, train nothing")
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        help="save each run at every evaluation under this folder and continue a run saved there (see RunCheckpoint)",
    )
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    tasks = tuple(TASKS[name] for name in (args.tasks or defaults["tasks"]))
    budget = args.budget or defaults.get("budget")
    return Config(
        tasks=tasks,
        algos=tuple(args.algos),
        seeds=tuple(args.seeds or range(defaults["seeds"])),
        budgets={task.name: budget or task.budget for task in tasks},
        eval_episodes=args.eval_episodes or defaults["eval_episodes"],
        evals=args.evals or defaults["evals"],
        threads=args.threads,
        device=args.device,
        out_dir=args.out_dir,
        prefix="learning_quick" if args.quick else "learning",
        report_only=args.report_only,
        checkpoint_dir=args.checkpoint_dir,
    )


def run_all(config: Config) -> None:
    """Train every run the CSV does not hold yet, one after the other."""
    keys = config.run_keys()
    saved = {key: RunCheckpoint(config.checkpoint_dir, key).saved_at() for key in keys} if config.checkpoint_dir else {}
    resumable = {key: at[0] for key, at in saved.items() if at is not None}
    finished = config.store.drop_unfinished(run_key, only=keys, resumable=resumable)
    todo = [key for key in keys if key not in finished]
    print(f"{len(keys) - len(todo)} of {len(keys)} runs already in {config.csv_path}; {len(todo)} to go", flush=True)
    for number, key in enumerate(todo, 1):
        label = algo_label(key.algo, TASKS[key.task])
        print(f"[{number}/{len(todo)}] {key.task} {label} seed {key.seed}: {key.budget:,} env steps", flush=True)
        train_run(key, config)


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Summary:
    """One (task, algorithm) over its finished seeds."""

    task: Task
    algo: str
    n_seeds: int
    final_mean: float
    final_std: float
    crossing: tuple[int, float] | None
    seeds_reaching: int
    curve: Curve
    #: Meta-RL tasks: mean over seeds of each trial's return at the final evaluation, ``(trials,)``.
    final_trials: np.ndarray | None = None

    @property
    def label(self) -> str:
        """The algorithm's class name (DQN or SAC for the memoryless peer)."""
        return algo_label(self.algo, self.task)


def summarize(rows: Sequence[Row], config: Config) -> list[Summary]:
    """Summaries of the finished runs of the configured tasks, algorithms, seeds and budgets."""
    wanted = set(config.run_keys())
    runs: dict[RunKey, list[Row]] = {}
    for row in rows:
        if run_key(row) in wanted:
            runs.setdefault(run_key(row), []).append(row)
    finished = {run_key(row) for row in rows if row["final"]}
    summaries = []
    for task in config.tasks:
        for algo in (algo for algo in config.algos if runs_algo(task, algo)):
            keys = [key for key in sorted(runs) if key in finished and (key.task, key.algo) == (task.name, algo)]
            if not keys:
                continue
            curves = [run_curve(runs[key]) for key in keys]
            finals = [curve.score[-1] for curve in curves]
            final_trials = None
            if task.trials:
                last_rows = [max(runs[key], key=lambda row: row["env_steps"]) for key in keys]
                final_trials = np.mean([row_trial_returns(row) for row in last_rows], axis=0)
            mean = mean_curve(curves)
            summaries.append(
                Summary(
                    task=task,
                    algo=algo,
                    n_seeds=len(curves),
                    final_mean=float(np.mean(finals)),
                    final_std=float(np.std(finals)),
                    crossing=mean.crossing(THRESHOLD),
                    seeds_reaching=sum(curve.crossing(THRESHOLD) is not None for curve in curves),
                    curve=mean,
                    final_trials=final_trials,
                )
            )
    return summaries


def trials_table(summaries: Sequence[Summary]) -> str:
    """Meta-RL tasks: one row per algorithm, the mean return of each trial of a rollout after training
    (adaptation in context shows as returns rising from the first trial to the last)."""
    with_trials = [s for s in summaries if s.final_trials is not None]
    if not with_trials:
        return ""
    n = max(len(s.final_trials) for s in with_trials)
    header = ("task", "algorithm", "seeds", *(f"trial {i + 1}" for i in range(n)), "last - first")
    rows = [
        (
            s.task.name,
            s.label,
            s.n_seeds,
            *(f"{value:.2f}" for value in s.final_trials),
            f"{s.final_trials[-1] - s.final_trials[0]:+.2f}",
        )
        for s in with_trials
        if s.final_trials is not None
    ]
    return markdown_table(header, rows)


def results_table(summaries: Sequence[Summary]) -> str:
    """One row per task and algorithm: final score, steps and seconds to :data:`THRESHOLD`."""
    header = (
        "task",
        "algorithm",
        "seeds",
        "final score (mean ± std)",
        f"env steps to {THRESHOLD}",
        f"training s to {THRESHOLD}",
        f"seeds reaching {THRESHOLD}",
    )
    rows = []
    for s in summaries:
        steps, wall = (f"{s.crossing[0]:,}", f"{s.crossing[1]:,.0f}") if s.crossing else ("not reached", "not reached")
        rows.append(
            (
                s.task.name,
                s.label,
                s.n_seeds,
                f"{s.final_mean:.3f} ± {s.final_std:.3f}",
                steps,
                wall,
                f"{s.seeds_reaching}/{s.n_seeds}",
            )
        )
    return markdown_table(header, rows)


def memory_model(algo: str, settings: RunSettings) -> str:
    """What carries memory in a run, for the report: AMAGO's trajectory encoder and its size, the
    LSTM of RecurrentPPO, or none."""
    policy_kwargs = settings.kwargs.get("policy_kwargs", {})
    if algo in AMAGO_VARIANTS:
        sizes = policy_kwargs.get("traj_encoder_kwargs")
        return f"{policy_kwargs.get('traj_encoder', 'transformer')} {sizes if sizes else '(package defaults)'}"
    if settings.algo_class is RecurrentPPO:
        return f"LSTM, {policy_kwargs.get('lstm_hidden_size', 256)} units"
    return "none (MLP)"


def hyperparameter_sources(config: Config) -> dict[str, dict[str, dict[str, Any]]]:
    """``{task: {algo: class, source entry, n_envs, VecNormalize, keyword arguments}}`` as run."""
    sources: dict[str, dict[str, dict[str, Any]]] = {}
    for task in config.tasks:
        for algo in (algo for algo in config.algos if runs_algo(task, algo)):
            settings = run_settings(task, algo, config.budgets[task.name])
            sources.setdefault(task.name, {})[algo] = {
                "class": settings.algo_class.__name__,
                "label": algo_label(algo, task),
                "memory": memory_model(algo, settings),
                "source": settings.source,
                "n_envs": settings.n_envs,
                "vec_normalize": settings.normalize,
                "flatten_observation": settings.flatten,
                "kwargs": {key: str(value) for key, value in settings.kwargs.items()},
            }
    return sources


def write_report(config: Config) -> list[Summary]:
    """``<prefix>.md`` (table), ``<prefix>.json`` (config, figures with units, metadata) and one PNG per task."""
    summaries = summarize(config.store.read(), config)
    meta = run_metadata()
    sources = hyperparameter_sources(config)
    figures: dict[str, dict[str, Any]] = {}
    for s in summaries:
        name = f"{s.task.name} {s.label}"
        figures[f"{name} final score"] = {
            "value": s.final_mean,
            "std": s.final_std,
            "n_seeds": s.n_seeds,
            "unit": s.task.score_name,
        }
        figures[f"{name} env steps to {THRESHOLD}"] = {
            "value": s.crossing[0] if s.crossing else None,
            "unit": "env steps (mean over seeds)",
        }
        figures[f"{name} training time to {THRESHOLD}"] = {
            "value": s.crossing[1] if s.crossing else None,
            "unit": f"s of training, evaluation excluded, {config.threads} torch thread(s)",
        }
        figures[f"{name} seeds reaching {THRESHOLD}"] = {"value": s.seeds_reaching, "unit": f"seeds of {s.n_seeds}"}
        if s.final_trials is not None:
            figures[f"{name} final return per trial"] = {"value": s.final_trials.tolist(), "unit": "return, trials 1 .. k"}
    run_config = {
        "tasks": {
            task.name: {"env_id": task.env_id, "env_kwargs": task.env_kwargs, "budget": config.budgets[task.name]}
            for task in config.tasks
        },
        "algos": list(config.algos),
        "seeds": list(config.seeds),
        "eval_episodes": config.eval_episodes,
        "evals_per_run": config.evals,
        "threshold": THRESHOLD,
        "device": config.device,
        "hyperparameters": sources,
    }
    source_rows = [
        (task, algo_sources[algo]["label"], algo_sources[algo]["memory"], algo_sources[algo]["source"])
        for task, algo_sources in sources.items()
        for algo in algo_sources
    ]
    per_trial = trials_table(summaries)
    lines = [
        f"# {config.prefix}",
        "",
        f"`{meta['command']}`; torch {meta['torch_version']}, {meta['threads']} threads, {meta['cpu_model']}, {meta['date']}.",
        "",
        (
            f"Score of {config.eval_episodes} deterministic episodes: "
            + "; ".join(
                f"{name} ({', '.join(task.name for task in config.tasks if task.score_name == name)})"
                for name in dict.fromkeys(task.score_name for task in config.tasks)
            )
            + f". Final score at the end of each run's budget; env steps and training seconds (evaluation excluded) "
            f"where the mean over seeds first reaches {THRESHOLD}. Only finished runs count; every run took one torch "
            f"thread with other runs sharing the machine's cores, so seconds are upper bounds."
        ),
        "",
        results_table(summaries),
        "",
        *(["Return per trial at the final evaluation (mean over seeds):", "", per_trial, ""] if per_trial else []),
        "Hyperparameters (adapted to the budget as `benchmarks/learning.py` describes):",
        "",
        markdown_table(("task", "algorithm", "memory model", "entry"), source_rows),
    ]
    curves.write_report(config.out_dir, config.prefix, {"config": run_config, "figures": figures, **meta}, lines)
    for task in config.tasks:
        task_summaries = [s for s in summaries if s.task == task]
        if task_summaries:
            plot_curves(
                config.out_dir / f"{config.prefix}_{task.name}.png",
                [(f"{s.label} (n = {s.n_seeds})", s.curve) for s in task_summaries],
                title=f"{task.name} ({task.env_id})",
                ylabel=task.score_name,
                threshold=THRESHOLD,
            )
    print(f"report: {config.out_dir / config.prefix}.md, .json and {len({s.task for s in summaries})} plots", flush=True)
    return summaries


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_config(argv)
    th.set_num_threads(config.threads)
    if not config.report_only:
        run_all(config)
    write_report(config)


if __name__ == "__main__":
    main()
