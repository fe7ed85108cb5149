"""Hyperparameter search on Optuna: ``--search N --search-space ...`` (docs/search.md).

The search lives in one run directory: ``study.db`` (Optuna's SQLite storage, opened with
``load_if_exists``: the same command, or ``--resume last``, continues it, and Optuna's own
tools read it), one run directory per trial or batch under ``trials/``, ``trials.csv``,
``best_config.yaml`` (the best trial's config, runnable as is with ``--config``),
``search.json`` and the plots.

Where the recipe trains populations (docs/population.md) and the space holds only settings a
population's members may vary (float and bool settings), the trials come in batches of
``--search-batch K``: K trials are asked, trained as the K members of one population (each
member with its trial's settings, all with the search's seed), every member's evaluation is
reported to its trial, a member whose trial the pruner stops is stopped as a diverging
member is (one line, the others go on), and the K trials are told. Elsewhere the trials run
one after another in this process, each pruned run ending at the evaluation its trial is
pruned at.

A trial's objective is its final evaluation return (the mean over ``--eval-episodes``); a
trial whose run diverged is a failed trial.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlkit.configs.base import (
    _TYPED,
    LAUNCH_FIELDS,
    to_dict,
    typed_settings,
    with_members,
)
from rlkit.configs.search import SEARCH_FIELDS, Param, parse_space, sweepable, trial_config
from rlkit.training.engine import Engine, RunMode, RunReport
from rlkit.training.errors import RunFailedError
from rlkit.training.population import PopulationMode, PopulationRunReport, _label

__all__ = ["search", "STUDY_FILE"]

#: the study's storage, in the search's run directory
STUDY_FILE = "study.db"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _optuna():
    try:
        import optuna
    except ImportError:
        raise ValueError(
            "--search runs on Optuna, which is not installed: pip install 'rlkit[search]'"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def distributions(params: Sequence[Param]) -> dict[str, Any]:
    """The Optuna distribution of each setting of the space."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    out: dict[str, Any] = {}
    for p in params:
        if p.kind == "float":
            out[p.name] = FloatDistribution(p.low, p.high, log=p.log)
        elif p.kind == "int":
            out[p.name] = IntDistribution(p.low, p.high, log=p.log)
        else:
            out[p.name] = CategoricalDistribution(list(p.choices))
    return out


