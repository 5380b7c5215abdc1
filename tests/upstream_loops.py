"""Spec-Bench's Token Recycling and SAM[TR] loops (commit fd2c1cd), written out as references for the tests.

Each follows its upstream file line by line for what decides the tokens, the accepted lengths and the state carried
to the next question: the tree (upstream's template, search paths and first-best path), the stop rule and when the
adjacency rows are learnt. Only the forward differs: the whole sequence is recomputed with an explicit tree mask
instead of upstream's patched model and KV copies, so these run on any transformers release.
"""

from __future__ import annotations

import torch

from baselines.recycling import TEMPLATES
from baselines.suffix_automaton import SuffixAutomaton


def tree_forward(model, prefix: list[int], tree_tokens: list[int], parents: list[int]) -> torch.Tensor:
    """Logits [nodes, vocab] of tree nodes below `prefix` (node 0's parent -1), every node seeing its ancestors."""
    n, width = len(prefix), len(tree_tokens)
    size = n + width
    visible = torch.zeros(size, size, dtype=torch.bool)
    visible[:n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
    visible[n:, :n] = True
    depths = [0] * width
    for i in range(width):
        j = i
        while j >= 0:
            visible[n + i, n + j] = True
            j = parents[j]
        depths[i] = 0 if parents[i] < 0 else depths[parents[i]] + 1
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(size, size, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
    positions = list(range(n)) + [n + d for d in depths]
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([prefix + tree_tokens]), attention_mask=mask[None, None],
                    position_ids=torch.tensor([positions]), use_cache=False)
    return out.logits[0, n:].float()


def template_layout(paths: list[list[int]]):
    """Upstream's prepare_data: each node's parent and rank, and the search paths (root-to-leaf node lists)."""
    paths = [list(p) for p in paths]
    parents, ranks, search = [-1], [0], []
    for i, path in enumerate(paths):
        parents.append(0 if len(path) == 1 else paths.index(path[:-1]) + 1)
        ranks.append(path[-1])
        current = [0] + [j + 1 for j in range(i) if paths[j] == path[: len(paths[j])]] + [i + 1]
        for cut in range(1, len(current)):
            if current[:cut] in search:
                search.remove(current[:cut])
        search.append(current)
    return parents, ranks, search


def learn(adj: torch.Tensor, tokens: list[int], logits: torch.Tensor) -> None:
    """`adj[tokens] = topk(logits, 8)`, a token at several nodes keeping its last node's row."""
    top = logits.topk(adj.shape[1], dim=-1).indices
    for i, token in enumerate(tokens):
        adj[token] = top[i]


def best_path(tokens: list[int], predicted: list[int], search: list[list[int]]) -> tuple[int, list[int]]:
    """Upstream's reward: the longest run of drafts equal to their parent's prediction along each search path,
    the first path with the most; returns (accepted drafts, that path's node list)."""
    rewards = []
    for path in search:
        r = 0
        while r + 1 < len(path) and tokens[path[r + 1]] == predicted[path[r]]:
            r += 1
        rewards.append(r)
    best = max(range(len(search)), key=lambda k: (rewards[k], -k))
    return rewards[best], search[best]


def recycling(model, prompt: list[int], adj: torch.Tensor, max_new_tokens: int, eos: set[int],
              template: str = "2.2.2") -> tuple[list[int], list[int]]:
    """`recycling_forward`: returns (new tokens, accept lengths); `adj` is updated in place, as upstream's global."""
    parents, ranks, search = template_layout(TEMPLATES[template])
    prefix, pending, lengths = prompt[:-1], prompt[-1], []  # the prefill stops before the last prompt token
    for _ in range(max_new_tokens):  # upstream's loop takes at most max_new_tokens steps
        tokens = [pending]
        for i in range(1, len(parents)):
            tokens.append(int(adj[tokens[parents[i]], ranks[i]]))
        logits = tree_forward(model, prefix, tokens, parents)
        predicted = logits.argmax(-1).tolist()
        accepted, path = best_path(tokens, predicted, search)
        lengths.append(1 + accepted)
        committed = [tokens[j] for j in path[: accepted + 1]]
        prefix = prefix + committed
        if eos & set(committed) or len(prefix) - len(prompt) > max_new_tokens:
            break
        learn(adj, tokens, logits)
        pending = predicted[path[accepted]]
        if pending in eos:
            prefix.append(pending)  # upstream counts it (start_len -= 1)
            break
    return prefix[len(prompt):], lengths


def sam_tr(model, prompt: list[int], adj: torch.Tensor, max_new_tokens: int, eos: set[int], n_predicts: int = 40,
           threshold: int = 5) -> tuple[list[int], list[int]]:
    """`SamdModel.generate` with the token-recycling tree model (SAM[TR]): the prefill learns a row for every
    prompt token; each step drafts the automaton's chain (padded with token 0 to `n_predicts` tokens) when the
    match is at least `threshold` long, else the recycling tree; every step learns, the last included."""
    parents, ranks, search = template_layout(TEMPLATES["samd"])
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt])).logits[0].float()
    learn(adj, prompt, logits)
    automaton = SuffixAutomaton()
    automaton.extend(prompt)
    sequence, pending, lengths = list(prompt), int(logits[-1].argmax()), []
    for _ in range(max_new_tokens):  # upstream's loop takes at most max_new_tokens steps
        state, length = automaton.lookup(pending)
        if length >= threshold:
            chain = automaton.continuation(automaton.with_room(state, n_predicts), n_predicts - 1)
            tokens = [pending] + chain + [0] * (n_predicts - 1 - len(chain))
            step_parents, step_search = list(range(-1, len(tokens) - 1)), [list(range(len(tokens)))]
        else:
            tokens = [pending]
            for i in range(1, len(parents)):
                tokens.append(int(adj[tokens[parents[i]], ranks[i]]))
            step_parents, step_search = parents, search
        logits = tree_forward(model, sequence, tokens, step_parents)
        predicted = logits.argmax(-1).tolist()
        accepted, path = best_path(tokens, predicted, step_search)
        new = [tokens[j] for j in path[: accepted + 1]]
        learn(adj, tokens, logits)
        stop = next((i for i, t in enumerate(new) if t in eos), None)
        if stop is not None:
            new = new[: stop + 1]
        sequence += new
        automaton.extend(new)
        lengths.append(len(new))
        pending = predicted[path[accepted]]
        if stop is not None or len(sequence) - len(prompt) >= max_new_tokens:
            break
    return sequence[len(prompt):][:max_new_tokens], lengths
