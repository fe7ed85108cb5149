"""rlkit: a modular reinforcement-learning kit on TorchRL, TensorDict and Lightning.

Importing rlkit changes nothing outside it: warning filters and speed work-arounds apply
inside the engine's ``run`` and the recipes' command line only (``rlkit._quiet``,
``rlkit._speedups``).
"""

__version__ = "0.1.0"

__all__ = ["__version__", "export", "load"]


def load(source, device="cpu", *, deterministic=True, env=None):
    """The trained policy of a run directory or checkpoint, as a module that acts on numpy
    or torch observations (:func:`rlkit.algorithms.deploy.load`; docs/deploy.md)."""
    from rlkit.algorithms.deploy import load as _load

    return _load(source, device, deterministic=deterministic, env=env)


def export(policy, format, path=None):
    """Write a policy's deterministic ``obs -> action`` function as ``"onnx"``,
    ``"torchscript"`` or ``"pt2"`` (:func:`rlkit.algorithms.deploy.export`; docs/deploy.md)."""
    from rlkit.algorithms.deploy import export as _export

    return _export(policy, format, path)
