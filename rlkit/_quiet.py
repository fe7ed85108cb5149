"""Keep the kit's output clean, without touching anyone else's.

Importing ``torchrl.collectors`` emits DeprecationWarnings, and TorchRL/Lightning print
notices that are not actionable for rlkit users. The filters here are narrow: they match
the exact third-party messages, so a warning raised by rlkit itself, or a new one from a
dependency, still shows. They apply only inside :func:`quiet` (the engine's ``run`` and the
recipes' command line): importing rlkit installs no warning filter.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

_IGNORED = [
    # (category, message regex, module regex)
    (DeprecationWarning, r".*", r"torchrl(\..*)?"),
    (FutureWarning, r".*auto_register_policy_transforms.*", r".*"),
    # torchrl.collectors defines deprecated weight-updater classes at import time
    (DeprecationWarning, r"Creating \w+ which inherits from WeightUpdaterBase", r".*"),
    # Lightning Fabric's all_gather (observation statistics under DDP) calls
    # torch.distributed.nn.functional.all_gather, deprecated in torch 2.14: once per rank
    (FutureWarning, r"torch\.distributed\.nn\.functional\.all_gather is deprecated", r".*"),
]


#: Lightning's INFO notices (logged once per process on rank 0), by logger and message. On
#: a GPU with Tensor Cores Lightning suggests ``torch.set_float32_matmul_precision``: rlkit
#: keeps float32 matrix products at full precision (its results must not depend on the card),
#: so the notice is not actionable inside a recipe.
#: On a machine without CUDA, the first ``--compile`` prints torch's "No CUDA runtime is
#: found, using CUDA_HOME=..." (``torch.utils.cpp_extension``) before anything of the run's:
#: the CPU build compiles for the CPU, so the notice says nothing a user can act on.
_NOTICES = ("that has Tensor Cores", "No CUDA runtime is found")
_NOTICE_LOGGERS = (
    "torch.utils.cpp_extension",
    "lightning.fabric.utilities.rank_zero",
    "lightning.pytorch.utilities.rank_zero",
    "lightning_fabric.utilities.rank_zero",
    "pytorch_lightning.utilities.rank_zero",
)


class _DropNotices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(notice in message for notice in _NOTICES)


_DROP = _DropNotices()


def install() -> None:
    """Add the filters for the rest of the process (a recipe's command-line entry only)."""
    for category, message, module in _IGNORED:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name in _NOTICE_LOGGERS:
        logging.getLogger(name).addFilter(_DROP)  # a filter added twice is kept once


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The filters inside the block only; the caller's filters come back afterwards."""
    added = [n for n in _NOTICE_LOGGERS if _DROP not in logging.getLogger(n).filters]
    with warnings.catch_warnings():
        install()
        try:
            yield
        finally:
            for name in added:
                logging.getLogger(name).removeFilter(_DROP)
