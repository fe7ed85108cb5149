"""``--compile``: K updates through the compiled losses against the same K updates run eagerly.

Two learners are built from the same seed; both update on the same batches (and, off-policy,
draw the same replay samples), one with ``Context(compile=True)``. Their parameters must agree
within 1e-5 after every update, while the updates themselves move the parameters by far more.
The compiled learner's losses must have run as compiled graphs (dynamo counted at least one
per loss; the eager copy's are not compiled), and they must stay compiled: an annealed clip
range may not recompile at every update.
"""

from __future__ import annotations

import copy
import os
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlkit.data.collector import make_collector
from rlkit.envs import make_env
from rlkit.training import parse_config
from rlkit.training.engine import Context, Counters
from tests.test_engine import load_recipe

_CONFIGS = {
    "ppo": "PPOConfig",
    "impala": "IMPALAConfig",
    "appo": "APPOConfig",
    "ppg": "PPGConfig",
    "dqn": "DQNConfig",
    "sac": "SACConfig",
}


def _ctx(*, compile: bool, total_frames: int) -> Context:
    fabric = SimpleNamespace(world_size=1, device=torch.device("cpu"))
    return Context(fabric, total_frames, Counters(), compile=compile)


def _params(learner) -> dict[str, torch.Tensor]:
    return {
        f"{name}.{k}": v.detach().clone()
        for name, module in learner.modules().items()
        for k, v in module.state_dict().items()
        if v.is_floating_point()
    }


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def _build(algo: str, argv: list[str]):
    recipe = load_recipe(algo)
    cfg = parse_config(getattr(recipe, _CONFIGS[algo]), argv, presets=recipe.PRESETS)
    torch.manual_seed(0)
    env = make_env(cfg.env, num_envs=cfg.num_envs, seed=0)
    return cfg, env, recipe.build(cfg, env)


def _batches(cfg, env, learner, n: int) -> list:
    torch.manual_seed(1)
    frames = learner.frames_per_batch
    collector = make_collector(env, learner.collect_policy(), frames_per_batch=frames)
    it = iter(collector)
    out = [next(it).clone() for _ in range(n)]
    collector.shutdown()
    return out


def _update_both(eager, compiled, batches, total_frames: int) -> tuple[Context, Context]:
    """Update both learners on each batch; after each, parameters agree within 1e-5."""
    start = _params(eager)
    e_ctx = _ctx(compile=False, total_frames=total_frames)
    c_ctx = _ctx(compile=True, total_frames=total_frames)
    for i, batch in enumerate(batches):
        for learner, ctx in ((eager, e_ctx), (compiled, c_ctx)):
            torch.manual_seed(100 + i)  # the same draws (and replay samples) for both
            np.random.seed(100 + i)
            learner.update(batch.clone(), ctx)
            ctx.counters.frames += batch.numel()
        diff = _max_diff(_params(eager), _params(compiled))
        assert diff < 1e-5, f"update {i}: compiled and eager parameters differ by {diff:.3g}"
    moved = _max_diff(start, _params(eager))
    assert moved > 1e-3, moved  # the updates did something the comparison can see
    return e_ctx, c_ctx


ENTROPY_SCHEDULE = ["--num-envs", "4", "--rollout-steps", "32", "--minibatch-size", "32",
                    "--entropy-coef", "0.01", "--entropy-coef-final", "0", "--total-frames",
                    "4096"]  # fmt: skip

ON_POLICY = {
    # CartPole's preset anneals the clip range, and the entropy coefficient is annealed too:
    # the tensor-hyperparameter path
    "ppo": ENTROPY_SCHEDULE,
    # V-trace inside the loss, whole-trajectory minibatches
    "impala": ["--num-envs", "4", "--rollout-steps", "16", "--minibatch-size", "32"],
    # two loss modules: the policy phase and the auxiliary phase
    "ppg": ["--num-envs", "4", "--rollout-steps", "16", "--minibatch-size", "32",
            "--n-pi", "2", "--aux-epochs", "2"],
    # V-trace to a target network, the IMPACT clipped surrogate, a target update per batch
    # (one epoch: one graph, with diagnostics; about 12 s here, where two epochs took 55 s)
    "appo": ["--num-envs", "4", "--rollout-steps", "16", "--minibatch-size", "32",
             "--epochs", "1"],
}  # fmt: skip


