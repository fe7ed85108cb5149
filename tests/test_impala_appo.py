"""Worker collection (sync and async), policy versions and lag, the IMPALA / APPO recipes."""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import pytest
import torch

from rlkit import keys
from rlkit.data.async_collect import POLICY_LAG, POLICY_VERSION, WorkerCollector
from rlkit.data.collector import make_collector
from rlkit.envs import make_env
from rlkit.modules import make_actor, make_value
from rlkit.objectives import IMPALALoss
from rlkit.training import checkpoint as ckpt
from tests.test_engine import QUIET, ROOT, load_recipe

TINY = ["--num-envs", "4", "--rollout-steps", "16", "--minibatch-size", "32", "--epochs", "2"]


def nets(seed=0):
    torch.manual_seed(seed)
    env = make_env("CartPole-v1", num_envs=1, seed=0)
    actor = make_actor(env.observation_spec, env.action_spec, hidden=(16,))
    critic = make_value(env.observation_spec, hidden=(16,))
    env.close()
    return actor, critic


_PERTURB = torch.Generator().manual_seed(123)


def perturb(module, scale=0.2):
    """A stand-in learner update (own generator: the global one drives action sampling)."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=_PERTURB))


def test_sync_mode_equals_the_in_process_collector_and_has_no_lag():
    actor, _ = nets()
    collector = WorkerCollector(
        env_id="CartPole-v1", policy=actor, num_envs=4, frames_per_batch=64, sync=True, seed=5
    )
    # reference: the same env, seeds and weights, collected in this process
    reference_policy = copy.deepcopy(actor)
    torch.manual_seed(5)
    env = make_env("CartPole-v1", num_envs=4, seed=5)
    reference = iter(make_collector(env, reference_policy, frames_per_batch=64))
    try:
        for step in range(3):
            batch, expected = collector.next_batch(), next(reference)
            for key in (keys.OBSERVATION, keys.ACTION, keys.ACTION_LOG_PROB, keys.REWARD):
                torch.testing.assert_close(batch[key], expected[key])
            assert (batch[POLICY_VERSION] == step).all() and (batch[POLICY_LAG] == 0).all()
            perturb(actor)
            reference_policy.load_state_dict(actor.state_dict())
            collector.update_policy_weights_()
        assert collector.mean_lag == 0.0
    finally:
        collector.shutdown()
        env.close()


def test_async_batches_carry_the_acting_version_and_rho_uses_it():
    from rlkit.modules import Normalize
    from rlkit.modules.normalization import RunningMeanStd

    # an actor with an observation normaliser: its statistics must travel with the weights
    env = make_env("CartPole-v1", num_envs=1, seed=0)
    stats = RunningMeanStd((4,))
    torch.manual_seed(0)
    actor = make_actor(
        env.observation_spec,
        env.action_spec,
        hidden=(16,),
        backbone=Normalize(stats),
        in_features=4,
    )
    critic = make_value(env.observation_spec, hidden=(16,))
    env.close()
    collector = WorkerCollector(
        env_id="CartPole-v1", policy=actor, num_envs=4, frames_per_batch=64, seed=1
    )
    snapshots = {0: copy.deepcopy(actor)}
    loss = IMPALALoss(actor, critic, gamma=0.99)
    lags = []
    try:
        for _ in range(6):
            batch = collector.next_batch()
            versions = batch[POLICY_VERSION][:, 0]
            assert (batch[POLICY_VERSION] == versions[:, None]).all()  # one version per rollout
            lag = collector.version - versions
            assert (batch[POLICY_LAG] == lag[:, None]).all()
            lags += lag.tolist()
            for row, v in enumerate(versions.tolist()):
                mu = snapshots[v]  # the weights published as version v
                with torch.no_grad():
                    log_mu = mu.get_dist(batch[row]).log_prob(batch[row][keys.ACTION])
                    log_pi = actor.get_dist(batch[row]).log_prob(batch[row][keys.ACTION])
                torch.testing.assert_close(batch[row][keys.ACTION_LOG_PROB], log_mu)
                rho = loss.vtrace(batch)["rho"][row]
                torch.testing.assert_close(rho, (log_pi - log_mu).exp())
            perturb(actor)  # a learner update
            stats.update(torch.randn(64, 4, generator=_PERTURB) * 3 + 1)  # central statistics
            collector.update_policy_weights_()
            snapshots[collector.version] = copy.deepcopy(actor)
    finally:
        collector.shutdown()
    assert max(lags) >= 1  # stale data was really produced
    assert collector.mean_lag == pytest.approx(sum(lags) / len(lags))


def test_worker_collector_rejects_uneven_splits():
    actor, _ = nets()
    with pytest.raises(ValueError, match="not divisible by num_workers"):
        WorkerCollector(
            env_id="CartPole-v1", policy=actor, num_envs=3, frames_per_batch=48, num_workers=2
        )


def test_appo_checkpoint_keeps_target_network_and_normaliser_and_resumes(tmp_path):
    appo = load_recipe("appo")
    args = [*TINY, *QUIET, "--normalize-obs", "true", "--eval-every", "0"]
    args += ["--tau", "0.5", "--run-dir", str(tmp_path / "run")]
    first = appo.main([*args, "--total-frames", "256"])
    assert first["frames"] == 256
    payload = ckpt.load(tmp_path / "run" / "checkpoints" / "last.pt")
    target = payload["modules"]["target_actor"]
    assert int(target["step_count"]) == 4  # one Polyak step per batch
    stats = payload["modules"]["obs_norm"]
    assert float(stats["count"]) > 256 - 1  # every observation of the 4 batches
    # the target's copy of the normaliser statistics was synced with the learner's
    norm_keys = [k for k in target if k.endswith("mean") and "module" in k]
    assert norm_keys and torch.equal(target[norm_keys[0]], stats["mean"])
    second = appo.main([*args, "--total-frames", "512", "--resume", "last"])
    assert second["frames"] == 512
    payload = ckpt.load(tmp_path / "run" / "checkpoints" / "last.pt")
    assert int(payload["modules"]["target_actor"]["step_count"]) == 8  # schedule continued
    assert float(payload["modules"]["obs_norm"]["count"]) > 512 - 1
    columns = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"policy_lag", "rho_mean", "approx_kl"} <= set(columns)


def test_impala_runs_in_sync_mode_and_logs_zero_lag(tmp_path):
    impala = load_recipe("impala")
    run_dir = tmp_path / "impala"
    summary = impala.main(
        [
            *TINY,
            *QUIET,
            "--total-frames",
            "256",
            "--sync-collect",
            "true",
            "--run-dir",
            str(run_dir),
        ]
        + ["--epochs", "1", "--minibatch-size", "64"]  # one gradient step per batch
    )
    assert summary["frames"] == 256
    import csv

    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert rows and all(float(r["policy_lag"]) == 0.0 for r in rows if r.get("policy_lag"))
    # on-policy data, scored before the batch's only step: rho = pi / mu = 1
    assert all(float(r["rho_mean"]) == pytest.approx(1.0) for r in rows if r.get("rho_mean"))


def test_impala_adapts_its_learning_rate_to_the_kl_from_the_behaviour_policy(tmp_path):
    """IMPALA refused --lr-schedule kl (its loss measured no KL). Each batch's rate follows
    the rule written out here from the KL logged for the batch before (target 0.01, band x2,
    factor 1.5), and the rate both rises and falls within the run."""
    import csv

    impala = load_recipe("impala")
    run_dir = tmp_path / "impala"
    flags = ["--lr", "1e-3", "--lr-schedule", "kl", "--kl-target", "0.01", "--log-every", "1"]
    impala.main(
        [*TINY, *QUIET, *flags, "--total-frames", "1280", "--sync-collect", "true"]
        + ["--epochs", "4", "--run-dir", str(run_dir)]
    )
    rows = [r for r in csv.DictReader((run_dir / "metrics.csv").open()) if r.get("lr")]
    lrs, kls = [float(r["lr"]) for r in rows], [float(r["approx_kl"]) for r in rows]
    assert len(rows) == 1280 // 64 and lrs[0] == pytest.approx(1e-3)
    expected = 1e-3
    for lr, kl, prev_kl in zip(lrs[1:], kls[1:], kls[:-1]):
        if prev_kl > 0.02:
            expected /= 1.5
        elif prev_kl < 0.005:
            expected *= 1.5
        assert lr == pytest.approx(expected, rel=1e-6)
        assert kl > 0  # four epochs: the policy moves away from the one that acted
    assert any(b > a for a, b in zip(lrs, lrs[1:])) and any(b < a for a, b in zip(lrs, lrs[1:]))


@pytest.mark.parametrize(
    "recipe,flag,value,message",
    [
        ("impala", "--rho-clip", "0", "--rho-clip must be a number > 0"),
        ("impala", "--c-clip", "-1", "--c-clip must be a number > 0"),
        ("appo", "--vtrace-lambda", "1.5", r"--vtrace-lambda must be in \[0, 1\]"),
        ("appo", "--tau", "0", r"--tau must be in \(0, 1\]"),
        ("appo", "--tau", "1.1", r"--tau must be in \(0, 1\]"),
        ("appo", "--workers", "3", "--workers must be >= 1 and divide --num-envs"),
    ],
)
def test_bad_flags_are_named(recipe, flag, value, message, capsys):
    module = load_recipe(recipe)
    with pytest.raises(SystemExit) as exit_info:  # argparse's one-line error, status 2
        module.main([flag, value])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.slow
@pytest.mark.ddp_jobs("appo")  # a shared launch: tests/ddp_shared.py (2,048 frames)
def test_appo_ddp_keeps_parameters_identical(ddp_jobs):
    run = ddp_jobs["appo"]
    summary = run.summary()
    assert summary["world_size"] == 2 and summary["frames"] == 2048
    assert summary["rank_param_max_diff"] == 0.0
    payload = ckpt.load(run.dir / "checkpoints" / "last.pt")
    assert int(payload["modules"]["target_actor"]["step_count"]) == 4


@pytest.mark.slow
@pytest.mark.ddp_jobs("ppo-target-kl")  # a shared launch: tests/ddp_shared.py (its flags)
def test_target_kl_stops_every_ddp_rank_at_the_same_step(ddp_jobs):
    """--target-kl on two ranks: each rank's minibatch has its own KL, so the stop reads the
    ranks' mean; a rank stopping alone would leave the other waiting in the gradient
    all-reduce. PPO, a tight target (--target-kl 1e-4; 4 envs x 64 steps, 4 epochs of
    minibatches of 64): the run ends, every update stops early, and the ranks' parameters
    are identical."""
    import csv

    run = ddp_jobs["ppo-target-kl"]
    summary = run.summary()
    assert summary["world_size"] == 2 and summary["rank_param_max_diff"] == 0.0
    with open(run.dir / "metrics.csv") as f:
        steps = [float(r["grad_steps"]) for r in csv.DictReader(f) if r.get("grad_steps")]
    assert steps and all(1 <= n < 16 for n in steps), steps  # of 4 epochs x 4 minibatches


_ORPHAN_SCRIPT = """
import sys, time
from tests.test_impala_appo import nets
from rlkit.data.async_collect import WorkerCollector

