"""A trained policy as a plain module, and its export to TorchScript, ``torch.export`` and ONNX.

:class:`Policy` wraps an rlkit evaluation policy (a TensorDict module: the one the run's
evaluations played, its observation normaliser inside its networks) so that it acts on numpy
arrays or tensors, one observation or a batch, deterministically (argmax of the logits, the
Gaussian's mean, the greedy Q action) or sampled; a recurrent policy carries its state
between calls (:meth:`Policy.reset`). :func:`rlkit.load` builds one from a run's checkpoint.

:func:`export_policy` writes the deterministic function ``obs -> action`` (for a recurrent
policy ``obs, state -> action, next state``; a masked one reads the mask as an input too),
normalisation included, in one of :data:`EXPORT_FORMATS`. Every format goes through ONE
``torch.export`` of :class:`DeterministicPolicy`, a plain ``nn.Module`` of tensors in and
out:

- ``pt2``: that ``ExportedProgram``, saved with ``torch.export.save``;
- ``onnx``: the same program through ``torch.onnx.export`` (the dynamo exporter);
- ``torchscript``: ``torch.jit.script`` of the program's graph as a plain FX module
  (aten operations on flat tensors, :func:`_scriptable`). Tracing or scripting TorchRL's
  modules themselves fails (measured with torchrl 0.14.1, torch 2.14.1):
  ``torch.jit.trace`` of the actor, even inside a plain wrapper, stops at
  ``SAMPLE_LOG_PROB_KEY is fully deprecated``, and ``torch.jit.script`` at ``Unknown type
  annotation: 'nn.ModuleList'``; ``torch.jit.trace`` of the exported module runs but fixes
  the batch size.

The batch dimension is dynamic in all three.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rlkit import keys
from rlkit.modules.recurrent import carried_state, initial_state

__all__ = ["EXPORT_FORMATS", "DeterministicPolicy", "Policy", "export_policy", "observation_layout"]

#: what :func:`export_policy` writes, with the file suffix of each
EXPORT_FORMATS = {"onnx": ".onnx", "torchscript": ".ts", "pt2": ".pt2"}

#: one observation entry the policy reads: its key, shape (no batch dims) and dtype
Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]


def observation_layout(env) -> Layout:
    """The observation entries of a TorchRL env (batch dims stripped), as :class:`Policy`
    reads them: ``"observation"``, or a Dict observation's entries, with ``"action_mask"``
    when the env has one."""
    spec = env.observation_spec
    dims = len(env.batch_size)
    out: Layout = {}
    for key in spec.keys():  # noqa: SIM118 (a Composite spec)
        entry = spec[key]
        if isinstance(key, str) and hasattr(entry, "dtype") and entry.dtype is not None:
            out[key] = (tuple(entry.shape[dims:]), entry.dtype)
    return out


def _in_keys(policy: nn.Module) -> list:
    return list(getattr(policy, "in_keys", None) or [])


class Policy(nn.Module):
    """A trained policy that acts on observations: ``policy(obs)`` -> action.

    ``obs``: a numpy array or tensor (one observation, or a batch with the batch dim first),
    or for a Dict observation a mapping of its entries; the action comes back as the same
    kind (numpy in, numpy out), batched only if the observation was. ``mask``: the action
    mask of a masked env (``True``: allowed), required by a policy that reads one.
    ``deterministic`` (default: the policy's own setting, :attr:`deterministic`) plays the
    mode of the action distribution; ``False`` samples from it (torch's generator).

    A recurrent policy keeps its state between calls, one row per observation of the batch,
    from zero at the first call and after :meth:`reset` (of every row, or of the rows of
    ``rows``: call it where an episode ends).
    """

    def __init__(
        self,
        policy: nn.Module,
        layout: Layout,
        *,
        deterministic: bool = True,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.policy = policy
        self.deterministic = bool(deterministic)
        #: where the policy comes from (algorithm, env, checkpoint, frames): for the user
        self.info = dict(info or {})
        self.state_shapes = carried_state(policy)
        reads = set(_in_keys(policy))
        skip = {keys.ACTION_MASK, keys.IS_INIT, *self.state_shapes}
        entries = {k: v for k, v in layout.items() if k not in skip}
        chosen = {k: v for k, v in entries.items() if k in reads}
        #: the observation entries read, in the env's order, with their shapes and dtypes
        self.entries = chosen or entries
        self.masked = keys.ACTION_MASK in reads
        self.mask_shape = layout.get(keys.ACTION_MASK, ((), torch.bool))[0]
        self._state: dict[Any, Tensor] | None = None
        self._is_init: Tensor | None = None

    # ------------------------------------------------------------------ acting
    @property
    def device(self) -> torch.device:
        tensors = [*self.policy.parameters(), *self.policy.buffers()]
        return tensors[0].device if tensors else torch.device("cpu")

    @property
    def recurrent(self) -> bool:
        return bool(self.state_shapes)

    @property
    def state(self) -> dict[Any, Tensor] | None:
        """A recurrent policy's state after the last call (``{key: [batch, *shape]}``);
        None before the first call and after :meth:`reset`."""
        return self._state

    def reset(self, rows: Any = None) -> None:
        """Start the recurrent state again from zero: every row, or the rows where ``rows``
        (a boolean array or tensor ``[batch]``) is true. Nothing for a policy without
        memory."""
        if rows is None or self._state is None:
            self._state, self._is_init = None, None
            return
        rows = torch.as_tensor(np.asarray(rows), dtype=torch.bool, device=self._is_init.device)
        self._is_init = self._is_init | rows.reshape(self._is_init.shape)

    @torch.no_grad()
    def forward(self, obs: Any, mask: Any = None, *, deterministic: bool | None = None) -> Any:
        inputs, numpy_in, single = self._inputs(obs)
        batch = next(iter(inputs.values())).shape[0]
        data = dict(inputs)
        if self.masked:
            data[keys.ACTION_MASK] = self._mask(mask, batch, single)
        elif mask is not None:
            raise ValueError("this policy reads no action mask: drop mask=")
        if self.recurrent:
            data.update(self._carried(batch))
        td = TensorDict(data, batch_size=[batch], device=self.device)
        det = self.deterministic if deterministic is None else bool(deterministic)
        mode = ExplorationType.DETERMINISTIC if det else ExplorationType.RANDOM
        with set_exploration_type(mode):
            td = self.policy(td)
        if self.recurrent:
            self._state = {k: td.get((keys.NEXT, k)) for k in self.state_shapes}
            self._is_init = torch.zeros_like(self._is_init)
        return _output(td.get(keys.ACTION), numpy_in=numpy_in, single=single)

    def _inputs(self, obs: Any) -> tuple[dict[str, Tensor], bool, bool]:
        """The observation entries as tensors ``[batch, *shape]`` on the policy's device;
        whether they came as numpy, and whether as one observation (no batch dim)."""
        names = list(self.entries)
        if isinstance(obs, Mapping):
            missing = [k for k in names if k not in obs]
            if missing:
                raise ValueError(
                    f"the observation has no entry {missing[0]!r}: pass a mapping with "
                    f"{', '.join(names)}"
                )
            values = {k: obs[k] for k in names}
        elif len(names) == 1:
            values = {names[0]: obs}
        else:
            raise ValueError(
                f"this policy reads a Dict observation: pass a mapping with {', '.join(names)}"
            )
        numpy_in = not any(isinstance(v, Tensor) for v in values.values())
        out: dict[str, Tensor] = {}
        single = None
        for key, value in values.items():
            shape, dtype = self.entries[key]
            x = torch.as_tensor(np.asarray(value) if not isinstance(value, Tensor) else value)
            x = x.to(device=self.device, dtype=dtype)
            if tuple(x.shape) == shape:
                one = True
            elif x.dim() == len(shape) + 1 and tuple(x.shape[1:]) == shape:
                one = False
            else:
                raise ValueError(
                    f"observation {key!r} has shape {tuple(x.shape)}; this policy reads "
                    f"{shape} (one observation) or (batch, {', '.join(map(str, shape))})"
                )
            if single is not None and one != single:
                raise ValueError("the observation's entries mix one observation and a batch")
            single = one
            out[key] = x[None] if one else x
        return out, numpy_in, bool(single)

    def _mask(self, mask: Any, batch: int, single: bool) -> Tensor:
        if mask is None:
            raise ValueError(
                "this policy reads an action mask (its env's action_mask): pass mask= with the "
                "allowed actions, e.g. policy(obs, mask=info['action_mask'])"
            )
        m = mask if isinstance(mask, Tensor) else torch.as_tensor(np.asarray(mask))
        m = m.to(device=self.device, dtype=torch.bool)
        return m[None] if single else m.reshape(batch, *m.shape[1:])

    def _carried(self, batch: int) -> dict[Any, Tensor]:
        """The recurrent state a step starts from (zero on a first call, after
        :meth:`reset`, or when the batch size changes) and ``is_init``."""
        if self._state is None or self._is_init.shape[0] != batch:
            self._state = initial_state(self.state_shapes, (batch,), device=self.device)
            self._is_init = torch.ones(batch, 1, dtype=torch.bool, device=self.device)
        return {keys.IS_INIT: self._is_init, **self._state}

    def extra_repr(self) -> str:
        entries = ", ".join(
            f"{k}: {list(s)} {str(d).replace('torch.', '')}" for k, (s, d) in self.entries.items()
        )
        more = (", masked" if self.masked else "") + (", recurrent" if self.recurrent else "")
        return f"{entries}{more}, deterministic={self.deterministic}"


def _output(action: Any, *, numpy_in: bool, single: bool) -> Any:
    if isinstance(action, TensorDictBase):  # a structured action: a dict of its parts
        parts = action.keys()  # iterating a TensorDict gives its rows
        return {k: _output(action.get(k), numpy_in=numpy_in, single=single) for k in parts}
    if single:
        action = action[0]
    return action.cpu().numpy() if numpy_in else action


# --------------------------------------------------------------------------- export
class DeterministicPolicy(nn.Module):
    """The deterministic function of a :class:`Policy` as plain tensors in and out, what
    :func:`export_policy` exports: ``forward(*observation entries, [mask], [*state])``
    returns the action, or ``(action, *next state)`` for a recurrent policy (its state
    starts from zero: pass zeros at an episode's first step)."""

    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self.policy = policy.policy
        self.entries = dict(policy.entries)
        self.masked, self.mask_shape = policy.masked, policy.mask_shape
        self.state_shapes = dict(policy.state_shapes)

    @property
    def input_names(self) -> list[str]:
        names = list(self.entries) + ([keys.ACTION_MASK] if self.masked else [])
        return names + [_name(k) for k in self.state_shapes]

    @property
    def output_names(self) -> list[str]:
        return [keys.ACTION] + [f"next_{_name(k)}" for k in self.state_shapes]

    def example_inputs(self, batch: int = 2) -> tuple[Tensor, ...]:
        """Inputs of ``batch`` rows: observations drawn at random (pixels in 0-255), every
        action allowed, zero states."""
        gen = torch.Generator().manual_seed(0)
        out = []
        for shape, dtype in self.entries.values():
            if dtype.is_floating_point:
                out.append(torch.randn(batch, *shape, generator=gen).to(dtype))
            elif dtype == torch.bool:
                out.append(torch.ones(batch, *shape, dtype=dtype))
            else:
                out.append(torch.randint(0, 2, (batch, *shape), generator=gen).to(dtype))
        if self.masked:
            out.append(torch.ones(batch, *self.mask_shape, dtype=torch.bool))
        out += list(initial_state(self.state_shapes, (batch,)).values())
        device = next(iter([*self.policy.parameters(), *self.policy.buffers()]), None)
        return tuple(x.to(device.device) if device is not None else x for x in out)

    def forward(self, *inputs: Tensor) -> Tensor | tuple[Tensor, ...]:
        n = len(self.entries)
        data: dict[Any, Tensor] = dict(zip(self.entries, inputs[:n], strict=True))
        batch = inputs[0].shape[0]
        rest = inputs[n:]
        if self.masked:
            data[keys.ACTION_MASK] = rest[0]
            rest = rest[1:]
        if self.state_shapes:
            data[keys.IS_INIT] = torch.zeros(batch, 1, dtype=torch.bool, device=inputs[0].device)
            data.update(zip(self.state_shapes, rest, strict=True))
        td = TensorDict(data, batch_size=[batch])
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            td = self.policy(td)
        action = td.get(keys.ACTION)
        if isinstance(action, TensorDictBase):
            raise ValueError(
                "export writes one action tensor; this policy's action is structured "
                f"({', '.join(map(str, action.keys()))}): act with rlkit.load's policy instead"
            )
        if not self.state_shapes:
            return action
        return (action, *(td.get((keys.NEXT, k)) for k in self.state_shapes))


def _name(key: Any) -> str:
    return key if isinstance(key, str) else ".".join(key)


def export_policy(policy: Policy, format: str, path: str | Path) -> Path:
    """Write ``policy``'s deterministic function (:class:`DeterministicPolicy`) to ``path``
    as ``format``: ``"onnx"``, ``"torchscript"`` or ``"pt2"`` (:data:`EXPORT_FORMATS`),
    with a dynamic batch dimension; returns the path."""
    if format not in EXPORT_FORMATS:
        raise ValueError(
            f"export format {format!r} is not one of {', '.join(EXPORT_FORMATS)}: pick one"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fn = DeterministicPolicy(policy).eval()
    example = fn.example_inputs(2)
    batch = torch.export.Dim("batch", min=1)
    # forward(*inputs): the varargs are one argument, a tuple of tensors
    dynamic = (tuple({0: batch} for _ in example),)
    # exported with grad mode on: under no_grad, TorchRL's distribution (a softmax in an
    # enable_grad block) became a wrap_with_set_grad_enabled call TorchScript cannot compile
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRL's deprecations, tracer notes
        program = torch.export.export(fn, example, dynamic_shapes=dynamic)
        if format == "pt2":
            torch.export.save(program, str(path))
        elif format == "torchscript":
            torch.jit.save(torch.jit.script(_scriptable(program)), str(path))
        else:
            _onnx(program, path, fn)
    return path


def _scriptable(program) -> torch.fx.GraphModule:
    """The exported program as a plain FX module that ``torch.jit.script`` compiles, with
    the batch dim still dynamic. ``ExportedProgram.module()`` is close: aten operations on
    flat tensors. What TorchScript does not take is dropped or rewritten: its pytree calling
    convention (plain positional tensors instead: our inputs and outputs are flat already),
    its input guards and shape assertions (checks, not computation), its forward hooks (a
    new module from the same graph has none) and ``aten.sym_size.int`` (``x.size(d)``).
    ``torch.jit.trace`` of the same module runs but bakes the example's batch size into
    every reshape (a CNN's flatten, a recurrent core's state), so it is not used."""
    module = program.module()
    graph = module.graph
    graph._codegen = torch.fx.graph.CodeGen()  # positional tensors in, a tuple/tensor out
    aten = torch.ops.aten
    for sub in module.modules():  # TorchScript resolves an op's overload from its packet
        if isinstance(sub, torch.fx.GraphModule):
            for node in sub.graph.nodes:
                op = node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
                if op and node.target is not aten.sym_size.int:
                    node.target = node.target.overloadpacket
            if sub is not module:
                sub.recompile()
    checks = (aten._assert_tensor_metadata, aten._assert_scalar, aten.sym_constrain_range_for_size)
    for node in list(graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            graph.erase_node(node)
        elif node.op == "call_function" and node.target is aten.sym_size.int:
            with graph.inserting_before(node):
                size = graph.call_method("size", node.args)
            node.replace_all_uses_with(size)
            graph.erase_node(node)
        elif node.op == "call_function" and _overload(node.target) in checks and not node.users:
            graph.erase_node(node)
    graph.eliminate_dead_code()
    plain = torch.fx.GraphModule(module, graph)
    if hasattr(plain, "_guards_fn"):
        delattr(plain, "_guards_fn")
    return plain


def _overload(target):
    return getattr(target, "overloadpacket", target)


def _onnx(program, path: Path, fn: DeterministicPolicy) -> None:
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as err:
        raise ImportError(f"export to onnx needs {err.name}: pip install 'rlkit[export]'") from None
    import logging

    # the exporter logs a line per torchvision op it cannot register: not ours to show
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        torch.onnx.export(
            program,
            f=str(path),
            input_names=fn.input_names,
            output_names=fn.output_names,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    finally:
        quiet.setLevel(level)
