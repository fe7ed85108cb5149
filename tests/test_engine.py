"""The engine end to end on tiny budgets: files, counters, resume, warm start, bad input, NaN."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import yaml

from rlkit.training import CheckpointError, NonFiniteError
from rlkit.training import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[1]


def load_recipe(name: str):
    """An algorithm's module (config, presets, build, main) as research code imports it."""
    if importlib.util.find_spec(f"rlkit.algorithms.{name}") is not None:
        return importlib.import_module(f"rlkit.algorithms.{name}")
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ppo():
    return load_recipe("ppo")


TINY = ["--num-envs", "4", "--rollout-steps", "16", "--minibatch-size", "32", "--epochs", "2"]
QUIET = ["--progress", "false", "--eval-episodes", "2"]


def test_run_writes_every_artifact_and_counts_frames(ppo, tmp_path):
    run_dir = tmp_path / "run"
    summary = ppo.main(
        [
            *TINY,
            *QUIET,
            "--total-frames",
            "256",
            "--eval-every",
            "128",
            "--checkpoint-every",
            "128",
            "--run-dir",
            str(run_dir),
        ]
    )
    assert summary["frames"] == 256  # 4 batches of 4 x 16
    for name in ("config.yaml", "metrics.csv", "eval.csv", "summary.json", "curve.png"):
        assert (run_dir / name).is_file(), name
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["frames"] == 256 and on_disk["algo"] == "ppo"
    for key in (
        "train_seconds",
        "fps",
        "eval_return_mean",
        "eval_return_std",
        "solved",
        "solved_frames",
        "solved_seconds",
        "config",
        "env",
        "seed",
    ):
        assert key in on_disk
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["total_frames"] == 256
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["frames_000000000128.pt", "frames_000000000256.pt", "last.pt"]
    evals = (run_dir / "eval.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in evals[1:]] == ["128", "256"]
    payload = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert payload["counters"]["frames"] == 256
    # loadable with weights_only=True: only tensors and plain containers inside
    torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def test_same_seed_same_result(ppo, tmp_path):
    args = [*TINY, *QUIET, "--total-frames", "192", "--eval-every", "0"]
    a = ppo.main([*args, "--run-dir", str(tmp_path / "a")])
    b = ppo.main([*args, "--run-dir", str(tmp_path / "b")])
    pa = ckpt.load(tmp_path / "a" / "checkpoints" / "last.pt")["modules"]["actor"]
    pb = ckpt.load(tmp_path / "b" / "checkpoints" / "last.pt")["modules"]["actor"]
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert a["eval_return_mean"] == b["eval_return_mean"]


def test_resume_continues_frames_and_schedules(ppo, tmp_path):
    run_dir = tmp_path / "run"
    common = [
        *TINY,
        *QUIET,
        "--run-dir",
        str(run_dir),
        "--eval-every",
        "0",
        "--lr-schedule",
        "linear",
        "--lr",
        "0.001",
        "--lr-final",
        "0.0",
    ]
    ppo.main([*common, "--total-frames", "128", "--checkpoint-every", "64"])
    first = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert first["counters"]["frames"] == 128
    summary = ppo.main([*common, "--total-frames", "256", "--resume", "last"])
    assert summary["frames"] == 256
    rows = [line.split(",") for line in (run_dir / "metrics.csv").read_text().splitlines()]
    header, body = rows[0], rows[1:]
    frames = [int(r[header.index("frames")]) for r in body]
    assert frames == sorted(set(frames)), "a frame count appears twice or out of order"
    assert frames[-1] == 256
    # the linear schedule continued from its position: lr at 192 frames is 1e-3 * (1 - 128/256)
    lr = {int(r[header.index("frames")]): float(r[header.index("lr")]) for r in body}
    assert math.isclose(lr[192], 1e-3 * (1 - 128 / 256), rel_tol=1e-6)


class _FirstBatches:
    """The engine's collector hook, recording the observations of each collector's first
    batch (one per run or resume)."""

    def __init__(self, make):
        self.make, self.first = make, []

    def __call__(self, env, learner, device, *, seed=None):
        collector = self.make(env, learner, device, seed=seed)
        spy = self

        class Recording:
            def __iter__(self):
                for i, batch in enumerate(collector):
                    if i == 0:
                        spy.first.append(batch["observation"][:, 0].clone())
                    yield batch

            def __getattr__(self, name):
                return getattr(collector, name)

        return Recording()


def test_a_resumed_run_does_not_replay_its_first_episodes(ppo, tmp_path, monkeypatch):
    """The envs of a resumed run start from seeds that count its frames, not from the run's
    first seeds (which would replay its first episodes after every resume); a fresh run with
    the same seed starts where the first did."""
    from rlkit.training import engine

    spy = _FirstBatches(engine.default_collector)
    monkeypatch.setattr(engine, "default_collector", spy)
    common = [*TINY, *QUIET, "--eval-every", "0", "--run-dir", str(tmp_path / "run")]
    ppo.main([*common, "--total-frames", "128"])
    ppo.main([*common, "--total-frames", "256", "--resume", "last"])
    ppo.main([*TINY, *QUIET, "--total-frames", "64", "--run-dir", str(tmp_path / "again")])
    first, resumed, again = spy.first
    assert torch.equal(first, again)  # the same seed, the same start states
    assert not torch.equal(first, resumed)


def test_a_resumed_population_does_not_replay_its_first_episodes(ppo, tmp_path, monkeypatch):
    from rlkit.training import engine

    spy = _FirstBatches(engine.default_collector)
    monkeypatch.setattr(engine, "default_collector", spy)
    common = [*TINY, *QUIET, "--eval-every", "0", "--population", "2"]
    common += ["--run-dir", str(tmp_path / "run")]
    ppo.main([*common, "--total-frames", "128"])
    ppo.main([*common, "--total-frames", "256", "--resume", "last"])
    first, resumed = spy.first
    assert first.shape == resumed.shape == (8, 4)  # 2 members x 4 envs, CartPole's 4 numbers
    assert not any(torch.equal(a, b) for a, b in zip(first, resumed, strict=True))


def test_a_resumed_impala_run_seeds_its_workers_past_the_run_start(tmp_path, monkeypatch):
    from rlkit.data import async_collect

    seeds: list[int] = []
    real = async_collect.WorkerCollector.__init__

    def init(self, *args, **kwargs):
        seeds.append(kwargs["seed"])
        real(self, *args, **kwargs)

    monkeypatch.setattr(async_collect.WorkerCollector, "__init__", init)
    impala = load_recipe("impala")
    common = ["--num-envs", "4", "--rollout-steps", "16", "--minibatch-size", "32", *QUIET]
    common += ["--eval-every", "0"]
    common += ["--seed", "3", "--run-dir", str(tmp_path / "run")]
    impala.main([*common, "--total-frames", "128"])
    impala.main([*common, "--total-frames", "256", "--resume", "last"])
    assert seeds == [3, 3 + 128]


def test_warm_start_copies_weights_only(ppo, tmp_path):
    src = tmp_path / "src"
    ppo.main([*TINY, *QUIET, "--total-frames", "64", "--eval-every", "0", "--run-dir", str(src)])
    source = ckpt.load(src / "checkpoints" / "last.pt")
    dst = tmp_path / "dst"
    summary = ppo.main(
        [
            *TINY,
            *QUIET,
            "--total-frames",
            "64",
            "--eval-every",
            "0",
            "--run-dir",
            str(dst),
            "--init-from",
            str(src / "checkpoints" / "last.pt"),
            "--lr",
            "1e-12",
            "--lr-schedule",
            "constant",
        ]
    )
    assert summary["frames"] == 64  # the counter did not come from the checkpoint
    after = ckpt.load(dst / "checkpoints" / "last.pt")["modules"]["actor"]
    before = source["modules"]["actor"]
    assert all(torch.allclose(after[k], before[k], atol=1e-6) for k in before)


def test_unknown_env_id_is_named(ppo, tmp_path):
    with pytest.raises(ValueError, match="did you mean 'CartPole-v1'"):
        ppo.main(["--env", "CartPol-v1", "--run-dir", str(tmp_path)])


def test_resume_from_corrupt_or_missing_or_mismatched_checkpoint(ppo, tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        ppo.main([*TINY, *QUIET, "--resume", str(bad), "--run-dir", str(tmp_path / "r")])
    with pytest.raises(CheckpointError, match="does not exist"):
        ppo.main([*TINY, *QUIET, "--resume", str(tmp_path / "no.pt"), "--run-dir", str(tmp_path)])
    src = tmp_path / "src"
    ppo.main([*TINY, *QUIET, "--total-frames", "64", "--eval-every", "0", "--run-dir", str(src)])
    # a checkpoint whose networks do not fit the config (a file edited by hand, or written
    # by another version): the tensors are named, nothing is half-loaded
    payload = ckpt.load(src / "checkpoints" / "last.pt")
    payload["config"]["hidden"] = [32]
    ckpt.atomic_save(payload, tmp_path / "edited.pt")
    with pytest.raises(CheckpointError, match="does not fit module"):
        ppo.main(
            [*QUIET, "--resume", str(tmp_path / "edited.pt"), "--run-dir", str(tmp_path / "x")]
        )


def test_resume_last_needs_run_dir(ppo, capsys):
    with pytest.raises(SystemExit):
        ppo.main([*TINY, *QUIET, "--resume", "last"])
    assert "--resume last needs --run-dir" in capsys.readouterr().err


def test_nan_stops_the_run_and_keeps_the_last_good_checkpoint(ppo, tmp_path, monkeypatch):
    from rlkit.objectives import PPOLoss

    run_dir = tmp_path / "run"
    forward = PPOLoss.forward
    calls = {"n": 0}

    def poisoned(self, td):
        out = forward(self, td)
        calls["n"] += 1
        if calls["n"] > 12:  # after the first checkpoint (2 batches x 2 epochs x 2 minibatches)
            out["loss_policy"] = out["loss_policy"] * float("nan")
        return out

    monkeypatch.setattr(PPOLoss, "forward", poisoned)
    with pytest.raises(NonFiniteError, match="last good checkpoint .* is intact"):
        ppo.main(
            [
                *TINY,
                *QUIET,
                "--total-frames",
                "640",
                "--eval-every",
                "0",
                "--checkpoint-every",
                "128",
                "--run-dir",
                str(run_dir),
            ]
        )
    payload = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert payload["counters"]["frames"] == 128
    assert ckpt.all_finite({"a": _state_module(payload["modules"]["actor"])})


def _state_module(state):
    module = torch.nn.Module()
    for i, v in enumerate(state.values()):
        module.register_buffer(f"b{i}", v.clone())
    return module


def test_video_flag_writes_a_gif_of_an_evaluation_episode(ppo, tmp_path):
    ppo.main(
        [
            *TINY,
            *QUIET,
            "--total-frames",
            "64",
            "--eval-every",
            "0",
            "--video",
            # a 30-step episode: encoding the GIF of a 500-step one took 15 s
            "--max-episode-steps",
            "30",
            "--run-dir",
            str(tmp_path),
        ]
    )
    gif = (tmp_path / "eval.gif").read_bytes()
    assert gif[:6] in (b"GIF87a", b"GIF89a")
    from PIL import Image

    with Image.open(tmp_path / "eval.gif") as image:
        assert image.n_frames > 1  # an episode, not a still
        assert image.size[0] > 100 and image.size[1] > 100


def test_continuous_actions_and_observation_normalisation(ppo, tmp_path):
    summary = ppo.main(
        [
            *TINY,
            *QUIET,
            "--env",
            "Pendulum-v1",
            "--normalize-obs",
            "--total-frames",
            "128",
            "--eval-every",
            "0",
            "--run-dir",
            str(tmp_path),
        ]
    )
    assert summary["frames"] == 128
    state = ckpt.load(tmp_path / "checkpoints" / "last.pt")["modules"]["obs_norm"]
    # the statistics saw every training observation of the 2 batches (plus the prior count)
    assert float(state["count"]) == pytest.approx(128, abs=1)


def test_unsupported_action_space_is_named_before_training(ppo, tmp_path):
    import tests.test_envs  # noqa: F401  (registers rlkit-test/* envs with odd spaces)

    with pytest.raises(ValueError, match=r"action space .*Dict"):
        ppo.main(
            [
                *TINY,
                *QUIET,
                "--env",
                "rlkit-test/NestedDictAction-v0",
                "--run-dir",
                str(tmp_path),
            ]
        )
    assert not (tmp_path / "metrics.csv").exists()


def test_kl_adaptive_learning_rate_follows_the_rule_batch_by_batch(ppo, tmp_path):
    import csv

    ppo.main(
        [
            *TINY,
            *QUIET,
            "--total-frames",
            "640",
            "--eval-every",
            "0",
            "--run-dir",
            str(tmp_path),
            "--lr-schedule",
            "kl",
            "--kl-target",
            "0.002",
            "--lr",
            "0.003",
        ]
    )
    with (tmp_path / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 10
    lrs = [float(r["lr"]) for r in rows]
    kls = [float(r["approx_kl"]) for r in rows]
    assert lrs[0] == pytest.approx(0.003)
    for k in range(len(rows) - 1):  # textbook rule: /1.5 above 2x target, x1.5 below half
        expected = lrs[k]
        if kls[k] > 2 * 0.002:
            expected = lrs[k] / 1.5
        elif kls[k] < 0.002 / 2:
            expected = lrs[k] * 1.5
        assert lrs[k + 1] == pytest.approx(expected, rel=1e-4), k
    assert len(set(lrs)) > 1  # the schedule did move


def test_reward_normalisation_flag_scales_rewards_and_resumes_its_statistics(ppo, tmp_path):
    """--normalize-reward: the statistics see every frame once, across a resume, and the
    scale they imply is the one the training rewards were divided by."""
    run_dir = tmp_path / "run"
    common = [*TINY, *QUIET, "--run-dir", str(run_dir), "--eval-every", "0"]
    common += ["--normalize-reward", "true", "--gamma", "0.9"]
    ppo.main([*common, "--total-frames", "128"])
    first = ckpt.load(run_dir / "checkpoints" / "last.pt")["modules"]["reward_norm"]
    # one discounted return per env per step went into the statistics
    assert float(first["stats.count"]) == pytest.approx(128, abs=1e-3)
    # CartPole's reward is +1, so G_t = 1 + 0.9 G_{t-1} (reset at episode ends) lies in
    # [1, 10): the running mean is there and the variance is positive
    assert 1.0 <= float(first["stats.mean"]) < 10.0 and float(first["stats.var"]) > 0
    ppo.main([*common, "--total-frames", "256", "--resume", "last"])
    second = ckpt.load(run_dir / "checkpoints" / "last.pt")["modules"]["reward_norm"]
    assert float(second["stats.count"]) == pytest.approx(256, abs=1e-3)

    # logged episode returns stay in CartPole's units: the first batch (collected before
    # any update) logs the same returns as a run without the flag
    def first_return(folder):
        rows = [line.split(",") for line in (folder / "metrics.csv").read_text().splitlines()]
        return float(rows[1][rows[0].index("episode_return")])

    plain = tmp_path / "plain"
    ppo.main([*TINY, *QUIET, "--run-dir", str(plain), "--eval-every", "0", "--gamma", "0.9",
              "--total-frames", "64"])  # fmt: skip
    assert first_return(run_dir) == first_return(plain) >= 8


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_worker_recipes_normalise_rewards_in_the_learner_and_resume_its_state(algo, tmp_path):
    """--normalize-reward in the worker recipes (refused before): the learner's
    BatchRewardNorm sees every frame once across a resume, keeps each env's running return,
    and the logged episode returns stay in CartPole's units."""
    recipe = load_recipe(algo)
    run_dir = tmp_path / "run"
    common = [*TINY, *QUIET, "--run-dir", str(run_dir), "--eval-every", "0", "--gamma", "0.9"]
    common += ["--normalize-reward", "true", "--sync-collect", "true"]
    recipe.main([*common, "--total-frames", "128"])
    first = ckpt.load(run_dir / "checkpoints" / "last.pt")["modules"]["reward_norm"]
    assert float(first["norm.stats.count"]) == pytest.approx(128, abs=1e-3)
    assert 1.0 <= float(first["norm.stats.mean"]) < 10.0  # G = 1 + 0.9 G' on CartPole
    returns = first["returns"].flatten()
    assert returns.shape == (4,) and bool((returns >= 0).all()) and float(returns.max()) >= 1
    recipe.main([*common, "--total-frames", "256", "--resume", "last"])
    second = ckpt.load(run_dir / "checkpoints" / "last.pt")["modules"]["reward_norm"]
    assert float(second["norm.stats.count"]) == pytest.approx(256, abs=1e-3)
    rows = [line.split(",") for line in (run_dir / "metrics.csv").read_text().splitlines()]
    column = rows[0].index("episode_return")
    logged = [float(r[column]) for r in rows[1:] if r[column]]
    assert logged and min(logged) >= 8  # CartPole's units (an episode lasts >= 8 steps)


def test_eval_env_scores_the_policy_on_another_task_with_the_same_spaces(ppo, tmp_path):
    common = [*TINY, *QUIET, "--total-frames", "64", "--env", "rlkit/MountainCarSparse-v0"]
    sparse = ppo.main(
        [*common, "--run-dir", str(tmp_path / "sparse"), "--eval-env", "rlkit/MountainCarSparse-v0"]
    )
    dense = ppo.main([*common, "--run-dir", str(tmp_path / "dense")])  # the preset's eval env
    # identical training (same seed, same sparse rewards), so the same greedy policy...
    a = ckpt.load(tmp_path / "sparse" / "checkpoints" / "last.pt")["modules"]["actor"]
    b = ckpt.load(tmp_path / "dense" / "checkpoints" / "last.pt")["modules"]["actor"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    # ...scored in two currencies: the sparse task pays 0 or 1 per episode (an untrained policy
    # does not reach the goal: 0), MountainCar-v0 pays -1 per step up to its 200-step limit
    assert sparse["eval_return_mean"] == 0.0
    assert dense["eval_return_mean"] == -200.0
    assert dense["config"]["eval_env"] == "MountainCar-v0"


def test_eval_env_with_other_spaces_is_refused_before_training(ppo, tmp_path):
    with pytest.raises(ValueError, match="--eval-env 'Acrobot-v1' does not match --env"):
        ppo.main([*TINY, *QUIET, "--eval-env", "Acrobot-v1", "--run-dir", str(tmp_path)])
    assert not (tmp_path / "metrics.csv").exists()
    with pytest.raises(ValueError, match="unknown environment id 'CartPol-v1'"):
        ppo.main([*TINY, *QUIET, "--eval-env", "CartPol-v1", "--run-dir", str(tmp_path)])


@pytest.mark.parametrize("deterministic", ["true", "false"])
def test_eval_only_scores_a_checkpoint_exactly_as_the_training_run_did(
    ppo, tmp_path, deterministic
):
    train = [*TINY, *QUIET, "--total-frames", "256", "--eval-every", "0", "--normalize-obs", "true"]
    train += ["--eval-deterministic", deterministic, "--hidden", "32", "--eval-episodes", "3"]
    summary = ppo.main([*train, "--run-dir", str(tmp_path / "train")])
    last = str(tmp_path / "train" / "checkpoints" / "last.pt")
    # no flags of the run: networks (--hidden 32, --normalize-obs) and evaluation settings
    # come from the checkpoint's stored config, launch settings from this command line
    result = ppo.main(
        [
            "--progress",
            "false",
            "--init-from",
            last,
            "--eval-only",
            "--run-dir",
            str(tmp_path / "eval"),
        ]
    )
    # the same networks and observation statistics, the same evaluation seeds: the same returns
    assert result["eval_return_mean"] == summary["eval_return_mean"]
    assert result["trained_frames"] == 256 and len(result["returns"]) == 3
    on_disk = json.loads((tmp_path / "eval" / "evaluation.json").read_text())
    assert on_disk["returns"] == result["returns"]
    assert on_disk["deterministic"] is (deterministic == "true")
    assert (tmp_path / "eval" / "evaluation.json").is_file()  # not the training run's directory
    # flags typed on the command line still win over the checkpoint's settings
    more = ppo.main(
        ["--progress", "false", "--init-from", last, "--eval-only", "--eval-episodes", "5"]
        + ["--run-dir", str(tmp_path / "eval5")]
    )
    assert len(more["returns"]) == 5
    assert not (tmp_path / "eval" / "checkpoints").exists()  # nothing trained, nothing saved
    assert not (tmp_path / "eval" / "metrics.csv").exists()

    # a config whose networks the checkpoint lacks is named, not silently half-loaded
    with pytest.raises(CheckpointError, match="does not fit module 'actor'.*use matching flags"):
        plain = str(tmp_path / "plain" / "checkpoints" / "last.pt")
        ppo.main([*TINY, *QUIET, "--total-frames", "64", "--run-dir", str(tmp_path / "plain")])
        ppo.main([*train, "--init-from", plain, "--eval-only", "--run-dir", str(tmp_path / "x")])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--eval-only needs --init-from PATH"),
        (["--init-from", "x.pt", "--resume", "x.pt"], "not --resume"),
        (["--init-from", "x.pt", "--devices", "2"], "--eval-only runs in one process"),
        (["--init-from", "x.pt", "--num-nodes", "2"], "--eval-only runs in one process"),
    ],
)
def test_eval_only_bad_flags_are_named(ppo, tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit):
        ppo.main([*TINY, *QUIET, "--eval-only", *extra, "--run-dir", str(tmp_path)])
    assert message in capsys.readouterr().err


def test_ctrl_c_during_eval_only_says_nothing_was_trained(ppo, tmp_path, capsys, monkeypatch):
    from rlkit.training import evaluation
    from rlkit.training.cli import cli

    ppo.main([*TINY, *QUIET, "--total-frames", "64", "--run-dir", str(tmp_path / "train")])
    last = str(tmp_path / "train" / "checkpoints" / "last.pt")

    def ctrl_c(self, policy):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluation.Evaluator, "returns", ctrl_c)
    argv = ["--progress", "false", "--init-from", last, "--eval-only"]
    with pytest.raises(SystemExit) as stop:
        cli(lambda _: ppo.main([*argv, "--run-dir", str(tmp_path / "eval")]))
    assert stop.value.code == 130
    err = capsys.readouterr().err
    assert "interrupted: evaluation stopped (--eval-only trains nothing" in err
    assert "checkpoint written" not in err
    assert not (tmp_path / "eval" / "evaluation.json").exists()


def test_eval_only_missing_checkpoint_is_named(ppo, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        ppo.main([*TINY, *QUIET, "--eval-only", "--init-from", "no.pt", "--run-dir", str(tmp_path)])


# --------------------------------------------------------------------------- per-rank resume
@pytest.fixture
def rank_files(ppo, tmp_path):
    """Rank 0's and rank 1's files of one save of a two-rank run (made from a one-process
    run's checkpoint), and a way to build a fresh learner as rank 1 would."""
    from rlkit.envs import get_reward_norm, make_env

    flags = [*TINY, "--normalize-reward", "true"]
    ppo.main([*flags, *QUIET, "--total-frames", "128", "--run-dir", str(tmp_path / "run")])
    zero = tmp_path / "run" / "checkpoints" / "last.pt"
    one = zero.parent / "rank1" / "last.pt"
    payload = ckpt.load(zero)
    payload["world_size"] = 2
    ckpt.atomic_save(payload, zero)
    mine = ckpt.load(zero)  # rank 1's own reward statistics (its own envs) differ
    counts = [k for k in mine["modules"]["reward_norm"] if k.endswith("count")]
    assert counts
    for k in counts:
        mine["modules"]["reward_norm"][k] = torch.full_like(mine["modules"]["reward_norm"][k], 7)
    ckpt.atomic_save(mine, one)

    def build():
        cfg = ppo.parse_config(ppo.PPOConfig, flags)
        env = make_env(cfg.env, num_envs=cfg.num_envs, seed=1000, **cfg.env_options())
        return ppo.build(cfg, env), {"reward_norm": get_reward_norm(env)}

    return zero, one, counts, build


def _resume_as_rank1(path, build):
    from types import SimpleNamespace

    from rlkit.training.engine import Counters, _resume_rank

    learner, env_modules = build()
    counters = Counters()
    fabric = SimpleNamespace(global_rank=1, world_size=2)  # no collective is called
    payload = _resume_rank(fabric, path, learner, counters, env_modules)
    return payload, learner, env_modules["reward_norm"].state_dict(), counters


def test_rank_resumes_from_its_own_file_of_the_same_save(rank_files):
    zero, one, counts, build = rank_files
    payload, _, stats, counters = _resume_as_rank1(zero, build)
    assert payload is not None and payload["save_id"] == ckpt.load(zero)["save_id"]
    assert all(float(stats[k]) == 7 for k in counts)  # its own, not rank 0's
    assert counters.frames == 128


@pytest.mark.parametrize("damage", ["other save", "other world size", "corrupt", "missing"])
def test_rank_falls_back_to_rank_zeros_file_when_its_own_does_not_belong(rank_files, damage):
    zero, one, counts, build = rank_files
    if damage == "missing":
        one.unlink()
    elif damage == "corrupt":
        one.write_bytes(one.read_bytes()[:100])
    else:
        # e.g. left by an earlier run of this directory with its parameters (shifted here)
        mine = ckpt.load(one)
        if damage == "other save":
            mine["save_id"] = "an-earlier-run:128"
        else:
            mine["world_size"] = 3
        mine["modules"]["actor"] = {k: v + 1 for k, v in mine["modules"]["actor"].items()}
        ckpt.atomic_save(mine, one)
    if damage == "missing":  # nothing to warn about (e.g. a one-process run resumed on two)
        payload, learner, stats, _ = _resume_as_rank1(zero, build)
    else:
        with pytest.warns(UserWarning, match="rank 1: .* does not match"):
            payload, learner, stats, _ = _resume_as_rank1(zero, build)
    assert payload is None  # the caller seeds this rank's RNG afresh
    reference = ckpt.load(zero)["modules"]
    assert all(float(stats[k]) == float(reference["reward_norm"][k]) for k in counts)
    actor = learner.modules()["actor"].state_dict()
    assert all(torch.equal(actor[k], v) for k, v in reference["actor"].items())