@pytest.mark.slow  # compiling costs 10-60 s per recipe
@pytest.mark.parametrize("algo", sorted(ON_POLICY))
def test_compiled_on_policy_updates_match_eager_ones(algo):
    """PPO's case also keeps an annealed entropy coefficient from recompiling: branches read
    the coefficient's sign (a Python bool), not the tensor; a comparison with the tensor
    split the graph and recompiled at every update (26 graphs in 4 updates)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    cfg, env, eager = _build(algo, ON_POLICY[algo] + ["--total-frames", "4096"])
    compiled = copy.deepcopy(eager)
    batches = _batches(cfg, env, eager, 4)
    env.close()
    _update_both(eager, compiled, batches, cfg.total_frames)
    # the comparison is only worth something if the compiled learner did run compiled graphs
    from rlkit.objectives.common import is_compiled

    losses = [compiled.loss, *([compiled.aux_loss] if algo == "ppg" else [])]
    assert all(is_compiled(loss) for loss in losses)
    assert not any(is_compiled(loss) for loss in (eager.loss, getattr(eager, "aux_loss", eager)))
    assert _graphs() >= len(losses), _graphs()
    if algo == "ppo":
        # the clip range changed at every update; graphs: checked first call, diagnostics
        # on/off, float then tensor clip range, never one per update
        assert compiled.loss.clip_epsilon != cfg.clip_epsilon
        assert isinstance(compiled.loss.clip_epsilon, torch.Tensor)
        assert isinstance(eager.loss.clip_epsilon, float)
        assert isinstance(compiled.loss.entropy_coef, torch.Tensor)
        assert _graphs() <= 4, _graphs()
        assert torch._dynamo.utils.counters["graph_break"] == {}


OFF_POLICY = {
    "dqn": dict(
        num_envs=2, steps_per_batch=8, batch_size=32, buffer_size=500, learning_starts=32,
        hidden=(32,), total_frames=1000,
    ),
    "sac": dict(
        env="Pendulum-v1", num_envs=2, steps_per_batch=8, batch_size=32, buffer_size=500,
        learning_starts=32, hidden=(32,), total_frames=1000,
    ),
}  # fmt: skip


@pytest.mark.slow  # compiling costs 10-60 s per recipe
@pytest.mark.parametrize("algo", sorted(OFF_POLICY))
def test_compiled_off_policy_updates_match_eager_ones(algo):
    torch._dynamo.reset()
    recipe = load_recipe(algo)
    cfg = getattr(recipe, _CONFIGS[algo])(**OFF_POLICY[algo])
    torch.manual_seed(0)
    env = make_env(cfg.env, num_envs=cfg.num_envs, seed=0)
    eager = recipe.build(cfg, env)
    compiled = copy.deepcopy(eager)
    batches = _batches(cfg, env, eager, 8)
    env.close()
    e_ctx, c_ctx = _update_both(eager, compiled, batches, cfg.total_frames)
    assert c_ctx.counters.updates == e_ctx.counters.updates > 0


@pytest.mark.slow  # compiling the recurrent loss: about 2 min here on a shared machine
@pytest.mark.skipif(
    not os.environ.get("RLKIT_MEASURE"),
    reason="a measurement, not a contract (--recurrent refuses --compile): RLKIT_MEASURE=1 runs it",
)
@pytest.mark.xfail(
    strict=True, reason="measured: 3.7e-3 apart after one update; --recurrent refuses --compile"
)
def test_compiled_recurrent_updates_match_eager_ones():
    """``--compile`` with ``--recurrent gru``: the loss runs the GRU over sequences cut where
    episodes start (data-dependent piece counts and lengths); 3 updates of 2 epochs on the
    same recurrent batches, compiled and eager, should agree within 1e-5 with the loss
    compiled. They do not yet (3.7e-3 after the first update, torch 2.x on the CPU), so
    ``--compile`` with ``--recurrent`` is refused in one line
    (:func:`test_compile_with_memory_is_refused_in_one_line`); this case is what a fix
    must turn green."""
    from rlkit.objectives.common import is_compiled

    torch._dynamo.reset()
    argv = ["--num-envs", "4", "--rollout-steps", "16", "--minibatch-size", "32", "--epochs",
            "2", "--recurrent", "gru", "--recurrent-size", "8", "--sequence-length", "8",
            "--total-frames", "4096"]  # fmt: skip
    cfg, env, eager = _build("ppo", argv)
    assert eager.memory.on
    compiled = copy.deepcopy(eager)
    batches = _batches(cfg, env, eager, 3)
    env.close()
    assert any(b["is_init"][:, 1:].any() for b in batches)  # episodes start inside rows
    _update_both(eager, compiled, batches, cfg.total_frames)
    # compiled all along (a loss that fell back to eager is no longer is_compiled)
    assert is_compiled(compiled.loss) and not is_compiled(eager.loss)


def test_compile_with_memory_is_refused_in_one_line(capsys):
    recipe = load_recipe("ppo")
    with pytest.raises(SystemExit):
        recipe.main(["--recurrent", "gru", "--compile", "true", "--progress", "false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--compile with --recurrent gru" in err[0], err
    assert "drop --compile" in err[0]


def test_compile_is_refused_for_populations():
    from rlkit.configs.ppo import PPOConfig

    with pytest.raises(ValueError, match="--compile does not apply to --population"):
        PPOConfig(population=2, compile=True)


class _AliasedTerms(torch.nn.Module):
    """A least-squares term and, as a diagnostic, its detached value. With a coefficient of 1
    inductor folds ``1.0 * v`` to ``v``, and under torch 2.14 the term then came back without
    a gradient (PPG's auxiliary loss did this): the loop must notice and run it eagerly."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3))
        self.in_keys = ["x", "y"]

    def forward(self, td):
        from tensordict import TensorDict

        v = ((td.get("x") @ self.w - td.get("y")) ** 2).mean()
        return TensorDict({"loss_fit": 1.0 * v, "fit": v.detach()}, batch_size=[])


@pytest.mark.slow  # inductor compiles the loss and its backward: 13 s here
def test_a_compiled_loss_that_loses_its_gradient_runs_eagerly_with_a_warning():
    from tensordict import TensorDict

    from rlkit.training.update import LossGroup, update_loop

    torch._dynamo.reset()
    torch.manual_seed(0)
    data = TensorDict({"x": torch.randn(16, 3), "y": torch.randn(16)}, [16])
    w_true = torch.linalg.lstsq(data["x"], data["y"].unsqueeze(-1)).solution.squeeze(-1)
    runs = {}
    for compile in (False, True):
        loss = _AliasedTerms()
        group = LossGroup("fit", loss, torch.optim.SGD(loss.parameters(), lr=0.1), epochs=50)
        ctx = _ctx(compile=compile, total_frames=1)
        if compile:
            with pytest.warns(RuntimeWarning, match="returned \\['loss_fit'\\] without a gradient"):
                update_loop([group], data, ctx)
        else:
            update_loop([group], data, ctx)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a later update stays eager: no second warning
            update_loop([group], data, ctx)
        runs[compile] = loss.w.detach().clone()
    # hand-checked: 100 steps of gradient descent approach the least-squares solution
    assert (runs[False] - w_true).abs().max() < 0.05
    assert (runs[True] - runs[False]).abs().max() < 1e-6


class _FailsToCompile(torch.nn.Module):
    """A least-squares loss the compiler cannot handle: its backend raises on its
    ``fail_on``-th graph (as torch 2.14's guard builder raised an IndexError on SVPG's loss
    in a process where other losses had compiled); the eager forward is fine. The
    ``diagnostics`` switch the update loop flips in the last epoch gives a second graph."""

    def __init__(self, fail_on: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3))
        self.in_keys = ["x", "y"]
        self.diagnostics = False
        self.fail_on, self.graphs = fail_on, 0

    def forward(self, td):
        from tensordict import TensorDict

        v = ((td.get("x") @ self.w - td.get("y")) ** 2).mean()
        out = {"loss_fit": v}
        if self.diagnostics:
            out["fit"] = v.detach()
        return TensorDict(out, batch_size=[])

    def compile(self, *args, **kwargs):  # what compile_loss calls
        def backend(graph, example_inputs):
            self.graphs += 1
            if self.graphs == self.fail_on:
                raise IndexError("list index out of range")
            return graph.forward

        self._compiled_call_impl = torch.compile(self._call_impl, backend=backend)


