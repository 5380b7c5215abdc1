"""Runs upstream's own decoding loops (Spec-Bench's, LogitSpec's, Gumiho's) on given prompt ids, for
`evaluation.tools.upstream_parity`.

Started by that tool in a side environment with upstream's pins, on a copy of the upstream repository patched only
for the device; it imports nothing from this project (whose `evaluation` package would clash with upstream's). Reads a
job (JSON) and writes, per prompt in order: the new token ids, the accepted length of every step, the ids each of
the first forwards fed (the first steps' trees) and the seconds taken.

    python upstream_driver.py job.json result.json
"""

from __future__ import annotations

import copy
import importlib
import importlib.machinery
import json
import os
import sys
import time
import types
from types import SimpleNamespace

import torch


def load_recycling(job: dict):
    """Token Recycling (`evaluation/inference_recycling.py`): one adjacency matrix for the process."""
    module = importlib.import_module("evaluation.inference_recycling")
    llama = importlib.import_module("model.recycling.modeling_llama_kv").LlamaForCausalLM
    model = llama.from_pretrained(job["model"], torch_dtype=torch.float32).eval()
    # upstream's `__main__` creates the matrix as a module global, once
    module.adj_matrix = torch.zeros((model.vocab_size, 8), dtype=torch.long)
    tokenizer = SimpleNamespace(eos_token_id=job["eos"])

    def run(prompt: list[int]):
        ids, _, _, lengths = module.recycling_forward(
            SimpleNamespace(input_ids=torch.tensor([prompt])), model, tokenizer, job["max_new_tokens"])
        return ids[0, len(prompt):].tolist(), [int(x) for x in lengths]

    return model, run


