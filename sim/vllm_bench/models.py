"""The MODEL of a `vllm serve MODEL` line, as a scenario's `model:` value (no network).

Three forms, tried in order:

1. a kvsim catalog name (`llama-3.1-8b`);
2. a Hugging Face id the catalog knows (`meta-llama/Llama-3.1-8B-Instruct` -> `llama-3.1-8b`):
   each catalog entry's own `source` id, plus the ids in `HF_ID_ALIASES` (checkpoints whose
   config.json has the same geometry: instruct / chat tunes of the same base);
3. a local folder with a `config.json`: its geometry as a model dict (`model:` accepts one),
   read from the Hugging Face keys (`num_hidden_layers`, `num_key_value_heads`, ...).

Example::

    >>> scenario_model("meta-llama/Meta-Llama-3.1-8B-Instruct")
    'llama-3.1-8b'
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sim.catalog import _models, get_model, model_names
from sim.errors import InputError

#: Hugging Face ids with the same config.json geometry as a catalog entry's source checkpoint.
HF_ID_ALIASES: dict[str, str] = {
    "meta-llama/llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama/meta-llama-3.1-8b": "llama-3.1-8b",
    "meta-llama/meta-llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama/llama-3.1-70b-instruct": "llama-3.1-70b",
    "meta-llama/meta-llama-3.1-70b": "llama-3.1-70b",
    "meta-llama/meta-llama-3.1-70b-instruct": "llama-3.1-70b",
    "mistralai/mistral-7b-instruct-v0.1": "mistral-7b-v0.1",
    "google/gemma-2-9b": "gemma-2-9b",
    "mistralai/mixtral-8x7b-instruct-v0.1": "mixtral-8x7b-v0.1",
    "meta-llama/llama-2-7b-chat-hf": "llama-2-7b",
    "meta-llama/llama-2-70b-chat-hf": "llama-2-70b",
}

_SOURCE_ID = re.compile(r"https://huggingface\.co/([^/]+/[^/]+)/")


def hf_id_to_catalog() -> dict[str, str]:
    """Lower-case Hugging Face id -> catalog name: the entries' sources, then the aliases."""
    table: dict[str, str] = {}
    for name, spec in _models().items():
        match = _SOURCE_ID.match(spec.source)
        if match:
            table[match.group(1).lower()] = name
    return {**table, **HF_ID_ALIASES}


def scenario_model(model: str) -> str | dict[str, Any]:
    """A catalog name, or a geometry dict from a local folder (see the module docstring)."""
    if model.lower() in model_names():
        return model.lower()
    known = hf_id_to_catalog()
    if model.lower() in known:
        return known[model.lower()]
    folder = Path(model).expanduser()
    if folder.is_dir():
        return model_from_config(folder / "config.json")
    raise InputError(
        f"model {model!r}: not a kvsim catalog name ({', '.join(model_names())}), not a "
        "Hugging Face id the catalog knows, and not a local folder with a config.json "
        "(kvsim does not download)"
    )


def model_from_config(path: Path) -> dict[str, Any]:
    """A `model:` dict from a Hugging Face config.json (its text config for multimodal ones)."""
    if not path.is_file():
        raise InputError(f"{path}: no such file (a model folder needs a config.json)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: cannot read it as JSON: {error}") from None
    if not isinstance(config, dict):
        raise InputError(f"{path}: a config.json must be a JSON object")
    config = config.get("text_config", config)
    try:
        return _geometry(config, path)
    except KeyError as error:
        raise InputError(f"{path}: no {error.args[0]!r} key (kvsim needs it)") from None


def _geometry(config: dict[str, Any], path: Path) -> dict[str, Any]:
    heads = config["num_attention_heads"]
    hidden = config["hidden_size"]
    window = config.get("sliding_window")
    if config.get("use_sliding_window") is False:  # Qwen2 carries a window it does not use
        window = None
    pattern = "full"
    if window is not None:
        pattern = "alternating" if config.get("model_type") in ("gemma2", "gemma3") else "sliding"
    model: dict[str, Any] = {
        "name": path.parent.name or "local-model",
        "source": str(path),
        "num_layers": config["num_hidden_layers"],
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads") or heads,
        "head_dim": config.get("head_dim") or hidden // heads,
        "intermediate_size": config["intermediate_size"],
        "vocab_size": config["vocab_size"],
        "max_position_embeddings": config["max_position_embeddings"],
        "sliding_window": window,
        "layer_pattern": pattern,
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        "qkv_bias": bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
        "dtype": config.get("torch_dtype") or config.get("dtype") or "bfloat16",
    }
    experts = config.get("num_local_experts") or config.get("num_experts")
    if experts:
        model["num_experts"] = experts
        model["num_experts_per_token"] = config.get("num_experts_per_tok", 1)
    get_model(model)  # a geometry kvsim cannot use is refused here, naming the field
    return model
