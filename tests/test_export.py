"""``rlkit.export``: TorchScript, ``torch.export`` and ONNX (run with onnxruntime) policies act
as the eager policy does, to 1e-5, on an MLP (CartPole), Pendulum with normalised
observations, a CNN (MinAtar), SAC and a recurrent PPO (state in, state out); and
``--export`` writes them from the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import rlkit
from rlkit import keys
from tests.test_deploy import observations, train

#: the policies exported: (recipe, env, extra flags)
MODELS = {
    "mlp": ("ppo", "CartPole-v1", []),
    "normalised": ("ppo", "Pendulum-v1", ["--normalize-obs", "true"]),
    "cnn": ("ppo", "MinAtar/Breakout-v1", []),
    "sac": ("sac", "Pendulum-v1", []),
    "recurrent": ("ppo", "CartPole-v1", ["--recurrent", "lstm", "--recurrent-size", "8"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each model's tiny run, trained once per module (on first use)."""
    done: dict[str, object] = {}

    def get(model: str):
        if model not in done:
            algo, env, extra = MODELS[model]
            if model == "cnn":
                pytest.importorskip("minatar")
            run = tmp_path_factory.mktemp(model) / "run"
            train(algo, run, "--env", env, *extra)
            done[model] = run
        return done[model]

    return get


def run_exported(fmt: str, path, inputs: list[torch.Tensor]) -> list[np.ndarray]:
    """The exported file at ``path`` run on ``inputs`` by its own runtime."""
    if fmt == "onnx":
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return session.run(None, {n: x.numpy() for n, x in zip(names, inputs, strict=True)})
    module = (
        torch.jit.load(str(path)) if fmt == "torchscript" else torch.export.load(str(path)).module()
    )
    with torch.no_grad():
        out = module(*inputs)
    out = out if isinstance(out, (tuple, list)) else [out]
    return [o.numpy() for o in out]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


#: the formats each test writes: torch's two (one test), ONNX (another, skipped without it)
RUNTIMES = {"torch": ("torchscript", "pt2"), "onnx": ("onnx",)}


def _needs(runtime: str) -> None:
    if runtime == "onnx":
        pytest.importorskip("onnxscript")
        pytest.importorskip("onnxruntime")


@pytest.mark.parametrize(
    ("model", "runtime"),
    [("mlp", "torch")]
    + [
        pytest.param(m, r, marks=pytest.mark.slow)
        for m in ("mlp", "normalised", "cnn", "sac")
        for r in RUNTIMES
        if (m, r) != ("mlp", "torch")
    ],
)
def test_exported_policy_matches_the_eager_policy(runs, model, runtime, tmp_path):
    _needs(runtime)
    policy = rlkit.load(runs(model))
    obs = observations(MODELS[model][1], n=96)
    entries = [obs[k] for k in policy.entries]  # one entry: "observation"
    want = policy(entries[0].numpy())
    for fmt in RUNTIMES[runtime]:
        path = rlkit.export(policy, fmt, tmp_path / f"policy.{fmt}")
        got = run_exported(fmt, path, entries)
        assert len(got) == 1
        _close(got[0], want)
        # a batch of one and a batch of another size: the batch dim is dynamic
        _close(run_exported(fmt, path, [e[:1] for e in entries])[0], want[:1])
        _close(run_exported(fmt, path, [e[:5] for e in entries])[0], want[:5])


@pytest.mark.slow
@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_exported_recurrent_policy_carries_its_state_in_and_out(runs, runtime, tmp_path):
    """obs, state -> action, next state: fed back step by step from zero, the exported
    policy plays the eager policy's actions and states over 20 steps of 8 envs."""
    _needs(runtime)
    policy = rlkit.load(runs("recurrent"))
    obs = observations("CartPole-v1", n=160)[keys.OBSERVATION].reshape(20, 8, -1)
    for fmt in RUNTIMES[runtime]:
        path = rlkit.export(policy, fmt, tmp_path / f"policy.{fmt}")
        policy.reset()
        state = [torch.zeros(8, 1, 8), torch.zeros(8, 1, 8)]  # LSTM h and c: one layer of 8
        for t in range(20):
            want = policy(obs[t].numpy())
            action, *state_out = run_exported(fmt, path, [obs[t], *state])
            _close(action, want)
            names = (keys.POLICY_STATE_H, keys.POLICY_STATE_C)
            for got, key in zip(state_out, names, strict=True):
                _close(got, policy.state[key].numpy())
            state = [torch.as_tensor(s) for s in state_out]
        assert float(np.abs(state_out[0]).min()) > 0


