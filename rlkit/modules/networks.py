"""Network builders: orthogonally initialised MLPs, the standard pixel encoders (Nature,
IMPALA, MinAtar) and :func:`make_encoder`, the one registry the recipes' ``--encoder`` reads.

Every builder returns a plain ``torch.nn.Module`` that maps tensors to tensors; the actor
and critic builders (``rlkit.modules.actors`` / ``rlkit.modules.critics``) wrap them into
TensorDict modules that read and write the keys of ``rlkit.keys``.

Initialisation follows the PPO implementation details shared by OpenAI Baselines,
CleanRL (``layer_init``) and Stable-Baselines3 (``ActorCriticPolicy.init_weights``):
orthogonal weights (Saxe et al., 2014) with gain :math:`\\sqrt{2}` on hidden layers, a
per-head gain on the output layer (0.01 for policy logits/means, 1.0 for values) and zero
biases. For a weight :math:`W \\in \\mathbb{R}^{m \\times n}` initialised with gain
:math:`g`, the rows (if :math:`m \\le n`) or columns are orthogonal with norm :math:`g`:
:math:`W W^\\top = g^2 I_m` (or :math:`W^\\top W = g^2 I_n`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

__all__ = [
    "ACTIVATIONS",
    "ChannelsLast",
    "ENCODERS",
    "ImpalaCNN",
    "MinAtarCNN",
    "FlatImage",
    "NatureCNN",
    "image_layout",
    "INITS",
    "init_orthogonal_",
    "reinit_",
    "make_encoder",
    "mlp",
    "mlp_body",
    "resolve_activation",
]

#: Activation names accepted by :func:`mlp` (any ``nn.Module`` class is accepted too).
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "leaky_relu": nn.LeakyReLU,
}

HIDDEN_GAIN = math.sqrt(2.0)


def resolve_activation(activation: str | type[nn.Module]) -> type[nn.Module]:
    """Return the activation class for a name (``"tanh"``, ``"relu"``, ...) or a class.

    Raises:
        ValueError: an unknown name; TypeError: neither a name nor an ``nn.Module`` class.
    """
    if isinstance(activation, str):
        try:
            return ACTIVATIONS[activation.lower()]
        except KeyError:
            raise ValueError(
                f"unknown activation {activation!r}: use one of {sorted(ACTIVATIONS)} "
                "or pass an nn.Module class such as torch.nn.Mish"
            ) from None
    if isinstance(activation, type) and issubclass(activation, nn.Module):
        return activation
    raise TypeError(
        f"activation must be a name such as 'tanh' or an nn.Module class, got {activation!r} "
        "(pass the class, e.g. torch.nn.ReLU, not an instance)"
    )


def init_orthogonal_(module: nn.Module, gain: float) -> nn.Module:
    """Orthogonally initialise ``module``'s weight with ``gain`` and zero its bias, in place.

    Applies to ``nn.Linear`` and ``nn.Conv*`` layers (a conv weight is treated as a
    ``[out_channels, in_channels * kh * kw]`` matrix, as ``torch.nn.init.orthogonal_``
    does). Other modules are returned unchanged. Returns ``module`` for chaining.
    """
    if isinstance(module, nn.Linear | nn.Conv1d | nn.Conv2d | nn.Conv3d):
        nn.init.orthogonal_(module.weight, gain=gain)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    return module


#: ``--init`` schemes of :func:`reinit_` (``orthogonal``: the builders' own, left as built)
INITS = ("orthogonal", "torch", "gymnax")

#: flax's ``lecun_normal`` draws from a normal truncated at two standard deviations and
#: divides by that distribution's std, so the weights' variance is exactly 1 / fan-in
#: (``jax.nn.initializers.variance_scaling``, "truncated_normal")
_TRUNCATED_NORMAL_STD = 0.87962566103423978


def reinit_(module: nn.Module, scheme: str) -> nn.Module:
    """Re-initialise every ``nn.Linear`` and ``nn.Conv*`` layer inside ``module``, in place.

    - ``"orthogonal"``: nothing (the builders' orthogonal initialisation stays).
    - ``"torch"``: PyTorch's default (``reset_parameters``: Kaiming-uniform weights with
      ``a = sqrt(5)``, uniform biases), as SB3 with ``ortho_init=False``.
    - ``"gymnax"``: gymnax-blines' ``CategoricalSeparateMLP`` / ``GaussianSeparateMLP``:
      flax's default ``nn.Dense`` weights (LeCun normal: a normal truncated at +-2 std,
      variance 1 / fan-in) on every layer, output heads included, and biases uniform in
      ``[0, 0.05)`` (its ``default_mlp_init``).

    Parameters that are not a layer's (a Gaussian policy's log-std) are left alone. Layers are
    visited in ``module.modules()`` order, so a seed gives the same weights every time.
    Returns ``module``.
    """
    if scheme not in INITS:
        raise ValueError(f"unknown initialisation {scheme!r}: use one of {', '.join(INITS)}")
    if scheme == "orthogonal":
        return module
    for layer in module.modules():
        if not isinstance(layer, nn.Linear | nn.Conv1d | nn.Conv2d | nn.Conv3d):
            continue
        if scheme == "torch":
            layer.reset_parameters()
            continue
        fan_in = layer.weight[0].numel()
        std = math.sqrt(1.0 / fan_in) / _TRUNCATED_NORMAL_STD
        with torch.no_grad():
            nn.init.trunc_normal_(layer.weight, std=std, a=-2.0 * std, b=2.0 * std)
            if layer.bias is not None:
                nn.init.uniform_(layer.bias, 0.0, 0.05)
    return module


def _check_sizes(in_features: int, hidden: Sequence[int]) -> tuple[int, ...]:
    if not isinstance(in_features, int) or in_features < 1:
        raise ValueError(f"in_features must be a positive int, got {in_features!r}")
    if isinstance(hidden, int):
        raise TypeError(
            f"hidden must be a sequence of layer widths, e.g. ({hidden},), not {hidden}"
        )
    hidden = tuple(hidden)
    if any(not isinstance(h, int) or h < 1 for h in hidden):
        raise ValueError(f"hidden widths must be positive ints, got {hidden!r}")
    return hidden


def mlp_body(
    in_features: int,
    *,
    hidden: Sequence[int] = (64, 64),
    activation: str | type[nn.Module] = "tanh",
    layer_norm: bool = False,
) -> nn.Sequential:
    """Hidden layers only: ``[Linear -> (LayerNorm) -> act] * len(hidden)``.

    The output has ``hidden[-1]`` features (``in_features`` when ``hidden`` is empty, in
    which case the body is the identity). Weights are orthogonal with gain
    :math:`\\sqrt{2}`, biases zero. Use it as a shared trunk or a feature extractor.
    """
    hidden = _check_sizes(in_features, hidden)
    act = resolve_activation(activation)
    layers: list[nn.Module] = []
    width = in_features
    for h in hidden:
        layers.append(init_orthogonal_(nn.Linear(width, h), HIDDEN_GAIN))
        if layer_norm:
            layers.append(nn.LayerNorm(h))
        layers.append(act())
        width = h
    return nn.Sequential(*layers)


def mlp(
    in_features: int,
    out_features: int,
    *,
    hidden: Sequence[int] = (64, 64),
    activation: str | type[nn.Module] = "tanh",
    layer_norm: bool = False,
    out_gain: float = 1.0,
) -> nn.Sequential:
    """Multi-layer perceptron ``in_features -> hidden... -> out_features``.

    Layout: :func:`mlp_body` followed by a linear output layer with no activation.
    Hidden weights are orthogonal with gain :math:`\\sqrt{2}`, the output weight with
    ``out_gain``, all biases zero (CleanRL's ``layer_init``, SB3's ``init_weights``).
    Works on inputs ``[*, in_features]`` with any leading dimensions.

    Args:
        in_features: input width.
        out_features: output width.
        hidden: hidden widths; ``()`` gives a single linear layer.
        activation: ``"tanh"`` (PPO default), ``"relu"`` (DQN/SAC default), another name
            in :data:`ACTIVATIONS`, or an ``nn.Module`` class.
        layer_norm: insert ``nn.LayerNorm`` after each hidden linear layer.
        out_gain: orthogonal gain of the output layer; 0.01 for policy heads, 1.0 for
            value heads.

    Example:
        >>> net = mlp(4, 2, hidden=(32,), activation="relu", out_gain=0.01)
        >>> net(torch.zeros(5, 3, 4)).shape
        torch.Size([5, 3, 2])
    """
    if not isinstance(out_features, int) or out_features < 1:
        raise ValueError(f"out_features must be a positive int, got {out_features!r}")
    body = mlp_body(in_features, hidden=hidden, activation=activation, layer_norm=layer_norm)
    width = hidden[-1] if len(hidden) else in_features
    body.append(init_orthogonal_(nn.Linear(width, out_features), out_gain))
    return body


def _as_float_image(x: torch.Tensor) -> torch.Tensor:
    """uint8 pixels in [0, 255] -> float in [0, 1]; floating inputs pass unchanged."""
    if x.dtype == torch.uint8:
        return x.float().div_(255.0)
    if not x.is_floating_point():
        raise TypeError(f"images must be uint8 or floating point, got dtype {x.dtype}")
    return x


class _ImageEncoder(nn.Module):
    """Shared plumbing: flatten leading batch dims, scale uint8, run ``self.net``."""

    net: nn.Module
    in_shape: tuple[int, int, int]
    out_features: int

    def _check_shape(self, in_shape: Sequence[int]) -> tuple[int, int, int]:
        in_shape = tuple(int(s) for s in in_shape)
        if len(in_shape) != 3 or min(in_shape) < 1:
            raise ValueError(
                f"{type(self).__name__} needs in_shape=(C, H, W) of positive ints, got "
                f"{in_shape!r}; for stacked frames merge the stack into C"
            )
        return in_shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-3:] != self.in_shape:
            raise ValueError(
                f"{type(self).__name__} built for images [*, C, H, W] = [*, "
                f"{', '.join(map(str, self.in_shape))}], got a tensor of shape "
                f"{list(x.shape)}; images must be channels-first (use a ToTensorImage / "
                "PermuteTransform on the env)"
            )
        lead = x.shape[:-3]
        out = self.net(_as_float_image(x).reshape(-1, *self.in_shape))
        return out.reshape(*lead, self.out_features)


def _conv_out(size: int, kernel: int, stride: int, padding: int = 0) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _check_features(features: int) -> int:
    if isinstance(features, bool) or not isinstance(features, int) or features < 1:
        raise ValueError(
            f"features (the encoder's output width) must be a positive int, got {features!r}"
        )
    return features


class NatureCNN(_ImageEncoder):
    """The DQN encoder of Mnih et al. (2015), "Human-level control through deep RL".

    ``conv(32, 8x8, s4) -> ReLU -> conv(64, 4x4, s2) -> ReLU -> conv(64, 3x3, s1) -> ReLU
    -> flatten -> Linear(features) -> ReLU``, orthogonal init with gain :math:`\\sqrt{2}`
    and zero biases (SB3 / CleanRL Atari).

    Input: images ``[*, C, H, W]`` with any leading dims, uint8 (divided by 255) or float
    (used as is). Output: ``[*, features]``; ``out_features`` holds the width.

    Args:
        in_shape: ``(C, H, W)``, e.g. ``(4, 84, 84)`` for four stacked Atari frames.
        features: width of the final dense layer (512 in the paper).

    Example:
        >>> enc = NatureCNN((4, 84, 84))
        >>> enc(torch.zeros(2, 1, 4, 84, 84, dtype=torch.uint8)).shape
        torch.Size([2, 1, 512])
    """

    def __init__(self, in_shape: Sequence[int], *, features: int = 512) -> None:
        super().__init__()
        self.in_shape = self._check_shape(in_shape)
        c, h, w = self.in_shape
        for k, s in ((8, 4), (4, 2), (3, 1)):
            h, w = _conv_out(h, k, s), _conv_out(w, k, s)
        if h < 1 or w < 1:
            raise ValueError(
                f"NatureCNN needs images of at least 36x36, got {in_shape!r}: use ImpalaCNN or "
                "MinAtarCNN (--encoder impala or minatar) for smaller images"
            )
        self.out_features = _check_features(features)
        self.net = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * h * w, features),
            nn.ReLU(),
        )
        for m in self.net:
            init_orthogonal_(m, HIDDEN_GAIN)


class _ResidualBlock(nn.Module):
    """``x + conv(relu(conv(relu(x))))`` with 3x3 convs that keep the channel count."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = init_orthogonal_(nn.Conv2d(channels, channels, 3, padding=1), HIDDEN_GAIN)
        self.conv1 = init_orthogonal_(nn.Conv2d(channels, channels, 3, padding=1), HIDDEN_GAIN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


def _impala_stack(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        init_orthogonal_(nn.Conv2d(in_channels, out_channels, 3, padding=1), HIDDEN_GAIN),
        nn.MaxPool2d(3, stride=2, padding=1),
        _ResidualBlock(out_channels),
        _ResidualBlock(out_channels),
    )


class ImpalaCNN(_ImageEncoder):
    """The IMPALA residual encoder of Espeholt et al. (2018), as used for Procgen.

    Per stack: ``conv(c, 3x3) -> maxpool(3x3, s2, pad 1) -> 2 residual blocks``, with
    ``channels = (16, 32, 32)``; then ``ReLU -> flatten -> Linear(features) -> ReLU``.
    Each stack halves H and W (rounding up), so 64x64 becomes 8x8. Orthogonal init with gain
    :math:`\\sqrt{2}`, zero biases.

    Input: ``[*, C, H, W]``, uint8 (divided by 255) or float. Output: ``[*, features]``.

    Args:
        in_shape: ``(C, H, W)``, e.g. ``(3, 64, 64)`` for Procgen.
        channels: output channels of each stack.
        features: width of the final dense layer (256 in the paper).

    Example:
        >>> enc = ImpalaCNN((3, 64, 64))
        >>> enc(torch.zeros(2, 3, 64, 64)).shape
        torch.Size([2, 256])
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        *,
        channels: Sequence[int] = (16, 32, 32),
        features: int = 256,
    ) -> None:
        super().__init__()
        self.in_shape = self._check_shape(in_shape)
        c, h, w = self.in_shape
        stacks = []
        for out_c in channels:
            stacks.append(_impala_stack(c, out_c))
            c, h, w = out_c, _conv_out(h, 3, 2, 1), _conv_out(w, 3, 2, 1)
        self.out_features = _check_features(features)
        self.net = nn.Sequential(
            *stacks,
            nn.ReLU(),
            nn.Flatten(),
            init_orthogonal_(nn.Linear(c * h * w, features), HIDDEN_GAIN),
            nn.ReLU(),
        )


class MinAtarCNN(_ImageEncoder):
    """The MinAtar network of Young & Tian (2019), "MinAtar: An Atari-Inspired Testbed".

    ``conv(16, 3x3, s1, no padding) -> ReLU -> flatten -> Linear(features) -> ReLU``: on
    MinAtar's 10x10 frames the conv gives 16 x 8 x 8 = 1024 features before the dense layer
    (the reference DQN, ``MinAtar/examples/dqn.py``). Orthogonal init with gain
    :math:`\\sqrt{2}`, zero biases, as the other encoders here.

    Input: ``[*, C, H, W]``, uint8 (divided by 255) or float. Output: ``[*, features]``.

    Args:
        in_shape: ``(C, H, W)``, e.g. ``(4, 10, 10)`` for MinAtar Breakout.
        features: width of the dense layer (128 in the paper).

    Example:
        >>> enc = MinAtarCNN((4, 10, 10))
        >>> enc(torch.zeros(2, 4, 10, 10, dtype=torch.uint8)).shape
        torch.Size([2, 128])
    """

    def __init__(self, in_shape: Sequence[int], *, features: int = 128) -> None:
        super().__init__()
        self.in_shape = self._check_shape(in_shape)
        c, h, w = self.in_shape
        h, w = _conv_out(h, 3, 1), _conv_out(w, 3, 1)
        if h < 1 or w < 1:
            raise ValueError(f"MinAtarCNN needs images of at least 3x3, got {in_shape!r}")
        self.out_features = _check_features(features)
        self.net = nn.Sequential(
            nn.Conv2d(c, 16, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(16 * h * w, features),
            nn.ReLU(),
        )
        for m in self.net:
            init_orthogonal_(m, HIDDEN_GAIN)


class FlatImage(_ImageEncoder):
    """No convolution: the image flattened to one vector (``C x H x W`` features), for an MLP
    after it (``--encoder flatten --hidden 256 256``), as gymnax-blines' MinAtar PPO
    (``flatten_3d``) and most PureJaxRL MinAtar baselines feed MinAtar's small frames.

    Input: ``[*, C, H, W]``, uint8 (divided by 255) or float. Output: ``[*, C * H * W]``.

    Example:
        >>> FlatImage((4, 10, 10))(torch.zeros(2, 4, 10, 10, dtype=torch.uint8)).shape
        torch.Size([2, 400])
    """

    def __init__(self, in_shape: Sequence[int], *, features: int | None = None) -> None:
        super().__init__()
        self.in_shape = self._check_shape(in_shape)
        c, h, w = self.in_shape
        if features is not None and features != c * h * w:
            raise ValueError(
                f"--encoder flatten has no layer to size: its width is the image's C x H x W "
                f"= {c * h * w}, got --feature-dim {features}; size the layers after it with "
                "--hidden, or drop --feature-dim"
            )
        self.out_features = c * h * w
        self.net = nn.Flatten()


class ChannelsLast(nn.Module):
    """Run a channels-first image encoder on ``[*, H, W, C]`` images (gymnasium's layout).

    Moves the channel axis in front of H and W (a view, no copy), so uint8 frames stay uint8
    until the encoder scales them. ``out_features`` is the encoder's.
    """

    def __init__(self, encoder: _ImageEncoder) -> None:
        super().__init__()
        self.encoder, self.out_features = encoder, encoder.out_features
        c, h, w = encoder.in_shape
        self.in_shape = (h, w, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-3:] != self.in_shape:
            raise ValueError(
                f"{type(self.encoder).__name__} built for channels-last images [*, H, W, C] = "
                f"[*, {', '.join(map(str, self.in_shape))}], got a tensor of shape "
                f"{list(x.shape)}"
            )
        return self.encoder(x.movedim(-1, -3))


#: ``--encoder`` choices: ``mlp`` (flat vector observations, no encoder module) and the image
#: encoders by name, with their papers' feature widths as defaults
ENCODERS: dict[str, type[_ImageEncoder] | None] = {
    "mlp": None,
    "nature": NatureCNN,
    "impala": ImpalaCNN,
    "minatar": MinAtarCNN,
    "flatten": FlatImage,
}
IMAGE_ENCODERS = "|".join(name for name, cls in ENCODERS.items() if cls is not None)


def image_layout(
    shape: Sequence[int], *, channels_last: bool | None = None
) -> tuple[tuple[int, int, int], bool]:
    """``((C, H, W), channels_last)`` of one image observation's shape.

    ``channels_last=None`` guesses: channels-last ``[H, W, C]`` (gymnasium's layout, e.g.
    ``(96, 96, 3)``, MinAtar's ``(10, 10, 7)``) unless the first axis is smaller than the last
    (``(4, 84, 84)`` is channels-first). A square stack such as ``(10, 10, 10)`` counts as
    channels-last; pass ``channels_last=False`` for a channels-first one.

    Example:
        >>> image_layout((84, 84, 4))
        ((4, 84, 84), True)
        >>> image_layout((3, 64, 64))
        ((3, 64, 64), False)
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3:
        raise ValueError(f"an image has shape [H, W, C] or [C, H, W], got {list(shape)}")
    if channels_last is None:
        channels_last = shape[0] >= shape[-1]
    if channels_last:
        return (shape[2], shape[0], shape[1]), True
    return shape, False


def make_encoder(
    name: str,
    obs_shape: Sequence[int],
    *,
    feature_dim: int | None = None,
    channels_last: bool | None = None,
) -> tuple[nn.Module | None, int]:
    """The feature extractor ``--encoder name`` puts before the MLP layers, and its width.

    ``"mlp"``: no module (the MLP reads the flat observation); the width is the observation's.
    ``"nature"`` (:class:`NatureCNN`, Mnih et al. 2015), ``"impala"`` (:class:`ImpalaCNN`,
    Espeholt et al. 2018), ``"minatar"`` (:class:`MinAtarCNN`, Young & Tian 2019) and
    ``"flatten"`` (:class:`FlatImage`: the pixels as one vector, for the MLP after it): image
    observations ``[H, W, C]`` or ``[C, H, W]`` (:func:`image_layout`; channels-last ones are
    wrapped in :class:`ChannelsLast`), uint8 pixels scaled to [0, 1] inside the encoder.

    Args:
        name: one of :data:`ENCODERS`.
        obs_shape: one observation's shape (without the env batch dims).
        feature_dim: the image encoder's output width (rllte's ``feature_dim``); None: the
            paper's, 512 (nature), 256 (impala), 128 (minatar). Not for ``"mlp"``.
        channels_last: the image layout; None guesses it (:func:`image_layout`).

    Raises:
        ValueError: an unknown name, an MLP on images or a flat observation for an image
        encoder (each naming the ``--encoder`` to use instead), ``feature_dim`` with mlp.

    Example:
        >>> enc, width = make_encoder("minatar", (10, 10, 4))
        >>> width, enc(torch.zeros(8, 10, 10, 4, dtype=torch.uint8)).shape
        (128, torch.Size([8, 128]))
    """
    if name not in ENCODERS:
        raise ValueError(f"unknown encoder {name!r}: use one of {', '.join(ENCODERS)}")
    shape = tuple(int(s) for s in obs_shape)
    cls = ENCODERS[name]
    if cls is None:
        if feature_dim is not None:
            raise ValueError(
                "--feature-dim sizes an image encoder's output; --encoder mlp has none (its "
                "layers are --hidden): drop --feature-dim or pick an image encoder"
            )
        if len(shape) == 3:
            raise ValueError(
                f"--encoder mlp got image observations of shape {shape}: use --encoder "
                f"{IMAGE_ENCODERS}"
            )
        if len(shape) != 1:
            raise ValueError(
                f"--encoder mlp needs flat vector observations, got shape {list(shape)}"
            )
        return None, shape[0]
    if len(shape) != 3:
        raise ValueError(
            f"--encoder {name} needs image observations [H, W, C] or [C, H, W], got shape "
            f"{list(shape)}; use --encoder mlp for vector observations"
        )
    chw, last = image_layout(shape, channels_last=channels_last)
    kw = {} if feature_dim is None else {"features": feature_dim}
    encoder = cls(chw, **kw)
    return (ChannelsLast(encoder) if last else encoder), encoder.out_features
