"""Temperature sampling: the target's processed distribution and the one acceptance rule every method's tree goes
through when `bench.temperature > 0`.

The rule is the multi-draft recursive rejection of SpecInfer and EAGLE-2 with deterministic drafts (q = 1): at the
accepted node, with p the target's processed distribution there, try its children in layout order and accept
child t with probability p(t); on a rejection set p(t) = 0, renormalise and try the next child. When every child is
rejected, or the node has none, the next token is drawn from what remains of p. So each committed token is drawn
from exactly the target's distribution given the tokens before it, whatever the tree holds: a child's token t is
output with probability p(t), any other token t' with probability (1 - sum of the children's p) * p(t') / (1 - sum
of the children's p) = p(t'). Methods do not change: they propose trees, the rule decides.

A draft drawn at random from a known distribution q (a draft model sampling, SpS) hands q with its tree
(`DraftTree.draft_probs`); the same rule then accepts its token t with probability min(1, p(t)/q(t)) and, on a
rejection, continues from the residual max(p - q, 0), renormalised: standard speculative sampling, and SpecInfer's
rule for several sampled children. A deterministic draft is the case q = 1 on its token, which is the rule above.

Every draw comes from one seeded CPU generator, so a seed reproduces the tokens on the same machine. A method that
samples its drafts draws from the same generator (`DecodeState.sampler`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from evaluation.engine.tree import TreeInputs, Verdict


@dataclass(frozen=True)
class SamplingParams:
    """The processed target distribution: softmax(logits / temperature), then top-k, then top-p (nucleus), as
    transformers' logits processors apply them. temperature 0 is greedy decoding."""

    temperature: float = 0.0
    top_p: float = 1.0  # 1 = no nucleus filter
    top_k: int = 0  # 0 = no top-k filter

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """The processed distribution of a row of logits, and the seeded draws of the acceptance rule."""

    def __init__(self, params: SamplingParams, seed: int = 0):
        if params.greedy:
            raise ValueError("a Sampler needs temperature > 0; temperature 0 is the greedy path")
        self.params = params
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """The processed distribution of one row of logits, float64 on the CPU (the draws' precision)."""
        p = self.params
        z = logits.detach().to("cpu", torch.float64) / p.temperature
        if 0 < p.top_k < z.shape[-1]:
            kth = torch.topk(z, p.top_k).values[-1]
            z = z.masked_fill(z < kth, float("-inf"))
        probs = torch.softmax(z, dim=-1)
        if p.top_p < 1:
            # Keep the smallest set of most likely tokens whose mass reaches top_p (the token that crosses it
            # included); the rest get probability 0.
            sorted_probs, order = torch.sort(probs, descending=True)
            before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            drop = order[before >= p.top_p]
            probs[drop] = 0
            probs /= probs.sum()
        return probs

    def uniform(self) -> float:
        return float(torch.rand((), dtype=torch.float64, generator=self.generator))

    def draw(self, probs: torch.Tensor) -> int:
        """One token from `probs` (float64, sums to 1)."""
        return int(torch.multinomial(probs, 1, generator=self.generator))


def children_of(parents: np.ndarray) -> list[list[int]]:
    """The children of every tree node, in layout order."""
    children: list[list[int]] = [[] for _ in range(len(parents))]
    for node in range(1, len(parents)):
        children[int(parents[node])].append(node)
    return children


def verify_sampled(inputs: TreeInputs, tree_logits: torch.Tensor, sampler: Sampler,
                   draft_probs: torch.Tensor | None = None) -> Verdict:
    """Recursive rejection down the tree from node 0 (see the module docstring); the committed tokens are the
    accepted children's, then the bonus drawn at the last accepted node. `draft_probs` [draft nodes, vocab]: the
    distribution each draft token was drawn from, None for deterministic drafts."""
    children = children_of(inputs.parents)
    tokens = inputs.tokens
    path = [0]
    while True:
        node = path[-1]
        probs = sampler.probabilities(tree_logits[node])
        accepted = None
        for child in children[node]:
            token = int(tokens[child])
            p = float(probs[token])
            if draft_probs is not None:
                q = draft_probs[child - 1].detach().to("cpu", torch.float64)
                if p > 0 and sampler.uniform() * float(q[token]) < p:  # probability min(1, p(t) / q(t))
                    accepted = child
                    break
                residual = (probs - q).clamp_min_(0)
                mass = float(residual.sum())
                if mass > 0:  # 0 only when p = q, where a rejection cannot happen (rounding aside)
                    probs = residual / mass
                continue
            if p > 0 and sampler.uniform() < p:  # uniform() < 1, so p = 1 always accepts
                accepted = child
                break
            if p > 0:  # rejected: take t out of the distribution (a sibling with the same token is then rejected)
                probs[token] = 0
                probs /= probs.sum()
        if accepted is None:
            bonus = sampler.draw(probs)
            break
        path.append(accepted)
    return Verdict(path=path, accepted_tokens=[int(tokens[i]) for i in path[1:]], bonus=bonus, predictions=[])


def verify_token_match(inputs: TreeInputs, tree_logits: torch.Tensor, sampler: Sampler,
                       draft_probs: torch.Tensor | None = None) -> Verdict:
    """A BIASED rule kept for the tests (REST's sampling: docs/methods/rest.md, Sampling): each root-to-leaf row draws its own
    sample at every node and accepts a draft while it equals that row's sample; the first longest row wins. The
    independent draws per row at shared nodes favour deep matches, so the output is not the target's
    distribution: the exactness tests must reject it."""
    parents, tokens = inputs.parents, inputs.tokens
    children = children_of(parents)
    leaves = [node for node in range(len(parents)) if not children[node]]
    best_path, best_bonus = None, None
    for leaf in leaves:
        row = [leaf]
        while row[-1] != 0:
            row.append(int(parents[row[-1]]))
        row.reverse()
        length, bonus = 0, None
        while True:
            sample = sampler.draw(sampler.probabilities(tree_logits[row[length]]))
            if length + 1 < len(row) and int(tokens[row[length + 1]]) == sample:
                length += 1
                continue
            bonus = sample
            break
        if best_path is None or length > len(best_path) - 1:
            best_path, best_bonus = row[: length + 1], bonus
    return Verdict(path=best_path, accepted_tokens=[int(tokens[i]) for i in best_path[1:]], bonus=best_bonus,
                   predictions=[])