def load_sam(job: dict, tree_method: str | None):
    """SAM-Decoding (`evaluation/inference_samd.py`, `model/samd/`): with its token-recycling tree (SAM[TR]) or,
    with `tree_method` None, without an auxiliary drafter."""
    from transformers import AutoModelForCausalLM

    try:
        importlib.import_module("datasets")
    except ImportError:
        # `model/samd/sam/utils.py` imports `datasets.Dataset` only to build a corpus automaton, which this run
        # does not use; this project's `datasets` wants a newer huggingface_hub than transformers 4.37 accepts.
        placeholder = types.ModuleType("datasets")
        placeholder.__spec__ = importlib.machinery.ModuleSpec("datasets", None)  # transformers looks it up
        placeholder.Dataset = type("Dataset", (), {})
        sys.modules["datasets"] = placeholder
    samd = importlib.import_module("model.samd")
    inference = importlib.import_module("evaluation.inference_samd")
    model = AutoModelForCausalLM.from_pretrained(job["model"], torch_dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    model.hf_device_map = {"": "cpu"}  # upstream loads with device_map="cuda", which sets it
    config = samd.SamdConfig(n_predicts=40, tree_method=tree_method, len_threshold=5, len_bias=5)
    draft = samd.DraftModel(config, sam_static=None, lm=model, dtype=torch.float32, device="cpu")
    samd_model = samd.SamdModel(config, model, draft, job["eos"], torch.float32, "cpu")
    tokenizer = SimpleNamespace(eos_token_id=job["eos"])

    def run(prompt: list[int]):
        ids, _, _, lengths = inference.samd_forward(
            SimpleNamespace(input_ids=torch.tensor([prompt])), samd_model, tokenizer, job["max_new_tokens"])
        return list(ids[0][len(prompt):]), [int(x) for x in lengths]

    return model, run


def load_rest(job: dict):
    """REST (`evaluation/inference_rest.py`, `model/rest/`): upstream's datastore written by its own `draftretriever`
    writer from the same entries (turns) as ours, and read by its reader. That `draftretriever` is Spec-Bench's
    `model/rest/DraftRetriever`, built from its Rust source into the side environment (`maturin build`; its bundled
    wheel is for CPython 3.9, and the package of that name on PyPI is another project's)."""
    import numpy as np

    draftretriever = importlib.import_module("draftretriever")
    inference = importlib.import_module("evaluation.inference_rest")
    rest_model = importlib.import_module("model.rest.rest.model.rest_model")
    index = job["rest_index"]
    try:
        if not job.get("rest_index_ready"):
            tokens, starts = np.load(job["rest_tokens"], mmap_mode="r"), np.load(job["rest_starts"])
            writer = draftretriever.Writer(index_file_path=index, max_chunk_len=512 * 1024 * 1024,
                                           vocab_size=job["vocab_size"])
            for begin, end in zip(starts[:-1], starts[1:]):
                writer.add_entry(tokens[begin:end].tolist())
            writer.finalize()
    except TypeError:
        raise SystemExit("error: the side environment's draftretriever is not REST's: build Spec-Bench's "
                         "model/rest/DraftRetriever into it with maturin") from None
    datastore = draftretriever.Reader(index_file_path=index)
    model = rest_model.RestModel.from_pretrained(job["model"], torch_dtype=torch.float32).eval()
    token_spans = list(range(2, job["rest_max_token_span"] + 1))[::-1]
    tokenizer = SimpleNamespace(eos_token_id=job["eos"])

    def run(prompt: list[int]):
        ids, _, _, lengths = inference.rest_forward(
            SimpleNamespace(input_ids=torch.tensor([prompt])), model, tokenizer, job["max_new_tokens"],
            datastore=datastore, num_draft=job["rest_num_draft"], token_spans=token_spans)
        return ids[0, len(prompt):].tolist(), [int(x) for x in lengths]

    return model.base_model, run


def load_lookahead(job: dict):
    """Lookahead decoding (`evaluation/inference_lookahead.py`, `model/lade/`): transformers' greedy search replaced
    by LADE's, configured as Spec-Bench's script does with one worker."""
    from transformers import AutoModelForCausalLM

    os.environ["USE_LADE"] = "1"  # as Spec-Bench's run script sets it; without it LADE falls back to greedy search
    utils = importlib.import_module("model.lade.utils")
    inference = importlib.import_module("evaluation.inference_lookahead")
    utils.augment_all()
    utils.config_lade(LEVEL=job["lade_level"], WINDOW_SIZE=job["lade_window"], GUESS_SET_SIZE=job["lade_guess"],
                      DEBUG=0, USE_FLASH=0, DIST_WORKERS=1)
    model = AutoModelForCausalLM.from_pretrained(job["model"], torch_dtype=torch.float32).eval()

    def run(prompt: list[int]):
        ids, _, _, lengths = inference.lookahead_forward(
            SimpleNamespace(input_ids=torch.tensor([prompt])), model, None, job["max_new_tokens"])
        return ids[0, len(prompt):].tolist(), [int(x) for x in lengths]

    return model, run


def load_logitspec(job: dict):
    """LogitSpec (smart-lty/LogitSpec `evaluation/inference_logitspec.py`, `model/logitspec/`): its own Llama with a
    preallocated cache, greedy, with the tree settings of our configuration."""
    inference = importlib.import_module("evaluation.inference_logitspec")
    llama = importlib.import_module("model.logitspec.modeling_llama_kv")
    model = llama.LlamaForCausalLM.from_pretrained(job["model"], torch_dtype=torch.float32).eval()
    tokenizer = SimpleNamespace(eos_token_id=job["eos"], pad_token_id=job["eos"])

    def run(prompt: list[int]):
        ids, _, _, lengths = inference.logitspec_forward(
            SimpleNamespace(input_ids=torch.tensor([prompt])), model, tokenizer, job["max_new_tokens"], 0.0,
            job["logitspec_max_ngram_size"], job["logitspec_num_pred_tokens"], job["logitspec_draft_tree_capacity"])
        return ids[0, len(prompt):].tolist(), [int(x) for x in lengths]

    return model, run


def load_gumiho(job: dict):
    """Gumiho (AMD-AIG-AIMA/Gumiho `gumiho/model/gumiho_model.py`): its target model with a preallocated cache and
    its draft built as `GumihoModel.from_pretrained` builds it, from our draft's weights (which leave out the
    target's embedding: the draft shares it) and our tree settings as its command-line arguments. Upstream keeps no
    accepted lengths, so they are read off its `evaluate_posterior` (accepted drafts, plus the bonus token)."""
    from safetensors.torch import load_file
    import transformers

    gumiho_model = importlib.import_module("gumiho.model.gumiho_model")
    base = gumiho_model.KVLlamaForCausalLM.from_pretrained(job["model"], torch_dtype=torch.float32).eval()
    state = load_file(job["gumiho_weights"])
    state["embed_tokens.weight"] = base.model.embed_tokens.weight.detach().clone()
    args = SimpleNamespace(**job["gumiho_args"])
    # Upstream asks for the slow tokenizer, only to read its eos id; SmolLM2 ships the fast one alone.
    slow = transformers.AutoTokenizer.from_pretrained
    gumiho_model.AutoTokenizer.from_pretrained = lambda path, **kw: slow(path)
    model = gumiho_model.GumihoModel(base, job["model"], job["gumiho_config"], args.total_tokens, args.depth,
                                     args.top_k, 1.0, state, args).eval()
    lengths: list[int] = []
    posterior = gumiho_model.evaluate_posterior

    def recording_posterior(*a, **kw):
        best, accept_length, sample_p = posterior(*a, **kw)
        lengths.append(int(accept_length) + 1)
        return best, accept_length, sample_p

    gumiho_model.evaluate_posterior = recording_posterior

    def run(prompt: list[int]):
        lengths.clear()
        ids = model.gumihoGenerate(torch.tensor([prompt]), temperature=0.0, max_new_tokens=job["max_new_tokens"])
        return ids[0, len(prompt):].tolist(), list(lengths)

    return base, run


def eagle_draft_state(job: dict, base) -> dict:
    """Our EAGLE draft's weights under upstream's keys (written by the tool), plus the embedding upstream's draft
    holds as its own: a copy of the target's, which our draft shares (a copy, so `FedIds` sees target forwards only)."""
    from safetensors.torch import load_file

    state = load_file(job["eagle_weights"])
    state["embed_tokens.weight"] = base.model.embed_tokens.weight.detach().clone()
    return state


def load_eagle(job: dict):
    """EAGLE-1 (Spec-Bench `evaluation/inference_eagle.py`, `model/eagle/`): its target with a preallocated cache and
    its `EaModel` built as `EaModel.from_pretrained` builds it, from our draft's weights, decoded by Spec-Bench's
    `ea_forward` with the `mc_sim_7b_63` tree at temperature 0. The accepted lengths are the ones `ea_forward`
    keeps (each step's accepted drafts plus one, what Spec-Bench reports), as for the other Spec-Bench loops."""
    ea_model = importlib.import_module("model.eagle.ea_model")
    choices = importlib.import_module("model.eagle.choices")
    inference = importlib.import_module("evaluation.inference_eagle")
    # Upstream's draft always grows its own `mc_sim_7b_63` (`Model.init_tree`), whatever tree the target verifies.
    if sorted(map(tuple, job["eagle_tree_choices"])) != sorted(map(tuple, choices.mc_sim_7b_63)):
        raise SystemExit("error: our EAGLE tree is not upstream's mc_sim_7b_63, the only tree its draft grows")
    base = ea_model.KVLlamaForCausalLM.from_pretrained(job["model"], torch_dtype=torch.float32).eval()
    model = ea_model.EaModel(base, job["model"], job["eagle_config"])
    model.ea_layer.load_state_dict(eagle_draft_state(job, base), strict=True)
    model.eval()  # as Spec-Bench's run_eval does; a draft in training mode takes its gradient-checkpointing path
    tokenizer = SimpleNamespace(eos_token_id=job["eos"])

    def run(prompt: list[int]):
        ids, _, _, lengths = inference.ea_forward(
            SimpleNamespace(input_ids=torch.tensor([prompt])), model, tokenizer, job["max_new_tokens"],
            tree_choices=choices.mc_sim_7b_63, logits_processor=None)
        return ids[0, len(prompt):].tolist(), [int(x) for x in lengths]

    return base, run


def load_eagle2(job: dict):
    """EAGLE-2 (Spec-Bench `evaluation/inference_eagle2.py`, `model/eagle2/`): its target and its `EaModel` built
    as `EaModel.from_pretrained` builds it, from our draft's weights and our `total_token`, `depth` and `top_k`,
    decoded by Spec-Bench's `ea_forward` (`eagenerate`) at temperature 0. The accepted lengths are the ones
    `eagenerate` keeps, as for EAGLE-1."""
    ea_model = importlib.import_module("model.eagle2.ea_model")
    inference = importlib.import_module("evaluation.inference_eagle2")
    base = ea_model.KVLlamaForCausalLM.from_pretrained(job["model"], torch_dtype=torch.float32).eval()
    args = job["eagle2_args"]
    model = ea_model.EaModel(base, job["model"], job["eagle_config"], args["total_token"], args["depth"],
                             args["top_k"], 1.0, eagle_draft_state(job, base))
    model.eval()
    # `eagenerate` stops at its own tokenizer's eos: it must be the stop token our side uses.
    if model.tokenizer.eos_token_id != job["eos"]:
        raise SystemExit(f"error: upstream's tokenizer stops at {model.tokenizer.eos_token_id}, ours at {job['eos']}")

    def run(prompt: list[int]):
        ids, _, _, lengths = inference.ea_forward(
            SimpleNamespace(input_ids=torch.tensor([prompt])), model, None, job["max_new_tokens"], temperature=0.0)
        return ids[0, len(prompt):].tolist(), [int(x) for x in lengths]

    return base, run


def check_tree(job: dict, upstream_tree: list, name: str) -> None:
    """Our static tree must be the one upstream's script runs (its `mc_sim_7b_63`)."""
    if sorted(map(tuple, job["tree_choices"])) != sorted(map(tuple, upstream_tree)):
        raise SystemExit(f"error: our {name} tree is not upstream's mc_sim_7b_63, the tree its script runs")


def check_loaded(loaded, module: torch.nn.Module, unused: tuple[str, ...] = ()) -> None:
    """Upstream loads heads with `strict=False`, which skips what a file lacks: every key must have been read,
    except `unused` ones, RoPE's frequencies (computed from the config) and keys of a module registered twice
    (Hydra's repeated block) whose other name was read."""
    params = module.state_dict(keep_vars=True)
    read = {id(params[key]) for key in params if key not in loaded.missing_keys}
    skipped = [key for key in loaded.missing_keys
               if key not in unused and not key.endswith("rotary_emb.inv_freq") and id(params[key]) not in read]
    if skipped or loaded.unexpected_keys:
        raise SystemExit(f"error: the heads file does not fit upstream's heads: missing {skipped}, "
                         f"unexpected {loaded.unexpected_keys}")


def load_medusa(job: dict):
    """Medusa-1 (Spec-Bench `evaluation/inference_medusa.py`, `model/medusa/`): its target with a preallocated cache
    and its `MedusaModel` built as `MedusaModel.from_pretrained` builds it with the script's 4 heads, from the
    heads file the tool wrote, decoded by Spec-Bench's `medusa_forward` with `mc_sim_7b_63` at temperature 0. The
    accepted lengths are the ones `medusa_forward` keeps (each step's accepted drafts plus one)."""
    medusa_model = importlib.import_module("model.medusa.medusa_model")
    choices = importlib.import_module("model.medusa.medusa_choices")
    inference = importlib.import_module("evaluation.inference_medusa")
    check_tree(job, choices.mc_sim_7b_63, "Medusa")
    config = json.loads(open(os.path.join(job["heads"], "config.json")).read())
    base = medusa_model.KVLlamaForCausalLM.from_pretrained(job["model"], torch_dtype=torch.float32).eval()
    model = medusa_model.MedusaModel(base, job["num_heads"], config["medusa_num_layers"], job["model"])
    state = torch.load(os.path.join(job["heads"], "medusa_lm_head.pt"), map_location="cpu", weights_only=True)
    check_loaded(model.medusa_head.load_state_dict(state, strict=False), model.medusa_head)
    model.eval()
    tokenizer = SimpleNamespace(eos_token_id=job["eos"])

    def run(prompt: list[int]):
        ids, _, _, lengths = inference.medusa_forward(
            SimpleNamespace(input_ids=torch.tensor([prompt])), model, tokenizer, job["max_new_tokens"],
            medusa_choices=choices.mc_sim_7b_63, temperature=0.0)
        return ids[0, len(prompt):].tolist(), [int(x) for x in lengths]

    return base, run


def load_hydra(job: dict):
    """Hydra++ (Spec-Bench `evaluation/inference_hydra.py`, `model/hydra/`, `prefix-mlp` grounded heads): its
    target and its `HydraModel` built as `HydraModel.from_pretrained` builds it from the heads folder the tool
    wrote, decoded by Spec-Bench's `hydra_forward` with `mc_sim_7b_63` at temperature 0; accepted lengths as
    `hydra_forward` keeps them."""
    hydra_model = importlib.import_module("model.hydra.hydra_model")
    choices = importlib.import_module("model.hydra.hydra_choices")
    inference = importlib.import_module("evaluation.inference_hydra")
    check_tree(job, choices.mc_sim_7b_63, "Hydra")
    config = json.loads(open(os.path.join(job["heads"], "config.json")).read())
    base = hydra_model.KVLlamaForCausalLM.from_pretrained(job["model"], torch_dtype=torch.float32).eval()
    embedding = base.model.embed_tokens.weight.detach().clone()
    model = hydra_model.HydraModel(base, config["hydra_num_heads"], config["hydra_num_layers"],
                                   config["hydra_head_arch"], job["model"], config["grounded_heads"],
                                   config["hidden_state_offset"])
    state = torch.load(os.path.join(job["heads"], "hydra_lm_head.pt"), map_location="cpu", weights_only=True)
    # The prefix layer's own token embedding is never used (it reads the target's states as `inputs_embeds`).
    check_loaded(model.hydra_head.load_state_dict(state, strict=False), model.hydra_head,
                 unused=("prefix_embeding_layer.embed_tokens.weight",))
    # `input_embed_fn` is the target's embedding module (tied to its head): loading the file wrote the stored copy
    # into it, which must be the target's own.
    if not torch.equal(base.model.embed_tokens.weight, embedding):
        raise SystemExit("error: the heads file's input_embed_fn.weight changed the target's embedding")
    # The heads embed drafted tokens through a copy of the same weights, so that `FedIds` sees target forwards only.
    model.hydra_head.input_embed_fn = copy.deepcopy(base.model.embed_tokens)
    model.eval()
    tokenizer = SimpleNamespace(eos_token_id=job["eos"])

    def run(prompt: list[int]):
        ids, _, _, lengths = inference.hydra_forward(
            SimpleNamespace(input_ids=torch.tensor([prompt])), model, tokenizer, job["max_new_tokens"],
            hydra_choices=choices.mc_sim_7b_63, temperature=0.0)
        return ids[0, len(prompt):].tolist(), [int(x) for x in lengths]

    return base, run


LOADERS = {
    "eagle": load_eagle,
    "eagle2": load_eagle2,
    "gumiho": load_gumiho,
    "hydra": load_hydra,
    "hydra-trained": load_hydra,
    "lookahead": load_lookahead,
    "logitspec": load_logitspec,
    "medusa": load_medusa,
    "rest": load_rest,
    "recycling": load_recycling,
    "sam": lambda job: load_sam(job, "token_recycle"),
    "sam-no-fallback": lambda job: load_sam(job, None),
}


class FedIds:
    """The input ids of the first `keep` forwards, through a pre-hook on the token embedding (LADE's forward
    bypasses the model's `forward`, never its embedding)."""

    def __init__(self, model: torch.nn.Module, keep: int):
        self.keep, self.calls = keep, []
        self.handle = model.get_input_embeddings().register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        if len(self.calls) < self.keep:
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.calls.append(ids[0].tolist())


def main(job_path: str, out_path: str) -> None:
    job = json.loads(open(job_path).read())
    sys.path.insert(0, job["upstream"])
    torch.set_num_threads(job["threads"])
    # The answer-file writer (fastchat's judge utilities) is never called: the forward functions are called directly.
    writer = types.ModuleType("evaluation.eval")
    writer.run_eval = writer.reorg_answer_file = None
    sys.modules["evaluation.eval"] = writer
    model, run = LOADERS[job["method"]](job)
    results = []
    for prompt in job["prompts"]:
        fed = FedIds(model, job["trees"] + 1)  # the prefill, then the first steps
        start = time.perf_counter()
        with torch.inference_mode():
            tokens, lengths = run(prompt)
        seconds = time.perf_counter() - start
        fed.handle.remove()
        results.append({"tokens": [int(t) for t in tokens], "accept_lengths": lengths, "seconds": seconds,
                        "fed": fed.calls[1:]})
    with open(out_path, "w") as f:
        json.dump({"transformers": importlib.import_module("transformers").__version__, "results": results}, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
