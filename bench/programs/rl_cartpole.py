"""REINFORCE on a pure-Python CartPole (classic equations of Barto et al., Euler step): each
training step plays one episode (at most 40 env steps) -- observation list -> tensor, policy MLP,
torch.multinomial action read back with .item(), Python physics -- then computes discounted,
normalized returns in Python and takes one Adam step. Episode length depends on the policy."""
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.programs import _common

NAME = "rl_cartpole"
DESCRIPTION = "REINFORCE, pure-Python CartPole, .item() action per env step, episode <= 40 steps"
MAX_STEPS = 40


class CartPole:
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02

    def __init__(self, rng):
        self.rng = rng
        self.s = None

    def reset(self):
        self.s = [self.rng.uniform(-0.05, 0.05) for _ in range(4)]
        return list(self.s)

    def step(self, action):
        x, x_dot, th, th_dot = self.s
        force = self.force_mag if action == 1 else -self.force_mag
        total = self.masscart + self.masspole
        pml = self.masspole * self.length
        cos, sin = math.cos(th), math.sin(th)
        temp = (force + pml * th_dot * th_dot * sin) / total
        th_acc = (self.gravity * sin - cos * temp) / (self.length * (4.0 / 3.0 - self.masspole * cos * cos / total))
        x_acc = temp - pml * th_acc * cos / total
        x, x_dot = x + self.tau * x_dot, x_dot + self.tau * x_acc
        th, th_dot = th + self.tau * th_dot, th_dot + self.tau * th_acc
        self.s = [x, x_dot, th, th_dot]
        done = abs(x) > 2.4 or abs(th) > 12 * 2 * math.pi / 360
        return list(self.s), 1.0, done


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 64)
        self.fc2 = nn.Linear(64, 2)

    def forward(self, obs):
        return F.softmax(self.fc2(torch.tanh(self.fc1(obs))), dim=-1)


def make(seed=0):
    torch.manual_seed(seed)
    policy = Policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    state = {"model": policy, "opt": opt, "env": CartPole(random.Random(seed)), "gamma": 0.99,
             "episode_lengths": []}
    return _common.register(state, {"model": policy}, {"opt": opt})


def step(state):
    env, policy = state["env"], state["model"]
    obs = env.reset()
    log_probs, rewards = [], []
    for _ in range(MAX_STEPS):
        probs = policy(torch.tensor(obs, dtype=torch.float32))
        action = torch.multinomial(probs, 1).item()
        log_probs.append(torch.log(probs[action]))
        obs, reward, done = env.step(action)
        rewards.append(reward)
        if done:
            break
    state["episode_lengths"].append(len(rewards))
    returns, g = [], 0.0
    for r in reversed(rewards):
        g = r + state["gamma"] * g
        returns.append(g)
    returns.reverse()
    mean = sum(returns) / len(returns)
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns)) + 1e-8
    ret = torch.tensor([(r - mean) / std for r in returns])
    loss = -(torch.stack(log_probs) * ret).sum()
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    return loss


def train(state, steps):
    for _ in range(steps):
        step(state)


final_state = _common.final_state


def jit_targets(state):
    return {"model": (torch.zeros(4),)}