def make_sampler(cfg, seed: int):
    optuna = _optuna()
    if cfg.search_sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # constant_liar: the trials of one batch, asked together, spread out
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def make_pruner(cfg):
    """The pruner on the evaluations (steps are frames): MedianPruner (against the trials
    complete so far) or SuccessiveHalvingPruner (against every trial at its rung, so trials of
    one batch prune each other), both from the second evaluation (at most half the budget)."""
    optuna = _optuna()
    every = cfg.eval_every or cfg.total_frames
    if cfg.search_pruner == "none":
        return optuna.pruners.NopPruner()
    if cfg.search_pruner == "halving":
        # the first rung at two evaluations (at most half the budget): one evaluation's
        # noise does not decide
        first = max(1, min(2 * every, cfg.total_frames // 2))
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=first, reduction_factor=3)
    return optuna.pruners.MedianPruner(
        n_startup_trials=min(5, max(1, cfg.search_batch)),
        n_warmup_steps=min(2 * every, cfg.total_frames // 2),
    )


def open_study(cfg, run_dir: Path, *, seed_offset: int = 0):
    """The search's study in ``run_dir/study.db`` (created, or loaded to continue)."""
    optuna = _optuna()
    run_dir.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{(run_dir / STUDY_FILE).resolve()}"
    # the sampler is seeded with the search's seed plus the trials so far, so a resumed
    # search does not draw its first trials' settings again
    existing = 0
    if (run_dir / STUDY_FILE).exists():
        try:
            existing = len(optuna.load_study(study_name="search", storage=storage).trials)
        except KeyError:  # a file without the study
            existing = 0
    return optuna.create_study(
        study_name="search",
        storage=storage,
        direction="maximize",
        sampler=make_sampler(cfg, cfg.seed + existing + seed_offset),
        pruner=make_pruner(cfg),
        load_if_exists=True,
    )


def recover(study) -> int:
    """Trials left running by a search that was stopped (killed, interrupted) are failed,
    marked ``interrupted``, and asked again with the same settings; returns how many."""
    optuna = _optuna()
    stale = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for t in stale:
        trial = optuna.trial.Trial(study, t._trial_id)
        trial.set_user_attr("interrupted", True)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(dict(t.params), user_attrs={"retry_of": t.number})
    return len(stale)


def finished(study) -> int:
    """Trials that count towards ``--search N``: complete, pruned, or failed by their run
    (not by an interruption of the search)."""
    optuna = _optuna()
    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return sum(
        t.state in done
        or (t.state == optuna.trial.TrialState.FAIL and not t.user_attrs.get("interrupted"))
        for t in study.get_trials(deepcopy=False)
    )


# ------------------------------------------------------------------------ the run modes
class TrialReport(RunReport):
    """One trial's run: each evaluation reported to its trial; the run ends at the
    evaluation the pruner stops it at."""

    def __init__(self, learner, fabric, trial, total: int) -> None:
        super().__init__(learner, fabric)
        self.trial, self.total = trial, total
        self.pruned_at: int | None = None

    def evaluate(self, evaluator, counters, log):
        scored = super().evaluate(evaluator, counters, log)
        if scored is None or self.pruned_at is not None:
            return scored
        mean = scored[0]
        if math.isfinite(mean):
            self.trial.report(mean, counters.frames)
            if counters.frames < self.total and self.trial.should_prune():
                self.pruned_at = counters.frames
                log.progress.message(
                    f"trial {self.trial.number} pruned at {counters.frames:,} frames (eval "
                    f"return {mean:.1f}): the search goes on with the next"
                )
        return scored

    def ended(self) -> bool:
        return self.pruned_at is not None


class TrialMode(RunMode):
    def __init__(self, cfg, trial) -> None:
        super().__init__(cfg)
        self.trial = trial
        self.last_report: TrialReport | None = None

    def report(self, learner, fabric) -> TrialReport:
        self.last_report = TrialReport(learner, fabric, self.trial, self.cfg.total_frames)
        return self.last_report


class BatchReport(PopulationRunReport):
    """A batch of trials trained as one population: member ``i``'s evaluations reported to
    trial ``i``; a member whose trial the pruner stops is stopped (one line) and the others
    go on; the run ends when every member is stopped."""

    def __init__(self, learner, fabric, cfg, trials) -> None:
        super().__init__(learner, fabric, cfg)
        self.trials = list(trials)
        self.pruned: dict[int, int] = {}  # member -> frames it was pruned at
        self.total = cfg.total_frames

    def evaluate(self, evaluator, counters, log):
        mean, std, details = super().evaluate(evaluator, counters, log)
        learner = self.learner
        for i, (value, _) in enumerate(self.population.last):
            if i in learner.stopped or not math.isfinite(value):
                continue
            trial = self.trials[i]
            trial.report(value, counters.frames)
            if counters.frames < self.total and trial.should_prune():
                self.pruned[i] = counters.frames
                learner.stop(
                    i,
                    f"pruned by the search (trial {trial.number}, eval return {value:.1f} at "
                    f"{counters.frames:,} frames)",
                )
        return mean, std, details

    def reached(self, mean: float, target: float) -> bool:
        return not self.ended() and super().reached(mean, target)

    def ended(self) -> bool:
        return len(self.learner.stopped) == self.learner.size


class BatchMode(PopulationMode):
    def __init__(self, cfg, trials) -> None:
        super().__init__(cfg)
        self.trials = trials
        self.last_report: BatchReport | None = None

    def report(self, learner, fabric) -> BatchReport:
        self.last_report = BatchReport(learner, fabric, self.cfg, self.trials)
        return self.last_report


# ------------------------------------------------------------------------------- the search
def _typed(cfg, params: Mapping[str, Any]) -> frozenset[str]:
    """What a trial's run counts as typed: the search's typed settings (but its own and
    ``--resume``) and the trial's settings (each must be read by the run)."""
    typed = set(typed_settings(cfg)) - set(SEARCH_FIELDS) - {"resume", "overwrite"}
    return frozenset(typed | set(params))


def _engine(cfg, build, algo, env, engine_kw, mode_factory) -> Engine:
    engine = Engine(cfg, build, algo=algo, env=env, **engine_kw)
    # the engine may have copied the config (an env given): keep what the search set on it
    for name in (_TYPED, "_population_members"):
        if name in cfg.__dict__ and name not in engine.cfg.__dict__:
            object.__setattr__(engine.cfg, name, cfg.__dict__[name])
    engine.mode = mode_factory(engine.cfg)
    return engine


class _Search:
    def __init__(self, cfg, build, algo, env, engine_kw) -> None:
        self.cfg, self.build, self.algo, self.env = cfg, build, algo, env
        self.engine_kw = engine_kw
        self.params = parse_space(cfg)
        self.dists = distributions(self.params)
        self.run_dir = Path(cfg.run_dir) if cfg.run_dir else _default_dir(cfg, algo)
        self.why_sequential = self._why_sequential()

    def _why_sequential(self) -> str | None:
        if self.cfg.search_batch == 1:
            return "--search-batch 1"
        why = sweepable(self.cfg, self.params)
        if why is not None:
            return why
        try:  # the config's own refusals of a population (asynchronous IMPALA, ...)
            dataclasses.replace(trial_config(self.cfg, {}), population=2)
        except ValueError as err:
            return str(err).splitlines()[0]
        return None

    def trial_dir(self, numbers: Sequence[int]) -> str:
        name = f"trial_{numbers[0]:04d}"
        if len(numbers) > 1:
            name = f"trials_{numbers[0]:04d}-{numbers[-1]:04d}"
        return str(self.run_dir / "trials" / name)

    def trial_cfg(self, params: Mapping[str, Any], run_dir: str):
        out = trial_config(self.cfg, params, run_dir=run_dir, resume=None, overwrite=True)
        object.__setattr__(out, _TYPED, _typed(self.cfg, params))
        return out

    def valid(self, study, trial) -> bool:
        """Whether the trial's settings together make a valid config (each was checked
        alone at parse time); an invalid combination is a failed trial, in one line."""
        try:
            trial_config(self.cfg, trial.params)
        except ValueError as err:
            why = str(err).splitlines()[0]
            trial.set_user_attr("failed", why[:500])
            study.tell(trial, state=_optuna().trial.TrialState.FAIL)
            _say(f"trial {trial.number} failed: its settings do not go together ({why})")
            return False
        return True

    # ---------------------------------------------------------------- one trial
    def run_one(self, study, trial) -> None:
        optuna = _optuna()
        tcfg = self.trial_cfg(trial.params, self.trial_dir([trial.number]))
        engine = _engine(
            tcfg, self.build, self.algo, self.env, self.engine_kw, lambda c: TrialMode(c, trial)
        )
        try:
            summary = engine.fit()
        except RunFailedError as err:
            trial.set_user_attr("failed", str(err).splitlines()[0][:500])
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            _say(f"trial {trial.number} failed: {str(err).splitlines()[0]}")
            return
        report = engine.mode.last_report
        trial.set_user_attr("run_dir", tcfg.run_dir)
        if report is not None and report.pruned_at is not None:
            trial.set_user_attr("frames", report.pruned_at)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return
        trial.set_user_attr("frames", summary["frames"])
        value = summary["eval_return_mean"]
        if math.isfinite(value):
            study.tell(trial, value)
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)

    # ---------------------------------------------------------------- a batch
    def run_batch(self, study, trials) -> bool:
        """Train ``trials`` as one population; False when the recipe refuses populations
        (nothing was trained or told)."""
        optuna = _optuna()
        seed = self.cfg.seed
        run_dir = self.trial_dir([t.number for t in trials])
        names = sorted({k for t in trials for k in t.params})
        base = self.trial_cfg({}, run_dir)
        bcfg = with_members(base, [(seed, t.params) for t in trials])
        object.__setattr__(bcfg, _TYPED, _typed(self.cfg, dict.fromkeys(names)))
        engine = _engine(
            bcfg, self.build, self.algo, self.env, self.engine_kw, lambda c: BatchMode(c, trials)
        )
        try:
            summary = engine.fit()
        except RunFailedError as err:
            for t in trials:
                t.set_user_attr("failed", str(err).splitlines()[0][:500])
                study.tell(t, state=optuna.trial.TrialState.FAIL)
            _say(f"trials {trials[0].number}-{trials[-1].number} failed: {err}".splitlines()[0])
            return True
        except ValueError as err:
            if "--population" not in str(err):
                raise
            self.why_sequential = f"{self.algo} trains no populations"
            return False
        report = engine.mode.last_report
        learner = report.learner
        for i, t in enumerate(trials):
            t.set_user_attr("run_dir", run_dir)
            t.set_user_attr("member", i)
            if i in report.pruned:
                t.set_user_attr("frames", report.pruned[i])
                study.tell(t, state=optuna.trial.TrialState.PRUNED)
                continue
            value = report.population.last[i][0] if i < len(report.population.last) else math.nan
            if i in learner.stopped or not math.isfinite(value):
                t.set_user_attr("failed", str(learner.stopped.get(i, "no finite return"))[:500])
                t.set_user_attr("frames", summary["frames"])
                study.tell(t, state=optuna.trial.TrialState.FAIL)
                continue
            t.set_user_attr("frames", summary["frames"])
            study.tell(t, value)
        return True

    # ---------------------------------------------------------------- the whole search
    def run(self) -> dict[str, Any]:
        optuna = _optuna()
        cfg, run_dir = self.cfg, self.run_dir
        _check_search_dir(cfg, run_dir)
        study = open_study(cfg, run_dir)
        stale = recover(study)
        done = finished(study)
        if done or stale:
            _say(
                f"search: continuing the study in {run_dir / STUDY_FILE}: {done} trial(s) done"
                + (f", {stale} interrupted one(s) asked again" if stale else "")
            )
        if self.why_sequential and cfg.search_batch > 1:
            _say(f"search: the trials run one after another ({self.why_sequential})")
        tick = time.perf_counter()
        while done < cfg.search:
            k = 1 if self.why_sequential else min(cfg.search_batch, cfg.search - done)
            trials = [t for t in (study.ask(self.dists) for _ in range(k)) if self.valid(study, t)]
            k = len(trials)
            if k > 1 and not self.run_batch(study, trials):
                _say(f"search: the trials run one after another ({self.why_sequential})")
            if self.why_sequential or k == 1:
                for t in trials:
                    self.run_one(study, t)
            done = finished(study)
            write_outputs(study, cfg, run_dir, plots=False)
        seconds = time.perf_counter() - tick
        summary = write_outputs(study, cfg, run_dir, plots=True)
        summary["seconds"] = round(seconds, 3)
        summary["batched"] = self.why_sequential is None
        (run_dir / "search.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        _say(summary_line(summary, run_dir))
        del optuna
        return summary


def _default_dir(cfg, algo: str) -> Path:
    from datetime import datetime

    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"search-{algo}-{cfg.env.replace('/', '-')}-s{cfg.seed}-{stamp}"


def _check_search_dir(cfg, run_dir: Path) -> None:
    study = run_dir / STUDY_FILE
    if cfg.resume and not study.exists():
        raise ValueError(
            f"--resume last: {str(run_dir)!r} holds no search ({STUDY_FILE}); start one "
            "without --resume"
        )
    if run_dir.is_file():
        raise ValueError(f"--run-dir {str(run_dir)!r} is a file, not a directory")
    if run_dir.is_dir() and not study.exists() and any(run_dir.iterdir()):
        raise ValueError(
            f"--run-dir {str(run_dir)!r} holds files but no search ({STUDY_FILE}): pick "
            "another directory for the search"
        )


# ------------------------------------------------------------------------------ outputs
def trial_rows(study) -> list[dict[str, Any]]:
    """One row per trial: number, state, value, frames, then each setting."""
    rows = []
    names = sorted({k for t in study.trials for k in t.params})
    for t in study.trials:
        row = {
            "number": t.number,
            "state": t.state.name,
            "value": t.value if t.value is not None else "",
            "frames": t.user_attrs.get("frames", ""),
        }
        row |= {f"params_{n}": t.params.get(n, "") for n in names}
        rows.append(row)
    return rows


def write_trials_csv(study, path: Path) -> None:
    rows = trial_rows(study)
    fields = ["number", "state", "value", "frames"] + sorted(
        {k for r in rows for k in r if k.startswith("params_")}
    )
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def best_config(cfg, params: Mapping[str, Any]) -> dict[str, Any]:
    """The best trial's config as a ``--config`` file holds it: the search's settings with
    the trial's, the search's own settings at their defaults, no launch setting."""
    out = to_dict(trial_config(cfg, params, resume=None))
    return {k: v for k, v in out.items() if k not in LAUNCH_FIELDS}


def write_outputs(study, cfg, run_dir: Path, *, plots: bool) -> dict[str, Any]:
    """``trials.csv``, ``best_config.yaml`` and (``plots``) ``history.png`` and
    ``importance.png``; returns the search's summary."""
    import yaml

    optuna = _optuna()
    write_trials_csv(study, run_dir / "trials.csv")
    states = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    count = {s: sum(t.state == getattr(states, s) for t in trials) for s in ("COMPLETE", "PRUNED")}
    failed = sum(t.state == states.FAIL and not t.user_attrs.get("interrupted") for t in trials)
    summary: dict[str, Any] = {
        "trials": count["COMPLETE"] + count["PRUNED"] + failed,
        "complete": count["COMPLETE"],
        "pruned": count["PRUNED"],
        "failed": failed,
        "sampler": cfg.search_sampler,
        "pruner": cfg.search_pruner,
        "study": str(run_dir / STUDY_FILE),
    }
    if count["COMPLETE"]:
        best = study.best_trial
        summary["best"] = {
            "number": best.number,
            "value": best.value,
            "params": dict(best.params),
            "frames": best.user_attrs.get("frames"),
            "run_dir": best.user_attrs.get("run_dir"),
        }
        path = run_dir / "best_config.yaml"
        path.write_text(yaml.safe_dump(best_config(cfg, best.params), sort_keys=False))
        summary["best_config"] = str(path)
    if plots:
        summary["plots"] = write_plots(study, run_dir)
    return summary


def write_plots(study, run_dir: Path) -> list[str]:
    """``history.png`` (Optuna's optimisation history) and ``importance.png`` (its parameter
    importances, from 2 complete trials and 2 settings up); a plot that cannot be drawn
    warns in one line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    written = []
    for name, draw in (
        ("history.png", ovm.plot_optimization_history),
        ("importance.png", ovm.plot_param_importances),
    ):
        try:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # optuna's ExperimentalWarning
                ax = draw(study)
            fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
            fig.tight_layout()
            fig.savefig(run_dir / name, dpi=100)
            plt.close(fig)
            written.append(name)
        except Exception as err:  # a missing plot never fails a search
            _say(f"warning: could not draw {name}: {err}".splitlines()[0])
    return written


def summary_line(summary: Mapping[str, Any], run_dir: Path) -> str:
    head = (
        f"search done: {summary['trials']} trials ({summary['complete']} complete, "
        f"{summary['pruned']} pruned, {summary['failed']} failed) in "
        f"{summary.get('seconds', 0):.1f} s"
    )
    best = summary.get("best")
    if not best:
        return f"{head}; no trial completed; results in {run_dir}"
    params = _label(best["params"])
    return (
        f"{head}; best trial {best['number']}: eval return {best['value']:.1f} with {params}; "
        f"rerun it with --config {summary['best_config']}; results in {run_dir}"
    )


def search(
    cfg,
    build: Callable[..., Any],
    *,
    algo: str,
    env: Any = None,
    **engine_kw: Any,
) -> dict[str, Any]:
    """Run ``cfg.search`` trials of ``build`` over ``cfg.search_space`` (see the module
    docstring), each trial's run by the engine with ``engine_kw`` (``callbacks``,
    ``make_collector``); returns the search's summary (also ``search.json``)."""
    return _Search(cfg, build, algo, env, engine_kw).run()