if __name__ == "__main__":
    actor, _ = nets()
    collector = WorkerCollector(
        env_id="CartPole-v1", policy=actor, num_envs=4, frames_per_batch=64,
        num_workers=2, sync=sys.argv[1] == "sync",
    )
    collector.next_batch()
    print(" ".join(str(p) for p in collector.pids), flush=True)
    time.sleep(60)
"""


@pytest.mark.slow  # a learner process and its workers
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_workers_exit_when_the_learner_is_killed(mode):
    """A SIGKILLed learner never runs shutdown(): its workers notice and exit on their own."""
    import os
    import time

    proc = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT, mode], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    proc.kill()
    proc.wait()

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # a zombie (exited, not yet reaped by the forkserver) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"

    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if alive(p)]
    for p in left:
        os.kill(p, 9)
    assert not left, f"workers {left} outlived their learner"


@pytest.mark.parametrize("recipe", ["impala", "appo"])
def test_adv_mode_flag_reaches_vtrace(recipe):
    """--adv-mode (evorl's adv_mode): the default is the paper's form; acme reaches the
    IMPALA loss / the APPO estimator; anything else is refused by the parser."""
    from rlkit.training import parse_config

    module = load_recipe(recipe)
    algo = __import__(f"rlkit.algorithms.{recipe}", fromlist=["build"])
    config = algo.IMPALAConfig if recipe == "impala" else algo.APPOConfig
    env = make_env("CartPole-v1", num_envs=1, seed=0)
    try:
        for argv, mode in (([], "official"), (["--adv-mode", "acme"], "acme")):
            learner = algo.build(parse_config(config, argv), env)
            part = learner.loss if recipe == "impala" else learner.estimator
            assert part.adv_mode == mode
    finally:
        env.close()
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--adv-mode", "rllib"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_an_actor_built_on_the_learners_envs_acts_in_a_workers_share(env_id):
    """Worker processes split --num-envs: an actor built on the learner's 4 envs (its spec
    batched [4, ...]) acts in a worker's 2. This crashed every continuous recipe with
    --workers 2 (APPO's Pendulum preset) as a spec mismatch; a real mismatch still fails."""
    from rlkit.modules import ActionSpecMismatchError, check_env_compat

    learner_env, worker_env = make_env(env_id, num_envs=4), make_env(env_id, num_envs=2)
    actor = make_actor(learner_env.observation_spec, learner_env.action_spec)
    check_env_compat(actor, worker_env)  # no error
    other = make_env(
        "MountainCarContinuous-v0" if env_id == "Pendulum-v1" else "Acrobot-v1", num_envs=4
    )
    wrong = make_actor(learner_env.observation_spec, other.action_spec)
    with pytest.raises(ActionSpecMismatchError):
        check_env_compat(wrong, worker_env)
    for env in (learner_env, worker_env, other):
        env.close()


def test_appo_with_two_workers_trains_on_continuous_actions(tmp_path):
    appo = load_recipe("appo")
    args = [*TINY, *QUIET, "--env", "Pendulum-v1", "--workers", "2", "--eval-every", "0"]
    summary = appo.main([*args, "--total-frames", "256", "--run-dir", str(tmp_path / "run")])
    assert summary["frames"] == 256


@pytest.mark.parametrize("sync", [True, False])
def test_env_ids_follow_each_env_across_batches(sync):
    """keys.ENV_ID names the env behind every row: a row's first observation is where that
    env's previous row ended (unless the episode ended there), whatever order the asynchronous
    workers' rollouts arrive in."""
    from rlkit.data.async_collect import ENV_ID

    actor, _ = nets()
    collector = WorkerCollector(
        env_id="CartPole-v1", policy=actor, num_envs=4, frames_per_batch=32, num_workers=2,
        sync=sync, seed=3,
    )  # fmt: skip
    last: dict[int, tuple[torch.Tensor, bool]] = {}
    try:
        # at least 6 batches, and until every env has shown up: on a loaded machine one
        # asynchronous worker can deliver several batches before the other's first one
        for n in range(100):
            if n >= 6 and len(last) == 4:
                break
            batch = collector.next_batch()
            ids = batch[ENV_ID]
            assert (ids == ids[:, :1]).all()  # one env per row
            if sync:
                assert ids[:, 0].tolist() == [0, 1, 2, 3]
            for row, env in enumerate(ids[:, 0].tolist()):
                if env in last and not last[env][1]:
                    torch.testing.assert_close(batch[row, 0][keys.OBSERVATION], last[env][0])
                step = batch[row, -1]
                last[env] = (step[keys.NEXT_OBSERVATION], bool(step[keys.DONE]))
            collector.update_policy_weights_()
        assert sorted(last) == [0, 1, 2, 3]
    finally:
        collector.shutdown()
