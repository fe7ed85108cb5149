"""A recipe's replaceable parts: the loss and estimator classes a ``build`` takes.

Every algorithm's ``build(cfg, env, *, loss_cls=None, estimator_cls=None)`` builds the rest
of the recipe (networks, optimisers, learner, intrinsic bonus) from the config and constructs
its loss and its value estimator through :func:`make_part`: with ``None`` the recipe's own
class, else the class given, called with exactly the arguments the recipe passes its own (so
every flag and the env's preset still act). The class given is checked first; a mismatch is
one ``TypeError`` line naming the class, the arguments the recipe passes and the fix.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

__all__ = ["gae_part", "make_part"]


def _name(obj: Any) -> str:
    """A readable name of a class, function or ``functools.partial`` of one."""
    func = getattr(obj, "func", None)  # functools.partial
    if func is not None:
        return f"functools.partial({_name(func)}, ...)"
    return getattr(obj, "__qualname__", None) or type(obj).__name__


def _article(name: str) -> str:
    return f"{'an' if name[:1] in 'AEIOU' else 'a'} {name}"


def _value(value: Any) -> str:
    if isinstance(value, nn.Module):
        return f"<{type(value).__name__}>"
    return repr(value)


def describe_call(default: type, args: tuple, kwargs: dict[str, Any]) -> str:
    """``PPOLoss(actor, critic, clip_epsilon=0.2, ...)``: the call the recipe makes, its
    positional arguments by the names of ``default``'s parameters."""
    try:
        names = list(inspect.signature(default).parameters)[: len(args)]
    except (TypeError, ValueError):
        names = []
    if len(names) < len(args):
        names = [f"arg{i}" for i in range(len(args))]
    parts = names + [f"{key}={_value(value)}" for key, value in kwargs.items()]
    return f"{default.__name__}({', '.join(parts)})"


def _check(
    given: Any, default: type, args: tuple, kwargs: dict[str, Any], *, role: str, where: str
) -> None:
    """Refuse ``given`` in one line when it cannot stand in for ``default``."""
    call = describe_call(default, args, kwargs)
    if not callable(given):
        raise TypeError(
            f"{role}={given!r} is not callable: {where} calls {call}; pass a subclass of "
            f"{default.__name__} (or functools.partial of one)"
        )
    if isinstance(given, type) and not issubclass(given, default):
        raise TypeError(
            f"{role}={_name(given)} is not a subclass of {default.__name__}, which {where} "
            f"builds and its learner relies on: subclass {default.__name__} (it is called "
            f"as {call})"
        )
    try:
        signature = inspect.signature(given)
    except (TypeError, ValueError):  # a builtin or C callable: its call will tell
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as err:
        raise TypeError(
            f"{role}={_name(given)} rejects the arguments {where} passes ({err}): it is called "
            f"as {call}; accept them (take **kwargs and pass them on to "
            f"super().__init__) and give an extra argument a default or bind it with "
            f"functools.partial({_name(given)}, name=value)"
        ) from None


def make_part(
    given: Any, default: type, *args: Any, role: str = "loss_cls", where: str, **kwargs: Any
) -> Any:
    """``default(*args, **kwargs)`` when ``given`` is None (the recipe's own part, built as
    it always was), else ``given(*args, **kwargs)``: a subclass of ``default``, or a callable
    (``functools.partial``, a factory) returning an instance of one.

    Args:
        given: the user's class or callable, or None.
        default: the class the recipe builds (``PPOLoss``, ``GAE``, ...).
        args, kwargs: what the recipe passes ``default``; ``given`` gets exactly these.
        role: the keyword the user passed ``given`` as (``"loss_cls"``, ``"estimator_cls"``).
        where: who calls, for the message (``"ppo.build"``).

    Raises:
        TypeError: one line naming ``given``, the call the recipe makes and the fix, when
            ``given`` is not callable, is a class that does not subclass ``default``, does
            not accept the arguments, or returns something that is not a ``default``.
    """
    if given is None:
        return default(*args, **kwargs)
    _check(given, default, args, kwargs, role=role, where=where)
    part = given(*args, **kwargs)
    if not isinstance(part, default):
        raise TypeError(
            f"{role}={_name(given)} returned {_article(type(part).__name__)}, not "
            f"{_article(default.__name__)}, which {where} builds and its learner relies on: "
            "return an "
            f"instance of a subclass of {default.__name__}"
        )
    return part


def gae_part(
    given: Any, default: type, cfg: Any, critic: nn.Module, *, where: str, **extra: Any
) -> nn.Module:
    """A policy-gradient recipe's estimator, or the class ``given`` in its place:
    ``default(gamma=--gamma, lmbda=--gae-lambda, value_network=critic, **extra)`` (``default``
    is the recipe's own ``GAE``) through :func:`make_part`."""
    return make_part(
        given,
        default,
        gamma=cfg.gamma,
        lmbda=cfg.gae_lambda,
        value_network=critic,
        **extra,
        role="estimator_cls",
        where=where,
    )
