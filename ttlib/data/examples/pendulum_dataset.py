"""Write an offline dataset of your own as a Minari dataset that `ttlib train --dataset ID` reads.

The example: Pendulum-v1 (observation cos(theta), sin(theta), angular velocity; one torque in [-2, 2]; 200 steps
per episode), half of the episodes flown by a scripted swing-up controller with noise on its torque, half by
uniformly random torques -- mixed quality, like the course dataset (800 episodes, 160,000 steps: a Trajectory
Transformer needs many of the controller's swings to learn when to stop pushing; %BC's MLP needs far fewer). Run
it, then train on it:

    python -m ttlib.data.examples.pendulum_dataset                      # writes user/pendulum/mixed-v0 (seconds)
    ttlib train --dataset user/pendulum/mixed-v0 --top-percent 50 --strategy uniform --value-embedding \
        --out runs/pendulum.safetensors                                 # 4,750 steps: 20-25 min on one CPU thread

`--top-percent 50` learns from the controller's half. `--strategy uniform` places the bins evenly: the controller
spends most of its steps balancing, upright and slow, so quantile bins (the default) would leave the speeds of its
swings a handful of wide bins, too coarse to tell when to stop pushing. `--value-embedding` adds to each token its
bin's value, so that neighbouring bins start alike. What each buys: docs/RESULTS.md, "A dataset of your own".

Anything that produces, per episode, the observations (one more than the actions: the one after the last step),
actions, rewards, terminations and truncations can be written the same way (`write_dataset` below).
"""

from __future__ import annotations

import argparse
import warnings

import gymnasium as gym
import minari
import numpy as np
from minari.data_collector import EpisodeBuffer

__all__ = ["MAX_TORQUE", "collect", "main", "swing_up", "write_dataset"]

MAX_TORQUE = 2.0


def swing_up(obs: np.ndarray) -> float:
    """A scripted controller: pump energy until the pendulum is near the top, then balance it with a PD law.

    The pendulum's energy E = theta_dot^2 / 2 + 15 cos(theta) (15 = 3g / 2l) is 15 upright and at rest;
    torque along theta_dot adds energy, so pushing with the swing until E reaches 15 brings it up."""
    cos, sin, speed = obs
    theta = np.arctan2(sin, cos)  # 0 upright
    if cos > 0.85:  # near the top: balance
        return float(np.clip(-12.0 * theta - 2.5 * speed, -MAX_TORQUE, MAX_TORQUE))
    energy = 0.5 * speed**2 + 15.0 * cos
    push = np.sign(speed if speed != 0 else 1.0) * np.sign(15.0 - energy)
    return float(MAX_TORQUE * push)


def collect(n_episodes: int, seed: int = 0, noise: float = 0.5):
    """Episodes alternating behaviours: 'expert' (swing_up plus Gaussian torque noise of std `noise`) and
    'random' (uniform torques). -> (list of EpisodeBuffer, the env, mean return per behaviour)."""
    env = gym.make("Pendulum-v1")
    rng = np.random.default_rng(seed)
    buffers, returns = [], {"expert": [], "random": []}
    for episode in range(n_episodes):
        behaviour = ("expert", "random")[episode % 2]
        obs, _ = env.reset(seed=seed * 100_000 + episode)
        observations, actions, rewards, terminations, truncations = [obs], [], [], [], []
        done = False
        while not done:
            if behaviour == "expert":
                torque = swing_up(obs) + noise * rng.standard_normal()
            else:
                torque = rng.uniform(-MAX_TORQUE, MAX_TORQUE)
            action = np.clip([torque], -MAX_TORQUE, MAX_TORQUE).astype(np.float32)
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(float(reward))
            terminations.append(terminated)
            truncations.append(truncated)
            done = terminated or truncated
        returns[behaviour].append(sum(rewards))
        buffers.append(EpisodeBuffer(observations=np.stack(observations), actions=np.stack(actions),
                                     rewards=rewards, terminations=terminations, truncations=truncations,
                                     infos={"behaviour": [behaviour] * (len(rewards) + 1)}))  # one per obs
    return buffers, env, {b: float(np.mean(r)) for b, r in returns.items() if r}


def write_dataset(dataset_id: str, buffers, env: gym.Env, ref_min: float, ref_max: float):
    """Write the episodes where Minari keeps its datasets (MINARI_DATASETS_PATH, default ~/.minari/datasets)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Minari asks for an author and a code link
        return minari.create_dataset_from_buffers(dataset_id, buffers, env=env.spec, ref_min_score=ref_min,
                                                  ref_max_score=ref_max)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="user/pendulum/mixed-v0", help="Minari id to write")
    parser.add_argument("--episodes", type=int, default=800, help="200 steps each")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    buffers, env, means = collect(args.episodes, args.seed)
    write_dataset(args.dataset, buffers, env, ref_min=means.get("random", 0.0), ref_max=means["expert"])
    env.close()
    steps = sum(len(b.rewards) for b in buffers)
    print(f"{args.dataset}: {len(buffers)} episodes, {steps} steps; mean return "
          + ", ".join(f"{b} {m:.1f}" for b, m in means.items()))


if __name__ == "__main__":
    main()
