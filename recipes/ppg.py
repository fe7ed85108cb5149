"""PPG: Phasic Policy Gradient (Cobbe et al. 2020).

    python recipes/ppg.py                                  # CartPole-v1, built-in defaults
    python recipes/ppg.py --env LunarLander-v3             # preset
    python recipes/ppg.py --env CarRacing-v3 --encoder impala   # pixels: IMPALA-CNN preset
    python recipes/ppg.py --arch shared --aux-optimizer shared  # single-network variant
    python recipes/ppg.py --accelerator cpu --devices 2 --strategy ddp
    python recipes/ppg.py --help                           # every flag

Algorithm box:
    1. config      PPGConfig (defaults, per-env preset, --config YAML, flags)
    2. networks    policy net (trunk -> pi head, trunk -> aux value head) and value net
                   (dual), or one trunk with a detached value head (shared)
    3. estimator   GAE(gamma, lambda) writes advantage and value_target
    4. losses      policy phase: PPO clipped surrogate + value regression + entropy;
                   aux phase: aux value + beta_clone * KL(pi_old || pi) + true value
    5. learner     n_pi policy-phase batches (the actor --epochs, the critic --value-epochs,
                   each with its own Adam), then aux_epochs over the stored rollouts
    6. fit         the engine: collect, update, evaluate, checkpoint
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkit.objectives import PPGAuxLoss, PPOLoss
from rlkit.training import cli, parse_config, run
from rlkit.training.ppg import PPGConfig, PPGLearner, build_ppg_networks
from rlkit.value import GAE


# 1. config ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PPGRecipeConfig(PPGConfig):
    """Train PPG. Defaults solve CartPole-v1; flags override (see --help)."""

    total_frames: int = field(default=200_000, metadata={"help": "frames to train for"})
    rollout_steps: int = 32
    epochs: int = field(default=10, metadata={"help": "policy epochs per batch"})
    minibatch_size: int = 128
    lr: float = field(default=1e-3, metadata={"help": "initial learning rate"})
    lr_schedule: str = "linear"
    gamma: float = 0.98
    gae_lambda: float = 0.8
    n_pi: int = field(default=8, metadata={"help": "policy-phase iterations per phase"})
    clip_epsilon_final: float | None = 0.0


#: Settings that override the defaults for an environment (flags and --config still win).
PRESETS: dict[str, dict] = {
    "LunarLander-v3": dict(
        total_frames=1_000_000,
        num_envs=16,
        rollout_steps=128,
        epochs=4,
        minibatch_size=128,
        lr=5e-4,
        gamma=0.999,
        gae_lambda=0.98,
        entropy_coef=0.01,
        n_pi=8,
        clip_epsilon_final=None,
        target_return=None,
    ),
    # pixel observations: the paper's Procgen settings, scaled to a CPU-sized batch
    "CarRacing-v3": dict(
        encoder="impala",
        num_envs=8,
        rollout_steps=64,
        epochs=1,
        minibatch_size=256,
        lr=5e-4,
        gamma=0.99,
        gae_lambda=0.95,
        entropy_coef=0.01,
        n_pi=32,
        clip_epsilon_final=None,
        hidden=(256,),
        activation="relu",
    ),
}


# 2-5. networks, estimator, losses, learner --------------------------------------------------
def build(cfg: PPGConfig, env) -> PPGLearner:
    nets = build_ppg_networks(cfg, env)
    estimator = GAE(gamma=cfg.gamma, lmbda=cfg.gae_lambda, value_network=nets.critic)
    loss = PPOLoss(
        nets.actor,
        nets.critic,
        clip_epsilon=cfg.clip_epsilon,
        entropy_coef=cfg.entropy_coef,
        value_coef=cfg.value_coef,
        value_clip_epsilon=cfg.value_clip,
        normalize_advantage=cfg.normalize_advantage and not cfg.full_batch_advantage_norm,
    )
    aux_loss = PPGAuxLoss(
        nets.actor,
        nets.critic,
        nets.aux_critic,
        beta_clone=cfg.beta_clone,
        aux_value_coef=cfg.aux_value_coef,
        value_coef=cfg.aux_true_value_coef,
        value_clip_epsilon=cfg.value_clip,
    )
    return PPGLearner(
        nets=nets,
        estimator=estimator,
        loss=loss,
        aux_loss=aux_loss,
        cfg=cfg,
        loss_schedules=cfg.loss_schedules,
    )


# 6. fit -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    cfg = parse_config(PPGRecipeConfig, argv, presets=PRESETS, description=__doc__)
    return run(cfg, build, algo="ppg")


if __name__ == "__main__":
    cli(main)
