"""A small Dict-observation task where both entries matter (issue 47, "Dict observations").

``ImageVector``: each step shows an image ``[6, 6, 2]`` uint8 with one lit pixel (255) at a
random place in channel ``a`` and a vector ``[4]`` float32 whose first two entries are the
one-hot of a bit ``b`` (the last two are noise in [-1, 1]). Of 4 actions, ``2 a + b`` pays
+1, any other 0; an episode lasts 8 steps. A policy that reads both entries scores 8, one
that reads only the image or only the vector at most 4 (it knows one bit of two), a random
one 2.

``flat=True`` gives the same task as one flat float32 observation of the same size (the
image's 72 pixels scaled to [0, 1], then the vector: ``[76]``), the baseline of the
frames/s comparison (``benchmarks/bench_dictobs.py``). ``image`` / ``vector`` resize the
entries for that benchmark.
"""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces

EPISODE = 8


class ImageVector(gymnasium.Env):
    metadata: dict = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        flat: bool = False,
        image: tuple[int, int, int] = (6, 6, 2),
        vector: int = 4,
        render_mode: str | None = None,
    ) -> None:
        self.flat, self.shape, self.width = flat, tuple(image), int(vector)
        self.render_mode = render_mode
        h, w, c = self.shape
        if c < 2 or self.width < 2:
            raise ValueError("ImageVector needs 2+ channels and a vector of 2+ entries")
        if flat:
            size = h * w * c + self.width
            self.observation_space = spaces.Box(-1.0, 1.0, (size,), np.float32)
        else:
            self.observation_space = spaces.Dict(
                {
                    "image": spaces.Box(0, 255, self.shape, np.uint8),
                    "vector": spaces.Box(-1.0, 1.0, (self.width,), np.float32),
                }
            )
        self.action_space = spaces.Discrete(4)
        self._t, self._a, self._b = 0, 0, 0
        self._image = np.zeros(self.shape, np.uint8)
        self._vector = np.zeros(self.width, np.float32)

    def _draw(self):
        h, w, _ = self.shape
        self._a, self._b = int(self.np_random.integers(2)), int(self.np_random.integers(2))
        self._image = np.zeros(self.shape, np.uint8)
        self._image[self.np_random.integers(h), self.np_random.integers(w), self._a] = 255
        self._vector = np.zeros(self.width, np.float32)
        self._vector[self._b] = 1.0
        self._vector[2:] = self.np_random.uniform(-1.0, 1.0, self.width - 2)
        if self.flat:
            pixels = self._image.reshape(-1).astype(np.float32) / 255.0
            return np.concatenate([pixels, self._vector])
        return {"image": self._image, "vector": self._vector}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._draw(), {}

    def step(self, action):
        reward = float(int(action) == 2 * self._a + self._b)
        self._t += 1
        return self._draw(), reward, self._t >= EPISODE, False, {}

    def render(self):
        frame = np.zeros((*self.shape[:2], 3), np.uint8)
        frame[..., :2] = self._image[..., :2]
        return frame


class TwoVectors(gymnasium.Env):
    """The same game with no image: a Discrete entry ``"bit"`` (``a``) and the vector
    ``[4]`` (``b`` one-hot, then noise). Action ``2 a + b`` pays +1; 8 steps; a policy that
    reads both entries scores 8, one entry at most 4, a random one 2."""

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.observation_space = spaces.Dict(
            {"bit": spaces.Discrete(2), "vector": spaces.Box(-1.0, 1.0, (4,), np.float32)}
        )
        self.action_space = spaces.Discrete(4)
        self._t, self._a, self._b = 0, 0, 0

    def _draw(self):
        self._a, self._b = int(self.np_random.integers(2)), int(self.np_random.integers(2))
        vector = np.zeros(4, np.float32)
        vector[self._b] = 1.0
        vector[2:] = self.np_random.uniform(-1.0, 1.0, 2)
        return {"bit": self._a, "vector": vector}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._draw(), {}

    def step(self, action):
        reward = float(int(action) == 2 * self._a + self._b)
        self._t += 1
        return self._draw(), reward, self._t >= EPISODE, False, {}


class MaskedImage(gymnasium.Env):
    """A uint8 image ``[5, 5, 1]`` with one lit pixel in column ``c`` of 4, and a mask that
    allows actions ``c`` and ``(c + 1) % 4`` only (the gymnasium convention: a Dict of
    ``"observation"`` and ``"action_mask"``). Action ``c`` pays +1; a masked action would
    end the episode (the test asserts it is never taken). 8 steps."""

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.observation_space = spaces.Dict(
            {
                "observation": spaces.Box(0, 255, (5, 5, 1), np.uint8),
                "action_mask": spaces.MultiBinary(4),
            }
        )
        self.action_space = spaces.Discrete(4)
        self._t, self._c = 0, 0

    def _draw(self):
        self._c = int(self.np_random.integers(4))
        image = np.zeros((5, 5, 1), np.uint8)
        image[int(self.np_random.integers(5)), self._c, 0] = 255
        mask = np.zeros(4, np.int8)
        mask[[self._c, (self._c + 1) % 4]] = 1
        return {"observation": image, "action_mask": mask}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._draw(), {}

    def step(self, action):
        allowed = {self._c, (self._c + 1) % 4}
        if int(action) not in allowed:
            raise AssertionError(f"masked action {int(action)} taken (allowed {allowed})")
        reward = float(int(action) == self._c)
        self._t += 1
        return self._draw(), reward, self._t >= EPISODE, False, {}
