"""RND-PPO: Exploration by Random Network Distillation (Burda et al. 2018), twin critic.

    python recipes/rnd.py                                  # MountainCar, sparse reward
    python recipes/rnd.py --env MountainCar-v0             # MountainCar-v0's -1 per step
    python recipes/rnd.py --int-coef 0                     # the same agent without the bonus
    python recipes/rnd.py --target-return -160 --seed 3    # stop once solved
    python recipes/rnd.py --accelerator cpu --devices 2 --strategy ddp
    python recipes/rnd.py --help                           # every flag

Algorithm box:
    1. config      RNDConfig (defaults, per-env preset, --config YAML, flags)
    2. networks    actor pi(a|s); twin critic V_ext(s), V_int(s) (one trunk, two heads);
                   RND: frozen random target f, trained predictor f_hat
    3. bonus       r_int = ||f_hat(s') - f(s')||^2 / std(discounted intrinsic return)
    4. estimator   TwinGAE: extrinsic GAE (episodic, gamma), intrinsic GAE (non-episodic,
                   gamma_int)
    5. losses      PPO clipped surrogate on ext_coef * A_ext + int_coef * A_int, both value
                   heads' regressions, entropy bonus; predictor MSE on s' of a random
                   update_proportion of each minibatch
    6. learner     epochs x minibatches, the two losses in lockstep (policy/critic
                   optimizer and predictor optimizer)
    7. fit         the engine: collect, update, evaluate, checkpoint
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkit.objectives.rnd import RNDPPOLoss, RNDPredictorLoss, TwinGAE
from rlkit.training import cli, parse_config, run
from rlkit.training.rnd import RNDConfig, RNDLearner, build_rnd_networks


# 1. config ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RNDRecipeConfig(RNDConfig):
    """Train RND-PPO. Defaults explore MountainCar with a sparse reward (1 at the goal, 0
    otherwise), scored on MountainCar-v0's return; flags override."""

    env: str = "rlkit/MountainCarSparse-v0"
    total_frames: int = field(default=1_000_000, metadata={"help": "frames to train for"})
    num_envs: int = 32
    rollout_steps: int = 128
    epochs: int = 4
    minibatch_size: int = 1024
    lr: float = field(default=3e-4, metadata={"help": "learning rate"})
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE lambda (both streams)"})
    entropy_coef: float = 0.001
    normalize_obs: bool = field(
        default=True, metadata={"help": "running observation normalisation (policy, critic)"}
    )
    normalize_reward: bool = field(
        default=True,
        metadata={"help": "scale extrinsic rewards by the std of their discounted return"},
    )
    eval_every: int = field(default=25_000, metadata={"help": "evaluate every this many frames"})


#: Settings that override the defaults for an environment (flags and --config still win).
PRESETS: dict[str, dict] = {
    # trained on 0/1 rewards, scored on MountainCar-v0's return (-steps to the goal, -200 if
    # never), with sampled actions: the argmax of a near-uniform policy often swings the car
    # to the goal by chance, the policy that acts does not (docs/recipes/rnd.md)
    "rlkit/MountainCarSparse-v0": dict(eval_env="MountainCar-v0", eval_deterministic=False),
}


# 2-6. networks, bonus, estimator, loss, learner ---------------------------------------------
def build(cfg: RNDConfig, env) -> RNDLearner:
    actor, critic, rnd, obs_norm = build_rnd_networks(cfg, env)
    estimator = TwinGAE(
        gamma=cfg.gamma, gamma_int=cfg.gamma_int, lmbda=cfg.gae_lambda, value_network=critic
    )
    loss = RNDPPOLoss(
        actor,
        critic,
        ext_coef=cfg.ext_coef,
        int_coef=cfg.int_coef,
        clip_epsilon=cfg.clip_epsilon,
        entropy_coef=cfg.entropy_coef,
        value_coef=cfg.value_coef,
        value_clip_epsilon=cfg.value_clip,
        normalize_advantage=cfg.normalize_advantage,
    )
    return RNDLearner(
        actor=actor,
        critic=critic,
        rnd=rnd,
        estimator=estimator,
        loss=loss,
        cfg=cfg,
        obs_norm=obs_norm,
        loss_schedules=cfg.loss_schedules,
        predictor_loss=RNDPredictorLoss(rnd),
    )


# 7. fit -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    cfg = parse_config(RNDRecipeConfig, argv, presets=PRESETS, description=__doc__)
    return run(cfg, build, algo="rnd")


if __name__ == "__main__":
    cli(main)
