"""Value estimation: pure functions (:mod:`rlkit.value.functional`) and TensorDict modules.

``gae``, ``vtrace`` and ``td_lambda`` take tensors; ``GAE``, ``VTrace`` and ``TDLambda`` read
and write a collector batch's keys. See ``docs/value.md`` for the maths.
"""

from rlkit.value.estimators import GAE, VTRACE_RHO, TDLambda, VTrace
from rlkit.value.functional import gae, td_lambda, vtrace

__all__ = ["GAE", "TDLambda", "VTRACE_RHO", "VTrace", "gae", "td_lambda", "vtrace"]
