"""Keep the kit's output clean.

Importing ``torchrl.collectors`` emits DeprecationWarnings, and TorchRL/Lightning print
notices that are not actionable for rlkit users. The filters here are narrow: they match
the exact third-party messages, so a warning raised by rlkit itself, or a new one from a
dependency, still shows.
"""

import warnings

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

for category, message, module in _IGNORED:
    warnings.filterwarnings("ignore", message=message, category=category, module=module)
