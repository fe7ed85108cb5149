"""``--search N``: the space and its refusals, the trials table and the best config, a pruned
member stopped with one line while the others go on, a resumed study, the sequential path.

References are written here by hand: the parsed space against the specs typed, the table
against trials told to a study here, the best config against the settings of the trial
told the highest value, the pruned member against a pruner that stops one named trial.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging

import pytest

optuna = pytest.importorskip("optuna")

from optuna.distributions import FloatDistribution  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from rlkit.algorithms import load  # noqa: E402
from rlkit.configs.ppo import PPOConfig  # noqa: E402
from rlkit.configs.search import Param, parse_space  # noqa: E402
from rlkit.training import search as search_mod  # noqa: E402
from rlkit.training.cli import parse  # noqa: E402

TINY = ["--num-envs", "2", "--rollout-steps", "32", "--minibatch-size", "32", "--epochs", "1"]
TINY += ["--eval-episodes", "2", "--eval-max-steps", "30", "--progress", "false"]
TINY += ["--checkpoint-every", "0", "--logger", "csv"]


# ------------------------------------------------------------------------------ the space
def test_space_from_flags_and_a_yaml_file(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(
        "clip_epsilon: '0.1:0.3'\n"
        "epochs: {low: 2, high: 8, int: true}\n"
        "normalize_advantage: [true, false]\n"
        "gae_lambda: {low: 0.9, high: 0.99, log: true}\n"
    )
    cfg = PPOConfig(
        search=4,
        search_space=("lr=log:1e-5:1e-2", "entropy_coef=0:0.05", "minibatch_size=int:32:256",
                      "num_envs=8|16", str(space)),
    )  # fmt: skip
    got = {p.name: p for p in parse_space(cfg)}
    assert got["lr"] == Param("lr", "float", 1e-5, 1e-2, True, text="log:1e-5:1e-2")
    assert got["entropy_coef"] == Param("entropy_coef", "float", 0.0, 0.05, False, text="0:0.05")
    assert got["minibatch_size"] == Param("minibatch_size", "int", 32, 256, text="int:32:256")
    assert got["num_envs"].choices == (8, 16)
    assert got["clip_epsilon"] == Param("clip_epsilon", "float", 0.1, 0.3, text="0.1:0.3")
    assert (got["epochs"].kind, got["epochs"].low, got["epochs"].high) == ("int", 2, 8)
    assert got["normalize_advantage"].choices == (True, False)
    assert got["gae_lambda"].log and got["gae_lambda"].low == 0.9
    assert list(got) == [  # the order given: flags, then the file's
        "lr", "entropy_coef", "minibatch_size", "num_envs",
        "clip_epsilon", "epochs", "normalize_advantage", "gae_lambda",
    ]  # fmt: skip
    dists = search_mod.distributions(parse_space(cfg))
    assert dists["lr"] == FloatDistribution(1e-5, 1e-2, log=True)


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ("foo=0:1", "no setting 'foo'"),
        ("lr=log:0:1e-2", "a log range needs LOW > 0"),
        ("lr=1e-2:1e-5", "LOW must be below HIGH"),
        ("lr=int:1:3", "lr is a float setting"),
        ("epochs=1:3", "epochs is an int setting"),
        ("entropy_coef=-1:0.05", "--entropy-coef must be >= 0"),  # the config's own check
        ("clip_epsilon=0.1|x", "expected float, got 'x'"),
        ("seed=0:5", "seed is not searched"),
        ("total_frames=int:1:5", "total_frames is not searched"),
        ("lr", "write NAME=SPEC"),
        ("lr=0:1:2", "write LOW:HIGH"),
        ("lr=0:nan", "the bounds must be finite"),
        ("nope.yaml", "no such file"),
    ],
)
def test_a_bad_space_is_refused_in_one_line_naming_it(entry, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse("ppo", ["--search", "2", "--search-space", entry])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert named in err and "--search-space" in err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--search", "2"], "--search N needs --search-space"),
        (["--search-space", "lr=0.1:0.2"], "needs --search N"),
        (["--search", "2", "--search-space", "lr=0.1:0.2", "--population", "2"], "--population"),
        (["--search", "2", "--search-space", "lr=0.1:0.2", "--search-batch", "0"], ">= 1"),
        (["--search", "2", "--search-space", "lr=0.1:0.2", "lr=0.2:0.3"], "given twice"),
        (["--search", "2", "--search-space", "lr=0.1:0.2", "--search-pruner", "x"], "pruner"),
    ],
)
def test_bad_search_flags_are_refused_in_one_line(argv, named, capsys):
    with pytest.raises(SystemExit):
        parse("ppo", argv)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err


def test_a_yaml_spec_that_yaml_reads_as_a_number_is_refused(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text("entropy_coef: 0:0.05\n")  # unquoted: YAML reads base 60, 0.05
    with pytest.raises(SystemExit):
        parse("ppo", ["--search", "2", "--search-space", str(space)])
    assert "write a quoted spec" in capsys.readouterr().err


def test_which_spaces_train_as_populations():
    from rlkit.configs.search import sweepable

    floats = PPOConfig(search=2, search_space=("lr=0.1:0.2", "normalize_advantage=true|false"))
    assert sweepable(floats, parse_space(floats)) is None
    ints = PPOConfig(search=2, search_space=("lr=0.1:0.2", "epochs=int:1:4"))
    assert "epochs" in sweepable(ints, parse_space(ints))


# ------------------------------------------------------------------------------ outputs
def _study(tmp_path, values):
    """A study with trials told here: ``values`` of (lr, value or None: pruned)."""
    study = optuna.create_study(
        study_name="search",
        storage=f"sqlite:///{tmp_path / 'study.db'}",
        direction="maximize",
    )
    dist = {"lr": FloatDistribution(1e-5, 1e-2, log=True)}
    for i, (lr, value) in enumerate(values):
        study.enqueue_trial({"lr": lr})
        trial = study.ask(dist)
        trial.set_user_attr("frames", 1000 * (i + 1))
        if value is None:
            trial.report(1.0, 500)
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, value)
    return study


def test_trials_table_and_best_config_written_and_loadable(tmp_path):
    study = _study(tmp_path, [(1e-4, 20.0), (3e-3, 480.0), (1e-5, None), (1e-3, 300.0)])
    argv = ["--search", "4", "--search-space", "lr=log:1e-5:1e-2", "--total-frames", "4096"]
    cfg = parse("ppo", [*argv, "--seed", "3", "--run-dir", str(tmp_path)])
    summary = search_mod.write_outputs(study, cfg, tmp_path, plots=False)
    with (tmp_path / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["number"], r["state"], r["frames"]) for r in rows] == [
        ("0", "COMPLETE", "1000"),
        ("1", "COMPLETE", "2000"),
        ("2", "PRUNED", "3000"),
        ("3", "COMPLETE", "4000"),
    ]
    assert [float(r["params_lr"]) for r in rows] == [1e-4, 3e-3, 1e-5, 1e-3]
    assert float(rows[1]["value"]) == 480.0 and float(rows[2]["value"]) == 1.0  # last report
    assert (summary["complete"], summary["pruned"], summary["best"]["number"]) == (3, 1, 1)
    # the best config runs as is: the search's settings, the best trial's lr, no search
    best = parse("ppo", ["--config", str(tmp_path / "best_config.yaml")])
    assert best.lr == 3e-3 and best.total_frames == 4096 and best.seed == 3
    assert best.search == 0 and best.search_space is None and best.run_dir is None


# ------------------------------------------------------------------------------ runs
class _PruneTrial(optuna.pruners.BasePruner):
    """Prunes trial ``number`` at its first report, no other."""

    def __init__(self, number: int) -> None:
        self.number = number

    def prune(self, study, trial) -> bool:
        return trial.number == self.number


def _search(tmp_path, algo: str, argv: list[str], monkeypatch, pruner=None) -> tuple[dict, str]:
    err = io.StringIO()
    if pruner is not None:
        monkeypatch.setattr(search_mod, "make_pruner", lambda cfg: pruner)
    handler = logging.StreamHandler(err)
    logging.getLogger("rlkit.training.population").addHandler(handler)
    try:
        with contextlib.redirect_stderr(err):
            summary = load(algo).main([*argv, "--run-dir", str(tmp_path / "s")])
    finally:
        logging.getLogger("rlkit.training.population").removeHandler(handler)
    return summary, err.getvalue()


@pytest.mark.slow
def test_a_pruned_member_stops_with_one_line_and_the_others_go_on(tmp_path, monkeypatch):
    argv = [*TINY, "--total-frames", "192", "--eval-every", "64", "--search", "3"]
    argv += ["--search-batch", "3", "--search-space", "lr=log:1e-4:1e-2"]
    summary, err = _search(tmp_path, "ppo", argv, monkeypatch, pruner=_PruneTrial(1))
    lines = [line for line in err.splitlines() if "pruned by the search" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("warning: member 1 ") and "the other members go on" in lines[0]
    study = optuna.load_study(study_name="search", storage=f"sqlite:///{tmp_path}/s/study.db")
    states = [(t.number, t.state, t.user_attrs["frames"]) for t in study.trials]
    assert states == [
        (0, TrialState.COMPLETE, 192),
        (1, TrialState.PRUNED, 64),  # stopped at its first evaluation
        (2, TrialState.COMPLETE, 192),
    ]
    assert sorted(study.trials[1].intermediate_values) == [64]
    assert sorted(study.trials[0].intermediate_values) == [64, 128, 192]
    run = tmp_path / "s" / "trials" / "trials_0000-0002"
    members = json.loads((run / "population.json").read_text())["members"]
    assert [m["stopped"] is not None for m in members] == [False, True, False]
    # the pruned member took no step after its pruning: its per-member metrics end there
    with (run / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("member") == "1" and r.get("loss_policy")]
    assert rows and max(int(r["frames"]) for r in rows) == 64
    assert summary["pruned"] == 1 and summary["complete"] == 2
    assert (tmp_path / "s" / "best_config.yaml").exists()


def test_resume_from_the_study_continues_its_numbering(tmp_path, monkeypatch):
    """A search killed in its second trial: its study holds trial 0 complete and trial 1
    running. Run again, trial 1 is failed as interrupted and asked again with its settings
    (as trial 2), and trial 3 is new; three trials count."""
    run_dir = tmp_path / "s"
    run_dir.mkdir()
    study = optuna.create_study(
        study_name="search", storage=f"sqlite:///{run_dir / 'study.db'}", direction="maximize"
    )
    dist = {"lr": FloatDistribution(1e-4, 1e-2, log=True)}
    first = study.ask(dist)
    study.tell(first, 100.0)
    study.enqueue_trial({"lr": 2e-3})
    killed = study.ask(dist)  # left RUNNING, as a SIGKILL leaves it
    assert killed.number == 1
    told: list[tuple[int, float]] = []

    def fake_run_one(self, study, trial):
        told.append((trial.number, trial.params["lr"]))
        trial.set_user_attr("frames", 10)
        study.tell(trial, 50.0 + trial.number)

    monkeypatch.setattr(search_mod._Search, "run_one", fake_run_one)
    argv = ["--search", "3", "--search-space", "lr=log:1e-4:1e-2", "--search-batch", "1"]
    argv += ["--progress", "false", "--resume", "last"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        summary = load("ppo").main([*argv, "--run-dir", str(run_dir)])
    assert "1 trial(s) done, 1 interrupted one(s) asked again" in err.getvalue()
    assert [n for n, _ in told] == [2, 3]
    assert told[0][1] == 2e-3  # the interrupted trial's settings, asked again
    study = optuna.load_study(study_name="search", storage=f"sqlite:///{run_dir / 'study.db'}")
    assert [t.state for t in study.trials] == [
        TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE,
    ]  # fmt: skip
    assert study.trials[1].user_attrs["interrupted"] is True
    assert (summary["trials"], summary["complete"], summary["failed"]) == (3, 3, 0)


def test_resume_without_a_study_is_refused(tmp_path, capsys):
    argv = ["--search", "2", "--search-space", "lr=0.1:0.2", "--resume", "last"]
    with pytest.raises(SystemExit):
        from rlkit.algorithms import recipe

        recipe("ppo", [*argv, "--run-dir", str(tmp_path / "none")])
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --resume last") and len(err.splitlines()) == 1


@pytest.mark.slow
def test_a_recipe_without_populations_runs_its_trials_one_after_another(tmp_path, monkeypatch):
    """DQN refuses populations (its replay buffer is not per member): its trials are runs of
    their own, one after another, each pruned run ending at its pruned evaluation."""
    argv = ["--num-envs", "2", "--eval-episodes", "2", "--eval-max-steps", "30"]
    argv += ["--progress", "false", "--checkpoint-every", "0", "--logger", "csv"]
    argv += ["--learning-starts", "64", "--buffer-size", "256", "--total-frames", "192"]
    argv += ["--steps-per-batch", "32"]
    argv += ["--eval-every", "64", "--search", "2", "--search-space", "lr=log:1e-4:1e-3"]
    summary, err = _search(tmp_path, "dqn", argv, monkeypatch, pruner=_PruneTrial(1))
    assert "search: the trials run one after another (dqn trains no populations)" in err
    trials = tmp_path / "s" / "trials"
    assert sorted(p.name for p in trials.iterdir()) == ["trial_0000", "trial_0001"]
    assert json.loads((trials / "trial_0000" / "summary.json").read_text())["frames"] == 192
    assert json.loads((trials / "trial_0001" / "summary.json").read_text())["frames"] < 192
    assert "trial 1 pruned at" in err
    assert (summary["complete"], summary["pruned"]) == (1, 1)


def test_the_docs_search_command_parses():
    """docs/search.md's first command, as typed there (its flags and space are real)."""
    import re
    import shlex
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "search.md").read_text()
    block = re.search(r"```bash\n(.*?)```", page, flags=re.S).group(1)
    command = block.split("\n")[0:3]
    argv = shlex.split(" ".join(line.rstrip("\\") for line in command))
    assert argv[:2] == ["python", "recipes/ppo.py"]
    cfg = parse("ppo", argv[2:])
    assert cfg.search == 16 and [p.name for p in parse_space(cfg)] == ["lr", "entropy_coef"]
