"""Value estimation: pure functions (:mod:`rlkit.value.functional`) and TensorDict modules.

``gae``, ``vtrace``, ``td_lambda``, ``discounted_return`` and ``non_episodic_gae`` take
tensors; ``GAE``, ``VTrace`` and ``TDLambda`` read and write a collector batch's keys;
``RunningStandardizer`` standardises their advantages with statistics carried across
batches. See ``docs/value.md`` for the maths.
"""

from rlkit.value.estimators import GAE, VTRACE_RHO, TDLambda, VTrace
from rlkit.value.functional import discounted_return, gae, non_episodic_gae, td_lambda, vtrace
from rlkit.value.standardizer import RunningStandardizer

__all__ = [
    "GAE",
    "RunningStandardizer",
    "TDLambda",
    "VTRACE_RHO",
    "VTrace",
    "discounted_return",
    "gae",
    "non_episodic_gae",
    "td_lambda",
    "vtrace",
]