@pytest.mark.parametrize("fail_on", [1, 2])
def test_a_loss_that_fails_to_compile_runs_eagerly_with_a_warning(fail_on):
    from tensordict import TensorDict

    from rlkit.training.update import LossGroup, update_loop

    torch._dynamo.reset()
    torch.manual_seed(0)
    data = TensorDict({"x": torch.randn(16, 3), "y": torch.randn(16)}, [16])
    runs = {}
    for compile in (False, True):
        loss = _FailsToCompile(fail_on)
        group = LossGroup("fit", loss, torch.optim.SGD(loss.parameters(), lr=0.1), epochs=20)
        ctx = _ctx(compile=compile, total_frames=1)
        if compile:
            with pytest.warns(RuntimeWarning, match="failed to compile"):
                update_loop([group], data, ctx)
        else:
            update_loop([group], data, ctx)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # stays eager: no second warning, no second try
            update_loop([group], data, ctx)
        runs[compile] = loss.w.detach().clone()
    # plain SGD on the same data: the fallback trains exactly as eager does
    assert torch.equal(runs[True], runs[False])
    assert runs[False].abs().max() > 0.01


def test_the_compile_flag_reaches_the_update_loop(tmp_path, monkeypatch):
    """``--compile`` on the command line gets every loss of the run compiled (recorded here
    instead of compiled, to keep the test fast); without it none is."""
    import rlkit.training.update as update

    for flag, expected in ((["--compile"], {"PPOLoss"}), ([], set())):
        seen: set[str] = set()
        monkeypatch.setattr(
            update, "compile_loss", lambda loss, seen=seen: seen.add(type(loss).__name__)
        )
        recipe = load_recipe("ppo")
        argv = ["--total-frames", "512", "--num-envs", "2", "--rollout-steps", "64",
                "--minibatch-size", "64", "--eval-every", "0", "--progress", "false",
                "--run-dir", str(tmp_path / f"run{len(flag)}"), *flag]  # fmt: skip
        recipe.main(argv)
        assert seen == expected


