"""RL Zoo entry point for AMAGO: ``python -m sb3_amago.zoo train|enjoy [RL Zoo flags]``.

This module runs rl_zoo3's own ``train`` and ``enjoy`` scripts, so every zoo flag works
(``--eval-freq``, ``--save-freq``, ``-n``, ``--seed``, ``-params``, ``--vec-env subproc``,
``-optimize``, ...). Before handing over it:

* registers AMAGO with the zoo (:func:`register`): ``ALGOS["amago"]``, an Optuna sampler in
  ``HYPERPARAMS_SAMPLER`` (and its converter, for ``--trial-id``), and an experiment manager that
  reads this package's hyperparameter file unless ``--conf-file`` names another;
* makes ``--algo amago`` the default algorithm, and ``-f logs`` (where ``train`` writes) the
  default folder of ``enjoy``;
* plays envs that cannot render for a human without rendering (as if ``--no-render`` was given).

Importing this module imports :mod:`sb3_amago`, which registers the ``amago-*`` env ids; the zoo's
subprocess envs import it too, through the ids' entry points.

The hyperparameter file, ``sb3_amago/hyperparams/amago.yml`` (package data; the repository's
``rl_zoo_hyperparams/amago.yml`` is the same file), follows the zoo's format. String values of
``policy_kwargs``, ``replay_buffer_kwargs``, ``relabeler`` and ``exploration`` are Python
expressions, evaluated with the zoo's names plus the relabelers of :mod:`sb3_amago.relabel` and the
schedules of :mod:`sb3_amago.exploration` (which ``-params`` values may use as well). Keys AMAGO
does not take are reported by name before any env is made.
"""

import argparse
import difflib
import inspect
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import optuna
import yaml
from gymnasium.envs.registration import load_env_creator

import sb3_amago
from sb3_amago.amago import AMAGO
from sb3_amago.exploration import BiLevelSchedule, EpsilonSchedule, Exploration, QuietSpanSchedule
from sb3_amago.relabel import GoalEnvRelabeler, HindsightInstructionRelabeler, Relabeler

try:
    import rl_zoo3
    import rl_zoo3.enjoy
    import rl_zoo3.exp_manager
    import rl_zoo3.train
    import rl_zoo3.utils
    from rl_zoo3.exp_manager import ExperimentManager
    from rl_zoo3.hyperparams_opt import HYPERPARAMS_CONVERTER, HYPERPARAMS_SAMPLER
except ImportError as err:
    raise ImportError(f"sb3_amago.zoo needs RL Zoo ({err}): pip install 'sb3-amago[zoo]'") from err

#: The zoo's name of the algorithm (``--algo amago``).
ALGO = "amago"
#: The hyperparameter file the zoo reads for AMAGO unless ``--conf-file`` names another.
HYPERPARAMS_FILE = Path(__file__).resolve().parent / "hyperparams" / "amago.yml"
#: Hyperparameters whose string values are Python expressions.
EVALUATED_KEYS = ("policy_kwargs", "replay_buffer_kwargs", "relabeler", "exploration")
#: Names hyperparameter expressions may use besides the zoo's own (``dict``, ``nn``, ``th``, ...).
EXPRESSION_NAMES: dict[str, Any] = {
    "sb3_amago": sb3_amago,
    "HindsightInstructionRelabeler": HindsightInstructionRelabeler,
    "GoalEnvRelabeler": GoalEnvRelabeler,
    "EpsilonSchedule": EpsilonSchedule,
    "BiLevelSchedule": BiLevelSchedule,
    "QuietSpanSchedule": QuietSpanSchedule,
}
#: Expression keys whose value must be an object of a kind: key -> (base class, an example).
OBJECT_KEYS: dict[str, tuple[type, str]] = {
    "relabeler": (Relabeler, "HindsightInstructionRelabeler(strategy='some')"),
    "exploration": (Exploration, "QuietSpanSchedule(steps=100_000, quiet_end=100, quiet_level=0.005)"),
}
#: AMAGO arguments the zoo sets from its own flags, never from the hyperparameters.
ZOO_FLAG_KEYS = {
    "env": "--env",
    "tensorboard_log": "--tensorboard-log",
    "seed": "--seed",
    "verbose": "--verbose",
    "device": "--device",
}
#: Keys the zoo reads itself and removes before building the model.
ZOO_KEYS = (
    "n_timesteps",
    "n_envs",
    "env_wrapper",
    "vec_env_wrapper",
    "env_kwargs",
    "normalize",
    "frame_stack",
    "monitor_kwargs",
    "callback",
)
#: TransformerPolicy arguments AMAGO passes from its own hyperparameters.
POLICY_ARGS_FROM_AMAGO = ("observation_space", "action_space", "lr_schedule", "gammas", "max_seq_len", "n_critics")