def test_normalised_policy_matches_a_hand_computed_network(runs):
    """The eager policy of the normalised Pendulum run against the network written out by
    hand from the checkpoint's tensors (read with ``torch.load(weights_only=True)``):
    ``clip((obs - mean) / sqrt(var + 1e-8), +-10)``, two tanh layers, the Gaussian's mean.
    The statistics are far from (0, 1), so a policy without them acts differently."""
    run = runs("normalised")
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["modules"]["actor"]
    p = "module.0.module."
    mean, var = state[p + "0.stats.mean"], state[p + "0.stats.var"]
    assert float((var - 1).abs().max()) > 0.1  # statistics that matter
    obs = observations("Pendulum-v1", n=200)[keys.OBSERVATION]

    def hand(x: torch.Tensor, normalise: bool = True) -> np.ndarray:
        x = x.double()
        if normalise:
            x = ((x - mean) / torch.sqrt(var + 1e-8)).clamp(-10, 10)
        x = x.float()
        for i in (0, 2):
            x = torch.tanh(x @ state[f"{p}1.loc.{i}.weight"].T + state[f"{p}1.loc.{i}.bias"])
        return (x @ state[f"{p}1.loc.4.weight"].T + state[f"{p}1.loc.4.bias"]).numpy()

    got = rlkit.load(run)(obs.numpy())
    np.testing.assert_allclose(got, hand(obs), rtol=0, atol=1e-5)
    assert np.abs(got - hand(obs, normalise=False)).max() > 1e-3


@pytest.mark.slow
def test_export_flag_writes_the_policy_of_the_checkpoint(runs, tmp_path):
    """``recipes/ppo.py --eval-only --init-from CKPT --export pt2 [--export-path P]``: the
    program written acts as ``rlkit.load``'s policy; without ``--eval-only`` it is refused."""
    from rlkit.algorithms import ppo

    last = runs("normalised") / "checkpoints" / "last.pt"
    out = tmp_path / "deploy" / "pendulum.pt2"
    argv = ["--progress", "false", "--init-from", str(last), "--eval-only"]
    argv += ["--eval-episodes", "1", "--run-dir", str(tmp_path / "eval")]
    result = ppo.main([*argv, "--export", "pt2", "--export-path", str(out)])
    assert result["export"] == str(out)
    assert json.loads((tmp_path / "eval" / "evaluation.json").read_text())["export"] == str(out)
    obs = observations("Pendulum-v1", n=48)[keys.OBSERVATION]
    _close(run_exported("pt2", out, [obs])[0], rlkit.load(last)(obs.numpy()))
    # default path: <run-dir>/policy.ts
    ppo.main([*argv[:-1], str(tmp_path / "eval2"), "--export", "torchscript"])
    assert (tmp_path / "eval2" / "policy.ts").is_file()
    # from Python, a run directory in: the file lands in that run directory
    assert rlkit.export(str(last.parent.parent), "pt2") == last.parent.parent / "policy.pt2"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--export", "onnx"], "--export onnx writes the policy of a checkpoint: add --eval-only"),
        (["--export-path", "p.onnx"], "--export-path needs --export"),
        (["--export", "tflite"], "invalid choice: 'tflite'"),
    ],
)
def test_export_flags_without_a_checkpoint_are_refused_in_one_line(argv, message, capsys):
    from rlkit.training.cli import parse

    with pytest.raises(SystemExit) as err:
        parse("ppo", argv)
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_an_unknown_format_and_a_foreign_module_are_one_line(runs, tmp_path):
    policy = rlkit.load(runs("mlp"))
    with pytest.raises(ValueError, match="export format 'tflite' is not one of onnx"):
        rlkit.export(policy, "tflite", tmp_path / "p")
    with pytest.raises(TypeError, match="takes the policy rlkit.load returns"):
        rlkit.export(torch.nn.Linear(2, 2), "pt2", tmp_path / "p.pt2")
