"""``rlkit.load`` and ``rlkit.export``: a run's trained policy from its checkpoint, and its
export (docs/deploy.md).

The checkpoint is read with the engine's safe loader (``torch.load(weights_only=True)``
after its archive checks: loading never executes code from the file); the networks are
rebuilt by the algorithm's own ``build`` from the settings stored in the checkpoint, and
their weights (observation statistics included) loaded into them. The policy returned is the
one the run's evaluations played (``learner.eval_policy()``), wrapped as a
:class:`rlkit.modules.deploy.Policy`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlkit.algorithms import config_class
from rlkit.algorithms import load as load_algorithm
from rlkit.configs import NAMES
from rlkit.configs.base import stored_fields
from rlkit.modules.deploy import EXPORT_FORMATS, Policy, export_policy, observation_layout
from rlkit.training import checkpoint as ckpt
from rlkit.training.errors import CheckpointError

__all__ = ["checkpoint_path", "export", "load"]


def checkpoint_path(source: str | os.PathLike) -> Path:
    """The checkpoint ``source`` names: a ``.pt`` file, or a run directory (its
    ``checkpoints/last.pt``)."""
    path = Path(source)
    if path.is_dir():
        last = path / "checkpoints" / "last.pt"
        if not last.is_file():
            raise CheckpointError(
                f"{str(path)!r} holds no checkpoints/last.pt: pass an rlkit run directory or a "
                "checkpoint file (<run-dir>/checkpoints/*.pt)"
            )
        return last
    return path


def load(
    source: str | os.PathLike,
    device: str | torch.device = "cpu",
    *,
    deterministic: bool = True,
    env: Any = None,
) -> Policy:
    """The trained policy of a run (its directory: ``checkpoints/last.pt``) or of a
    checkpoint file, as a :class:`~rlkit.modules.deploy.Policy` on ``device``: it acts on
    numpy arrays or tensors, one observation or a batch, ``deterministic`` (the mode) by
    default or sampled, with the run's observation normaliser.

    ``env``: the env factory the run was trained on, when the checkpoint names one that
    cannot be imported again (a function defined in a script): the networks are built for
    its spaces. A missing, corrupt or foreign file raises
    :class:`~rlkit.training.CheckpointError` in one line."""
    path = checkpoint_path(source)
    payload = ckpt.load(path)
    algo = payload["algo"]
    if algo not in NAMES:
        raise CheckpointError(
            f"checkpoint {str(path)!r} was written by algorithm {algo!r}, which rlkit.load "
            f"does not know ({', '.join(NAMES)})"
        )
    cls = config_class(algo)
    stored = payload.get("config") or {}
    try:
        cfg = cls(**stored_fields(stored, cls, source=f"the checkpoint {str(path)!r}"))
    except (TypeError, ValueError) as err:
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds settings this version cannot rebuild ({err})"
        ) from None
    if cfg.population > 1 or cfg.sweep:
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds a population of {cfg.population} members: "
            "rlkit.load reads a single run's checkpoint (train the member you want alone, or "
            "load it with --init-from into a one-member run)"
        )
    learner, built_env = _build(algo, cfg, env)
    try:
        modules = learner.modules()
        for name, module in modules.items():
            if name not in payload["modules"]:
                raise CheckpointError(
                    f"checkpoint {str(path)!r} has no module {name!r}: it was written by "
                    "another version of this recipe"
                )
            ckpt.load_module_state(module, payload["modules"][name], name=name, path=path)
        layout = observation_layout(built_env)
    finally:
        built_env.close()
    policy = learner.eval_policy()
    policy.to(device).eval()
    for module in modules.values():  # a policy may use networks registered elsewhere (SAC)
        module.to(device).eval()
    info = {
        "algo": algo,
        "env": cfg.env,
        "checkpoint": str(path),
        "frames": int(payload["counters"]["frames"]),
    }
    return Policy(policy, layout, deterministic=deterministic, info=info)


def _build(algo: str, cfg, env: Any):
    """The learner of ``cfg`` built by the algorithm's ``build`` on the run's training env
    as its first rank built it (its spaces decide the networks' sizes; per-env statistics,
    RND's return scaler, have one row per env)."""
    from rlkit.envs import make_env

    source = env if env is not None else cfg.env
    options = {**cfg.env_options(), **cfg.gym_options()}
    built_env = make_env(source, num_envs=cfg.num_envs, seed=cfg.seed, **options)
    try:
        learner = load_algorithm(algo).build(cfg, built_env)
    except BaseException:
        built_env.close()
        raise
    return learner, built_env


def export(
    policy: Policy | nn.Module | str | os.PathLike,
    format: str,
    path: str | os.PathLike | None = None,
) -> Path:
    """Write the deterministic ``obs -> action`` function (``obs, state -> action, state``
    for a recurrent policy; the action mask an input of a masked one) of ``policy`` (a
    :class:`~rlkit.modules.deploy.Policy`, or a run directory or checkpoint read with
    :func:`load`), normalisation included, as ``format``: ``"onnx"``, ``"torchscript"`` or
    ``"pt2"``, to ``path`` (default: ``<run-dir>/policy.onnx``, ``.ts`` or ``.pt2``). Returns
    the path written."""
    if format not in EXPORT_FORMATS:
        raise ValueError(
            f"export format {format!r} is not one of {', '.join(EXPORT_FORMATS)}: pick one"
        )
    if not isinstance(policy, Policy):
        if isinstance(policy, nn.Module):
            raise TypeError(
                "rlkit.export takes the policy rlkit.load returns (or a run directory or "
                f"checkpoint), got {type(policy).__name__}"
            )
        policy = load(policy)
    if path is None:
        where = policy.info.get("checkpoint")
        base = Path(where).parent if where else Path.cwd()
        if base.name == "checkpoints":  # <run-dir>/checkpoints/last.pt: the run directory
            base = base.parent
        path = base / f"policy{EXPORT_FORMATS[format]}"
    return export_policy(policy, format, path)