USAGE = f"""usage: python -m sb3_amago.zoo {{train,enjoy}} [RL Zoo flags]

Train or play AMAGO with RL Zoo's own train and enjoy scripts (every zoo flag works).

commands:
  train   rl_zoo3's train, with --algo {ALGO} and the package's hyperparameters
          ({HYPERPARAMS_FILE}) unless --algo / --conf-file say otherwise
  enjoy   rl_zoo3's enjoy, with --algo {ALGO} and -f logs unless given

examples:
  python -m sb3_amago.zoo train --env amago-popgym-RepeatPreviousEasy-v0 --eval-freq 20000 --save-freq 100000
  python -m sb3_amago.zoo enjoy --env amago-popgym-RepeatPreviousEasy-v0 -f logs -n 500
  python -m sb3_amago.zoo train --env amago-TMaze-v0 -optimize --n-trials 20 -n 100000
  python -m sb3_amago.zoo train --help      (all of the zoo's flags)
"""


class ZooConfigError(ValueError):
    """A hyperparameter the zoo would hand to AMAGO is missing, unknown or cannot be evaluated."""


# ----------------------------------------------------------------------------------------------
# Hyperparameter checks
# ----------------------------------------------------------------------------------------------
def _accepted_arguments(function: Callable[..., Any]) -> set[str] | None:
    """Names ``function`` takes as keyword arguments, or None if it takes any (``**kwargs``)."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL}


def _unknown_key_error(key: str, owner: str, where: str, accepted: Iterable[str], extra: str = "") -> ZooConfigError:
    close = difflib.get_close_matches(key, list(accepted), n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return ZooConfigError(
        f"{owner} takes no argument '{key}' ({where}).{hint} It takes: {', '.join(sorted(accepted))}{extra}."
    )


def check_hyperparameters(hyperparams: Mapping[str, Any], where: Callable[[str], str]) -> None:
    """Raise a :class:`ZooConfigError` naming the first key AMAGO (or its policy) would reject.

    :param hyperparams: what the zoo passes to ``AMAGO(env=..., **hyperparams)``, after it has
        removed its own keys (``n_timesteps``, ``env_wrapper``, ...)
    :param where: a key -> a description of where it was set, for the messages
    """
    amago_args = _accepted_arguments(AMAGO.__init__)
    if amago_args is None:
        return
    amago_args -= {"self", "env", "_init_setup_model", *ZOO_FLAG_KEYS}
    for key in hyperparams:
        if key in ZOO_FLAG_KEYS:
            raise ZooConfigError(f"'{key}' ({where(key)}) is set by the zoo's {ZOO_FLAG_KEYS[key]} flag: remove the key.")
        if key not in amago_args:
            raise _unknown_key_error(key, "AMAGO", where(key), amago_args, f", and the zoo's own keys {', '.join(ZOO_KEYS)}")
    for key, (kind, example) in OBJECT_KEYS.items():
        value = hyperparams.get(key)
        if value is not None and not isinstance(value, kind):
            raise ZooConfigError(
                f'{key} ({where(key)}) must be an instance of {kind.__module__}.{kind.__name__}, e.g. "{example}", '
                f"got {value!r}."
            )
    policy_kwargs = hyperparams.get("policy_kwargs") or {}
    if not isinstance(policy_kwargs, Mapping):
        raise ZooConfigError(f"policy_kwargs ({where('policy_kwargs')}) must be a dict, got {policy_kwargs!r}.")
    policy = hyperparams.get("policy", "TransformerPolicy")
    policy_class = AMAGO.policy_aliases.get(policy) if isinstance(policy, str) else policy
    if not isinstance(policy_class, type):
        return  # AMAGO's own check reports an unknown policy name
    policy_args = _accepted_arguments(policy_class)
    if policy_args is None:
        return
    for key in policy_kwargs:
        if key in POLICY_ARGS_FROM_AMAGO:
            raise ZooConfigError(
                f"policy_kwargs key '{key}' ({where('policy_kwargs')}) comes from AMAGO's own hyperparameters: "
                "set it there (max_seq_len, n_critics, gamma / multigammas), not in policy_kwargs."
            )
        if key not in policy_args:
            accepted = policy_args - {"self", *POLICY_ARGS_FROM_AMAGO}
            raise _unknown_key_error(key, f"{policy_class.__name__} (policy_kwargs)", where("policy_kwargs"), accepted)


def evaluate_expression(key: str, text: str, where: str) -> Any:
    """Evaluate a hyperparameter string, with the names the zoo evaluates its own strings with
    (``dict``, ``nn``, ``th``, ``np``, ...) plus :data:`EXPRESSION_NAMES`.

    :raises ZooConfigError: naming the key when the expression fails
    """
    try:
        return eval(text, {**vars(rl_zoo3.exp_manager), **EXPRESSION_NAMES})
    except Exception as exc:  # any error of a user's expression, reported with its key
        raise ZooConfigError(
            f"Cannot evaluate hyperparameter '{key}' = {text!r} ({where}): {type(exc).__name__}: {exc}"
        ) from exc


def evaluate_expressions(hyperparams: dict[str, Any], where: Callable[[str], str]) -> None:
    """Replace the string values of :data:`EVALUATED_KEYS` in ``hyperparams`` by what they evaluate to;
    ``where`` names, for a key, where it was set (for the error messages)."""
    for key in EVALUATED_KEYS:
        if isinstance(hyperparams.get(key), str):
            hyperparams[key] = evaluate_expression(key, hyperparams[key], where(key))


@dataclass(frozen=True)
class ZooEntry:
    """One env's entry of a zoo hyperparameter file, ready to build the algorithm with.

    :param n_timesteps: the entry's training budget (env steps)
    :param n_envs: parallel envs
    :param normalize: whether the zoo wraps the envs in ``VecNormalize``
    :param env_wrapper: the entry's ``env_wrapper`` as one callable (None: no wrapper), for
        ``make_vec_env(..., wrapper_class=entry.env_wrapper)``
    :param kwargs: the algorithm's constructor arguments (``policy`` included), with expressions
        evaluated and ``lin_<x>`` learning rates turned into schedules, as the zoo does
    """

    n_timesteps: int
    n_envs: int
    normalize: bool
    env_wrapper: Callable[[gym.Env], gym.Env] | None
    kwargs: dict[str, Any]


def read_zoo_entry(env_id: str, path: Path | str = HYPERPARAMS_FILE) -> ZooEntry:
    """The entry of ``env_id`` in a zoo hyperparameter file (this package's by default), so a
    script can train with the settings ``python -m sb3_amago.zoo train`` would use::

        entry = read_zoo_entry("CartPole-v1")
        env = make_vec_env("CartPole-v1", n_envs=entry.n_envs, wrapper_class=entry.env_wrapper)
        AMAGO(env=env, **entry.kwargs).learn(entry.n_timesteps)
    """
    with open(path) as file:
        entries = yaml.safe_load(file)
    if env_id not in entries:
        raise ZooConfigError(f"{path} has no entry for '{env_id}'; its entries: {', '.join(sorted(entries))}.")
    hyperparams = dict(entries[env_id])
    where = f"in the entry for {env_id} in {path}"
    if "n_timesteps" not in hyperparams:
        raise ZooConfigError(f"'n_timesteps' is missing {where}: every entry needs it.")
    n_timesteps = int(float(hyperparams.pop("n_timesteps")))
    n_envs = int(hyperparams.pop("n_envs", 1))
    normalize = bool(hyperparams.pop("normalize", False))
    env_wrapper = rl_zoo3.utils.get_wrapper_class(hyperparams)
    hyperparams.pop("env_wrapper", None)
    evaluate_expressions(hyperparams, lambda _key: where)
    return ZooEntry(n_timesteps, n_envs, normalize, env_wrapper, ExperimentManager._preprocess_schedules(hyperparams))


class AmagoExperimentManager(ExperimentManager):
    """The zoo's experiment manager, reading this package's hyperparameter file for AMAGO by
    default and checking the hyperparameters before any env or model is made."""

    def __init__(
        self, args: argparse.Namespace, algo: str, env_id: str, *positional: Any, config: str | None = None, **kwargs: Any
    ) -> None:
        if config is None and algo == ALGO:
            config = str(HYPERPARAMS_FILE)
        # ExperimentManager's own positional parameters end before config, which comes by keyword here.
        super().__init__(args, algo, env_id, *positional, config=config, **kwargs)  # type: ignore[misc]

    def _where(self, key: str) -> str:
        """Where a hyperparameter was set: ``-params`` or the config file."""
        if self.custom_hyperparams and key in self.custom_hyperparams:
            return "from -params"
        return f"in the hyperparameters for {self.env_name.gym_id} from {self.config}"

    def _preprocess_hyperparams(
        self, hyperparams: dict[str, Any]
    ) -> tuple[dict[str, Any], Callable | None, list, Callable | None]:
        if self.algo != ALGO:
            return super()._preprocess_hyperparams(hyperparams)
        if "n_timesteps" not in hyperparams:
            raise ZooConfigError(
                f"'n_timesteps' is missing {self._where('n_timesteps')}: every entry needs it (-n overrides it)."
            )
        evaluate_expressions(hyperparams, self._where)
        processed = super()._preprocess_hyperparams(hyperparams)
        check_hyperparameters(processed[0], self._where)
        return processed


# ----------------------------------------------------------------------------------------------
# Optuna
# ----------------------------------------------------------------------------------------------
def convert_amago_params(sampled_params: dict[str, Any]) -> dict[str, Any]:
    """Optuna parameters -> AMAGO hyperparameters (``one_minus_gamma`` -> ``gamma``)."""
    hyperparams = dict(sampled_params)
    hyperparams["gamma"] = 1.0 - hyperparams.pop("one_minus_gamma")
    return hyperparams


def sample_amago_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict[str, Any]) -> dict[str, Any]:
    """Sample AMAGO's key hyperparameters (the zoo's sampler signature; sizes of the networks stay
    as configured, so ``-params policy_kwargs:...`` holds for every trial).

    :param trial: the Optuna trial
    :param n_actions: size of a Box action space (unused: AMAGO explores by its own schedule)
    :param n_envs: number of training envs (unused)
    :param additional_args: the zoo's extra arguments (unused)
    """
    sampled = {
        "learning_rate": trial.suggest_float("learning_rate", 3e-5, 1e-3, log=True),
        "one_minus_gamma": trial.suggest_float("one_minus_gamma", 1e-4, 0.05, log=True),
        "batch_size": trial.suggest_categorical("batch_size", [8, 16, 24, 32, 48]),
        "train_freq": trial.suggest_categorical("train_freq", [1, 2, 4, 8]),
        "tau": trial.suggest_float("tau", 1e-3, 2e-2, log=True),
        "reward_multiplier": trial.suggest_categorical("reward_multiplier", [1.0, 10.0, 100.0]),
        "bc_weight": trial.suggest_float("bc_weight", 0.0, 1.0),
        "epsilon_end": trial.suggest_float("epsilon_end", 0.01, 0.2, log=True),
    }
    hyperparams = convert_amago_params(sampled)
    trial.set_user_attr("gamma", hyperparams["gamma"])
    return hyperparams


# ----------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------
def register() -> None:
    """Make AMAGO known to rl_zoo3 in this process (idempotent): the algorithm, its Optuna
    sampler and converter, :class:`AmagoExperimentManager` for the zoo's train script, and
    :data:`EXPRESSION_NAMES` for the values of ``-params`` (which the zoo evaluates in its utils
    module), so that ``-params relabeler:"HindsightInstructionRelabeler(strategy='all')"`` works."""
    rl_zoo3.ALGOS[ALGO] = AMAGO  # the dict train, enjoy and the experiment manager all read
    HYPERPARAMS_SAMPLER[ALGO] = sample_amago_params
    HYPERPARAMS_CONVERTER[ALGO] = convert_amago_params
    rl_zoo3.train.ExperimentManager = AmagoExperimentManager  # type: ignore[misc]  # the train script reads this name
    for name, value in EXPRESSION_NAMES.items():
        setattr(rl_zoo3.utils, name, value)


def can_render_human(env_id: str) -> bool:
    """Whether the zoo's enjoy can make ``env_id`` with ``render_mode="human"``: its creator takes
    a ``render_mode`` and, when it declares render modes, offers "human" or an image mode (which
    gymnasium shows with its HumanRendering wrapper). Unknown ids answer True (the zoo reports them)."""
    if env_id not in gym.registry:
        return True
    entry_point = gym.spec(env_id).entry_point
    if entry_point is None:
        return True
    creator = entry_point if callable(entry_point) else load_env_creator(entry_point)
    accepted = _accepted_arguments(creator)
    if accepted is not None and "render_mode" not in accepted:
        return False
    metadata = getattr(creator, "metadata", None)
    if not isinstance(metadata, Mapping):
        return True
    return bool({"human", "rgb_array", "rgb_array_list"} & set(metadata.get("render_modes", [])))


def _enjoy() -> None:
    """The zoo's enjoy on ``sys.argv``, adding ``--no-render`` for an env that cannot render."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--no-render", action="store_true")
    known, _ = parser.parse_known_args(sys.argv[1:])
    if not known.no_render and not can_render_human(known.env):
        print(f"{known.env} cannot render for a human: playing it without rendering (--no-render).")
        sys.argv.append("--no-render")
    rl_zoo3.enjoy.enjoy()


