"""Running advantage standardisation (pyrado's GAE(standardizer=RunningStandardizer())):
statistics of every advantage so far, carried across batches, checkpointed, and
``--running-advantage-norm`` in the recipes whose update runs the shared estimator step."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from rlkit import keys
from rlkit.keys import MissingKeyError
from rlkit.value import RunningStandardizer


def batch(values):
    column = torch.tensor(values, dtype=torch.float32).reshape(-1, 1)
    return TensorDict({keys.ADVANTAGE: column}, batch_size=[len(values)])


def reference(seen, current):
    """Textbook: mean and population std of every value seen so far (this batch's included)."""
    n = len(seen)
    mean = sum(seen) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in seen) / n)
    return [(x - mean) / (std + 1e-8) for x in current]


BATCHES = [[1.0, 3.0, -2.0, 0.5], [10.0, 12.0, 9.0], [-4.0, 0.0, 2.5, 7.0, 1.0]]


def test_statistics_are_carried_across_batches():
    norm, seen = RunningStandardizer(), []
    for values in BATCHES:
        seen += values
        out = norm(batch(values))[keys.ADVANTAGE]
        assert out.shape == (len(values), 1) and out.dtype == torch.float32
        torch.testing.assert_close(out.flatten(), torch.tensor(reference(seen, values)))
    # by hand, first batch: mean 0.625, squared deviations 0.140625 + 5.640625 + 6.890625
    # + 0.015625 = 12.6875, population std sqrt(12.6875 / 4) = 1.78097
    first = RunningStandardizer()(batch(BATCHES[0]))[keys.ADVANTAGE].flatten()
    torch.testing.assert_close(
        first, torch.tensor([0.2106, 1.3335, -1.4739, -0.0702]), atol=1e-4, rtol=0
    )
    assert float(norm.count) == 12  # every sample counted once
    # not the per-batch standardisation: the last batch's own mean is not zero
    assert abs(float(norm(batch(BATCHES[2]))[keys.ADVANTAGE].mean())) > 0.1


def test_state_dict_resumes_exactly():
    whole = RunningStandardizer()
    outs = [whole(batch(v))[keys.ADVANTAGE] for v in BATCHES]
    first = RunningStandardizer()
    first(batch(BATCHES[0]))
    state = {k: v.clone() for k, v in first.state_dict().items()}
    assert sorted(state) == ["stats.count", "stats.mean", "stats.var"]
    resumed = RunningStandardizer()
    resumed.load_state_dict(state)
    for values, expected in zip(BATCHES[1:], outs[1:], strict=True):
        assert torch.equal(resumed(batch(values))[keys.ADVANTAGE], expected)


def test_samples_override_the_statistics_source():
    """A learner under DDP passes every rank's advantages; this rank's are standardised."""
    norm = RunningStandardizer()
    everyone = torch.tensor([[1.0], [3.0], [5.0], [7.0]])
    out = norm(batch([1.0, 3.0]), samples=everyone)[keys.ADVANTAGE].flatten()
    torch.testing.assert_close(out, torch.tensor(reference([1, 3, 5, 7], [1.0, 3.0])))


def test_errors_are_one_line():
    with pytest.raises(ValueError, match=r"^RunningStandardizer: eps must be a number > 0"):
        RunningStandardizer(eps=0)
    with pytest.raises(MissingKeyError, match="run a value estimator"):
        RunningStandardizer()(TensorDict({}, batch_size=[2]))
    with pytest.raises(RuntimeError, match="before any update"):
        RunningStandardizer().standardize(torch.zeros(3))
    with pytest.raises(TypeError, match="floating-point"):
        RunningStandardizer().update(torch.arange(3))


# --------------------------------------------------------------------------- recipes


def build(recipe, argv):
    from rlkit.algorithms import load
    from rlkit.envs import make_env
    from rlkit.training import parse_config

    module = load(recipe)
    config = next(
        getattr(module, name) for name in dir(module) if name.lower() == f"{recipe}config"
    )
    env = make_env("CartPole-v1", num_envs=1, seed=0)
    try:
        return module.build(parse_config(config, argv), env)
    finally:
        env.close()


@pytest.mark.parametrize("recipe", ["ppo", "a2c", "appo"])
def test_flag_puts_a_checkpointed_standardiser_in_the_update(recipe):
    from rlkit.training.engine import Context, Counters

    flags = ["--running-advantage-norm", "true", "--normalize-advantage", "false"]
    size = ["--num-envs", "2", "--rollout-steps", "8", "--minibatch-size", "8"]
    learner = build(recipe, [*size, *flags])
    assert isinstance(learner.modules()["adv_norm"], RunningStandardizer)
    assert "adv_norm" not in build(recipe, ["--normalize-advantage", "false"]).modules()

    # the update standardises the estimator's advantages with the running statistics
    seen = []
    estimator = learner.estimator

    def spy(td):
        estimator(td)
        seen.append(td.get(keys.ADVANTAGE).clone())
        return td

    learner.estimator = spy
    from rlkit.data.collector import make_collector
    from rlkit.envs import make_env

    env = make_env("CartPole-v1", num_envs=2, seed=0)
    collector = iter(make_collector(env, learner.collect_policy(), frames_per_batch=16))
    fabric = SimpleNamespace(world_size=1, device=torch.device("cpu"))
    ctx = Context(fabric, total_frames=10_000, counters=Counters())
    for _ in range(2):
        data = next(collector)
        learner.update(data, ctx)
        raw = torch.cat([s.flatten() for s in seen]).tolist()
        expected = reference(raw, seen[-1].flatten().tolist())
        torch.testing.assert_close(
            data.get(keys.ADVANTAGE).flatten().double(),
            torch.tensor(expected, dtype=torch.float64),
            atol=1e-5,
            rtol=1e-5,
        )
    env.close()
    assert float(learner.modules()["adv_norm"].count) == 32


@pytest.mark.parametrize(
    "recipe,argv,message",
    [
        ("ppo", [], r"add --normalize-advantage false"),
        ("impala", ["--normalize-advantage", "false"], "not supported by impala"),
        ("ppg", ["--normalize-advantage", "false"], "not supported by ppg"),
    ],
)
def test_unsupported_combinations_are_refused(recipe, argv, message, capsys):
    """One line each: the config's (argparse, status 2) or the learner's ValueError."""
    try:
        build(recipe, ["--running-advantage-norm", "true", *argv])
    except SystemExit as exit_info:
        assert exit_info.code == 2
        (line,) = capsys.readouterr().err.splitlines()
    except ValueError as error:
        (line,) = str(error).splitlines()
    else:
        pytest.fail("accepted")
    assert re.search(message, line)


def test_the_value_page_example_runs(capsys):
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "value.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "RunningStandardizer()" in b]
    exec(compile(block, "docs/value.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == [
        "[-1.0, 1.0] 1.0",
        "[0.4472, 1.3416] 2.2361",
    ]
