"""The PPG learner and recipe: phase cycle, auxiliary phase, options, resume mid-cycle,
IMPALA-CNN preset, DDP. References are computed here (KL by hand, saved parameters)."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Composite
from torchrl.data import Categorical as CategoricalSpec

from rlkit import keys
from rlkit.algorithms.ppg import PPGConfig, build_ppg_networks, record_pre_aux
from rlkit.data.collector import make_collector
from rlkit.envs import make_env
from rlkit.objectives import PPGAuxLoss
from rlkit.objectives.ppg import PRE_AUX
from rlkit.training import checkpoint as ckpt
from rlkit.training.engine import Context, Counters

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--num-envs",
    "4",
    "--rollout-steps",
    "16",
    "--minibatch-size",
    "32",
    "--epochs",
    "2",
    "--n-pi",
    "2",
    "--aux-epochs",
    "2",
    "--aux-minibatches",
    "2",
]
QUIET = ["--progress", "false", "--eval-episodes", "2"]


def load_recipe():
    from rlkit.algorithms import ppg

    return ppg


@pytest.fixture(scope="module")
def recipe():
    return load_recipe()


@pytest.fixture(scope="module")
def env():
    e = make_env("CartPole-v1", num_envs=4, seed=0)
    yield e
    e.close()


def make_learner(recipe, env, *flags: str):
    cfg = recipe.parse_config(recipe.PPGConfig, [*TINY, *flags])
    torch.manual_seed(0)
    return recipe.build(cfg, env)


@pytest.fixture(scope="module")
def batches(recipe, env):
    """Four batches [4, 16] collected by the (seed-0) initial policy, shared by the tests."""
    learner = make_learner(recipe, env)
    collector = make_collector(env, learner.collect_policy(), frames_per_batch=64)
    out = []
    for batch in collector:
        out.append(batch.clone())
        if len(out) == 4:
            break
    collector.shutdown()
    return out


def context(seed: int = 5) -> Context:
    fabric = SimpleNamespace(world_size=1, device=torch.device("cpu"))
    ctx = Context(fabric, total_frames=10_000, counters=Counters())
    ctx.generator.manual_seed(seed)
    return ctx


def run(learner, batches, ctx=None):
    ctx = ctx or context()
    return [learner.update(b.clone(), ctx) for b in batches]


PROBE = torch.linspace(-1, 1, 4 * 7).reshape(7, 4)


def outputs(learner) -> torch.Tensor:
    """Logits, V and V_aux on fixed observations: what a flag must change."""
    td = TensorDict({keys.OBSERVATION: PROBE}, [7])
    with torch.no_grad():
        logits = learner.actor.get_dist_params(td.clone()).get(keys.LOGITS)
        v = learner.critic(td.clone()).get(keys.STATE_VALUE)
        aux = learner.aux_critic(td.clone()).get("aux_state_value")
    return torch.cat([logits, v, aux], -1)


def test_aux_phase_runs_every_n_pi_batches(recipe, env, batches):
    learner = make_learner(recipe, env)
    metrics = run(learner, batches)
    has_aux = ["aux/loss_distill" in m for m in metrics]
    assert has_aux == [False, True, False, True]
    assert [m["phase_iteration"] for m in metrics] == [1.0, 0.0, 1.0, 0.0]
    assert learner.buffer == []
    for name in ("loss_aux_value", "loss_distill", "loss_value"):
        assert f"aux/{name}" in metrics[1] and f"aux/unscaled_{name}" in metrics[1]


def _hand_kl(old_logits: torch.Tensor, new_logits: torch.Tensor) -> float:
    p_old = old_logits.softmax(-1)
    return float((p_old * (old_logits.log_softmax(-1) - new_logits.log_softmax(-1))).sum(-1).mean())


def _aux_phase_effect(recipe, env, batches, *flags):
    learner = make_learner(recipe, env, "--n-pi", "3", "--aux-epochs", "4", *flags)
    run(learner, batches[:2])
    data = torch.cat(learner.buffer, 0).reshape(-1)
    before = {
        "logits": learner.actor.get_dist_params(data.clone()).get(keys.LOGITS).detach(),
        "critic": [p.detach().clone() for p in learner.critic.parameters()],
        "aux": [p.detach().clone() for p in learner.aux_critic.module[-1].parameters()],
    }
    result = learner.aux_phase(context(), lr=learner.lr_schedule.lr)
    after = learner.actor.get_dist_params(data.clone()).get(keys.LOGITS).detach()
    return learner, before, after, result


def test_aux_phase_trains_the_value_heads_and_holds_the_policy_within_its_reported_kl(
    recipe, env, batches
):
    learner, before, after, result = _aux_phase_effect(recipe, env, batches)
    moved = lambda old, mod: max(float((a - b.detach()).abs().max()) for a, b in zip(old, mod))  # noqa: E731
    assert moved(before["critic"], learner.critic.parameters()) > 1e-3
    assert moved(before["aux"], learner.aux_critic.module[-1].parameters()) > 1e-3
    kl = _hand_kl(before["logits"], after)
    assert abs(kl - result["aux/policy_kl_after"]) < 1e-6
    assert kl < 0.01
    # the distillation term is what holds it: without it the policy drifts further
    _, before0, after0, _ = _aux_phase_effect(recipe, env, batches, "--beta-clone", "0")
    assert _hand_kl(before0["logits"], after0) > 3 * kl


FLAGS = [
    ["--arch", "shared"],
    ["--aux-optimizer", "shared"],
    ["--aux-lr", "3e-3"],
    ["--value-clip", "0.05"],
    ["--init-fn", "xavier_uniform"],
    ["--init-fn", "xavier_normal"],
    ["--full-batch-advantage-norm", "true"],
    ["--beta-clone", "0"],
    ["--aux-value-coef", "0"],
    ["--aux-true-value-coef", "0"],
    ["--value-epochs", "4"],
    ["--aux-epochs", "0"],
    ["--aux-minibatches", "4"],
    ["--n-pi", "1"],
]


@pytest.fixture(scope="module")
def baseline(recipe, env, batches):
    return outputs(_trained(recipe, env, batches))


def _trained(recipe, env, batches, *flags):
    learner = make_learner(recipe, env, *flags)
    run(learner, batches[:2])
    return learner


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: " ".join(f))
def test_every_option_changes_the_output(recipe, env, batches, baseline, flags):
    changed = outputs(_trained(recipe, env, batches, *flags))
    assert (changed - baseline).abs().max() > 1e-4


def test_gradient_accumulation_equals_one_backward_of_the_minibatch(recipe, env, batches):
    # not a flag that should change the result: it trades memory for backward calls
    one = outputs(_trained(recipe, env, batches))
    learner = make_learner(recipe, env, "--aux-grad-accum", "3")
    calls = []
    original = learner.aux_loss.forward
    learner.aux_loss.forward = lambda td: calls.append(td.shape[0]) or original(td)
    run(learner, batches[:2])
    assert calls and max(calls) <= 2  # 4 rollouts per minibatch, in chunks of <= 2
    assert torch.allclose(outputs(learner), one, atol=1e-5)


def _snapshot(learner) -> bytes:
    buf = io.BytesIO()
    torch.save(
        {
            "modules": {k: m.state_dict() for k, m in learner.modules().items()},
            "optimizers": {k: o.state_dict() for k, o in learner.optimizers().items()},
            "learner": learner.state_dict(),
        },
        buf,
    )
    return buf.getvalue()


def _restore(learner, blob: bytes, *, learner_state: bool = True) -> None:
    payload = torch.load(io.BytesIO(blob), weights_only=True)
    for k, m in learner.modules().items():
        m.load_state_dict(payload["modules"][k])
    for k, o in learner.optimizers().items():
        o.load_state_dict(payload["optimizers"][k])
    if learner_state:
        learner.load_state_dict(payload["learner"])


def test_state_dict_mid_cycle_resumes_exactly(recipe, env, batches):
    a = make_learner(recipe, env)
    run(a, batches[:3])  # n_pi = 2: one aux phase done, one batch buffered
    assert a.phase_iteration == 1 and len(a.buffer) == 1
    blob = _snapshot(a)
    b = make_learner(recipe, env, "--seed", "1")
    torch.manual_seed(1)
    for m in b.modules().values():  # a different start, overwritten by the restore
        for p in m.parameters():
            p.data.normal_()
    _restore(b, blob)
    run(a, batches[3:], context(9))
    run(b, batches[3:], context(9))
    for (name, pa), pb in zip(a.nets.named_parameters(), b.nets.parameters()):
        assert torch.equal(pa, pb), name
    # without the learner state the aux phase would be skipped: the test can tell
    c = make_learner(recipe, env)
    _restore(c, blob, learner_state=False)
    run(c, batches[3:], context(9))
    assert not torch.equal(outputs(c), outputs(a))


def test_inconsistent_learner_state_is_named(recipe, env):
    learner = make_learner(recipe, env)
    with pytest.raises(ValueError, match="inconsistent"):
        learner.load_state_dict({"phase_iteration": 1})


def test_recipe_resumes_in_the_middle_of_a_phase_cycle(recipe, tmp_path):
    run_dir = tmp_path / "run"
    common = [*TINY, *QUIET, "--eval-every", "0", "--run-dir", str(run_dir)]
    recipe.main([*common, "--total-frames", "192", "--checkpoint-every", "64"])
    payload = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert payload["learner"]["phase_iteration"] == 1
    assert payload["learner"]["buffer"][keys.OBSERVATION].shape == (1, 4, 16, 4)
    torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    summary = recipe.main([*common, "--total-frames", "384", "--resume", "last"])
    assert summary["frames"] == 384
    rows = [line.split(",") for line in (run_dir / "metrics.csv").read_text().splitlines()]
    header, body = rows[0], rows[1:]
    col = header.index("aux/loss_distill")
    aux_frames = [int(r[0]) for r in body if len(r) > col and r[col] != ""]
    assert aux_frames == [128, 256, 384]


def _image_env(shape, n_envs=2):
    obs = Bounded(0, 255, shape=(n_envs, *shape), dtype=torch.uint8)
    return SimpleNamespace(
        observation_spec=Composite(observation=obs, shape=(n_envs,)),
        action_spec=CategoricalSpec(5, shape=(n_envs,)),
        batch_size=torch.Size([n_envs]),
    )


@pytest.mark.parametrize("shape", [(64, 64, 3), (3, 64, 64)], ids=["HWC", "CHW"])
def test_impala_preset_runs_on_image_observations(shape):
    cfg = PPGConfig(encoder="impala", num_envs=2, minibatch_size=32, n_pi=2, hidden=(32,))
    nets = build_ppg_networks(cfg, _image_env(shape))
    obs = torch.randint(0, 256, (2, 3, *shape), dtype=torch.uint8)
    td = nets.actor(TensorDict({keys.OBSERVATION: obs}, [2, 3]))
    assert td.get(keys.ACTION).shape == (2, 3) and td.get(keys.LOGITS).shape == (2, 3, 5)
    td.set(keys.VALUE_TARGET, torch.randn(2, 3, 1))
    record_pre_aux(nets.actor, nets.critic, td)
    out = PPGAuxLoss(nets.actor, nets.critic, nets.aux_critic)(td)
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    assert float(out["loss_distill"].detach()) == 0.0
    assert td.get((PRE_AUX, keys.STATE_VALUE)).shape == (2, 3, 1)


def test_encoder_and_config_mismatches_are_named():
    with pytest.raises(ValueError, match="--encoder impala needs image observations"):
        build_ppg_networks(
            PPGConfig(encoder="impala", num_envs=2, minibatch_size=32, n_pi=2),
            SimpleNamespace(
                observation_spec=Composite(observation=Bounded(-1, 1, shape=(2, 4)), shape=(2,)),
                action_spec=CategoricalSpec(2, shape=(2,)),
                batch_size=torch.Size([2]),
            ),
        )
    with pytest.raises(ValueError, match="--normalize-obs applies to vector observations"):
        build_ppg_networks(
            PPGConfig(encoder="impala", normalize_obs=True, num_envs=2, minibatch_size=32, n_pi=2),
            _image_env((64, 64, 3)),
        )
    with pytest.raises(ValueError, match="--aux-minibatches 9 exceeds"):
        PPGConfig(num_envs=4, n_pi=2, aux_minibatches=9, minibatch_size=32)
    with pytest.raises(ValueError, match="--aux-grad-accum 5 exceeds"):
        PPGConfig(num_envs=4, n_pi=2, aux_minibatches=2, aux_grad_accum=5, minibatch_size=32)


@pytest.mark.slow
@pytest.mark.ddp_jobs("ppg")  # a shared launch: tests/ddp_shared.py (TINY, QUIET, 512 frames)
def test_ddp_two_processes_train_and_agree(ddp_jobs):
    run = ddp_jobs["ppg"]
    summary = run.summary()
    assert summary["world_size"] == 2 and summary["frames"] == 512
    assert summary["rank_param_max_diff"] == 0.0
    rows = (run.dir / "metrics.csv").read_text().splitlines()
    assert "aux/loss_distill" in rows[0]  # 4 batches per rank, n_pi 2: two aux phases ran