#: The commands, each reading its flags from ``sys.argv`` like the zoo's own scripts.
COMMANDS: dict[str, Callable[[], None]] = {"train": rl_zoo3.train.train, "enjoy": _enjoy}
#: Flags put before the user's own for each command (argparse keeps the last value given).
DEFAULT_FLAGS: dict[str, list[str]] = {"train": ["--algo", ALGO], "enjoy": ["--algo", ALGO, "-f", "logs"]}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``train`` or ``enjoy`` of RL Zoo for AMAGO; ``argv`` defaults to ``sys.argv[1:]``.

    :return: the exit status (2 for a missing or unknown command, or a hyperparameter error)
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], [*DEFAULT_FLAGS.get(argv[0], []), *argv[1:]]
    if command not in COMMANDS:
        print(USAGE, file=sys.stderr)
        print(
            f"python -m sb3_amago.zoo: error: unknown command '{command}' (choose from {', '.join(COMMANDS)})", file=sys.stderr
        )
        return 2
    register()
    saved_argv = sys.argv
    sys.argv = [f"python -m sb3_amago.zoo {command}", *rest]
    try:
        COMMANDS[command]()
    except ZooConfigError as exc:
        print(f"python -m sb3_amago.zoo {command}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        sys.argv = saved_argv
    return 0


if __name__ == "__main__":
    sys.exit(main())