def test_scheduled_hyperparameters_as_tensors_train_bit_identically(monkeypatch):
    """The tensor form of scheduled hyperparameters (what a compiled loss holds), run eagerly,
    gives the very parameters the float form gives: the same rounding of the clip bounds and
    of the entropy weight, and no gradient at a clip bound (``clamp`` with tensor bounds
    passed half of it there, and the runs parted at the 46th minibatch)."""
    import rlkit.objectives.common as common

    cfg, env, floats = _build("ppo", ENTROPY_SCHEDULE)
    tensors = copy.deepcopy(floats)
    batches = _batches(cfg, env, floats, 5)
    env.close()
    monkeypatch.setattr(common, "is_compiled", lambda loss: loss is tensors.loss)
    contexts = [_ctx(compile=False, total_frames=cfg.total_frames) for _ in range(2)]
    for i, batch in enumerate(batches):
        for learner, ctx in zip((floats, tensors), contexts):
            torch.manual_seed(100 + i)
            learner.update(batch.clone(), ctx)
            ctx.counters.frames += batch.numel()
        assert _max_diff(_params(floats), _params(tensors)) == 0.0, i
    assert isinstance(tensors.loss.clip_epsilon, torch.Tensor)
    assert isinstance(tensors.loss.entropy_coef, torch.Tensor)
    assert isinstance(floats.loss.entropy_coef, float)


def test_clamp_with_tensor_bounds_has_the_float_bounds_values_and_gradient():
    from rlkit.objectives.functional import clamp

    low, high = 0.8, 1.2
    x = torch.tensor([0.5, low, 1.0, high, 1.5, 0.8000001], requires_grad=True)
    y = x.detach().clone().requires_grad_()
    out_f = clamp(x, low, high)
    out_t = clamp(
        y, torch.tensor(low, dtype=torch.float64), torch.tensor(high, dtype=torch.float64)
    )
    out_f.sum().backward()
    out_t.sum().backward()
    assert torch.equal(out_f, out_t)
    # by hand: gradient 1 strictly inside the bounds, 0 at and beyond them
    assert x.grad.tolist() == [0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    assert torch.equal(x.grad, y.grad)
