"""Class 4, refuse at startup what vLLM refuses at startup: token budgets, tensor parallelism.

vLLM's `SchedulerConfig` refuses `max_num_batched_tokens < max_model_len` without chunked prefill
and `max_num_batched_tokens < max_num_seqs` (0.5.4 `config.py` `_verify_args`; 0.11.0 and 0.33.0
`config/scheduler.py`); `ModelConfig.verify_with_parallel_config` refuses a tensor-parallel size
that does not divide the attention heads, and `QKVParallelLinear` one that neither divides nor
is divided by the KV heads. kvsim used to raise the budget silently (v1-engine) or ignore every
request (v0).
"""

from __future__ import annotations

from tests.hostile.harness import Case, tiny

DESIGNS = (
    ("v1-engine", "4ac7713"),
    ("v1-engine", "0.11.0"),
    ("v1-engine", "0.33.0"),
    ("v0-v1", None),
    ("v0-v2", None),
    ("v0-fixed", None),
)


def scheduler(design: str, pin: str | None, **fields: object) -> str:
    """The tiny scenario on `design` (pinned to `pin`) with more scheduler fields."""
    items = [f"design: {design}", "max_model_len: 256"]
    if pin is not None:
        items.append(f'vllm_version: "{pin}"')
    items += [f"{key}: {str(value).lower()}" for key, value in fields.items()]
    return tiny().replace("{design: v1-engine, max_model_len: 256}", "{" + ", ".join(items) + "}")


def with_model(model: str, tp: int, design: str = "v1-engine", blocks: int = 20000) -> str:
    """The tiny scenario on a model (`model` is a catalog name or a flow mapping) at `tp`."""
    text = tiny(design=design)
    text = text.replace("model: null", f"model: {model}\nhardware: {{tensor_parallel_size: {tp}}}")
    return text.replace("num_gpu_blocks: 64", f"num_gpu_blocks: {blocks}")


def _label(design: str, pin: str | None) -> str:
    return design if pin is None else f"{design}@{pin}"


CASES: list[Case] = []

#: Pins whose release chunks every generative model, whatever the user says (0.11.0
#: arg_utils.py L1547-1548; 4ac7713 follows 0.11.0's rules).
ALWAYS_CHUNKS = ("4ac7713", "0.11.0")

for _design, _pin in DESIGNS:
    _chunks = _pin in ALWAYS_CHUNKS
    CASES += [
        Case(
            "startup",
            ("run", "s.yaml", "--no-plots", "-o", "out"),
            0 if _chunks else 2,
            "has no effect on vLLM" if _chunks else "max_num_batched_tokens",
            files={
                "s.yaml": scheduler(
                    _design, _pin, max_num_batched_tokens=100, enable_chunked_prefill=False
                )
            },
            outputs=("out",),
            name=f"budget below max_model_len without chunked prefill, {_label(_design, _pin)}"
            + (" (the release chunks anyway: it starts)" if _chunks else ""),
        ),
        Case(
            "startup",
            ("run", "s.yaml", "--no-plots", "-o", "out"),
            2,
            "max_num_seqs",
            files={
                "s.yaml": scheduler(
                    _design,
                    _pin,
                    max_num_batched_tokens=8,
                    max_num_seqs=16,
                    enable_chunked_prefill=True,
                )
            },
            outputs=("out",),
            name=f"budget below max_num_seqs with chunked prefill, {_label(_design, _pin)}",
        ),
    ]

_MODEL_40_10 = (
    "{name: odd, num_layers: 2, hidden_size: 640, num_attention_heads: 40, num_kv_heads: 10, "
    "head_dim: 16, intermediate_size: 1024, vocab_size: 1000, max_position_embeddings: 4096}"
)

CASES += [
    Case(
        "startup",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        2,
        "512",
        files={"s.yaml": scheduler("v0-v2", None, enable_chunked_prefill=True, max_num_seqs=1024)},
        outputs=("out",),
        name="v0 chunked prefill: the default budget 512 is below max_num_seqs 1024",
    ),
    Case(
        "startup",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        0,
        "outputs",
        files={"s.yaml": scheduler("v1-engine", None, max_num_batched_tokens=256)},
        outputs=("out",),
        name="budget equal to max_model_len starts",
    ),
    Case(
        "startup",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        0,
        "outputs",
        files={
            "s.yaml": scheduler(
                "v0-v2",
                None,
                max_num_batched_tokens=16,
                max_num_seqs=16,
                enable_chunked_prefill=True,
            )
        },
        outputs=("out",),
        name="budget equal to max_num_seqs with chunked prefill starts",
    ),
    Case(
        "startup",
        ("run", "s.yaml", "--no-plots", "-o", "out", "--set", "scheduler.max_num_batched_tokens=1"),
        2,
        "max_num_batched_tokens",
        files={"s.yaml": scheduler("v1-engine", None, enable_chunked_prefill=False)},
        outputs=("out",),
        name="run --set a budget of 1 (summary said 1, 112 steps ran)",
    ),
    Case(
        "startup",
        ("check", "s.yaml"),
        2,
        "max_num_batched_tokens",
        files={"s.yaml": scheduler("v0-v2", None, max_num_batched_tokens=100)},
        name="check a v0 scenario whose budget ignores every request",
    ),
    Case(
        "startup",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        2,
        "max_model_len",
        files={
            "s.yaml": with_model("llama-3.1-8b", 1).replace(
                "max_model_len: 256", "max_num_batched_tokens: 8192, enable_chunked_prefill: false"
            )
        },
        outputs=("out",),
        name="budget below the model's own max_model_len (131072), no chunked prefill",
    ),
    Case(
        "startup",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        2,
        "long_prefill_token_threshold",
        files={"s.yaml": scheduler("v1-engine", "0.33.0", long_prefill_token_threshold=300)},
        outputs=("out",),
        name="long_prefill_token_threshold above max_model_len on 0.33.0",
    ),
    Case(
        "startup",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        2,
        "attention heads",
        files={"s.yaml": with_model("llama-3.1-8b", 3)},
        outputs=("out",),
        name="tensor_parallel_size 3 does not divide 32 attention heads, v1-engine",
    ),
    Case(
        "startup",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        2,
        "attention heads",
        files={"s.yaml": with_model("llama-3.1-8b", 3, design="v0-v2")},
        outputs=("out",),
        name="tensor_parallel_size 3 does not divide 32 attention heads, v0-v2",
    ),
    Case(
        "startup",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        2,
        "attention heads",
        files={"s.yaml": with_model("llama-3.1-8b", 64)},
        outputs=("out",),
        name="tensor_parallel_size 64 above 32 attention heads",
    ),
    Case(
        "startup",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        2,
        "attention heads",
        files={"s.yaml": with_model("qwen2.5-7b", 8)},
        outputs=("out",),
        name="tensor_parallel_size 8 does not divide qwen2.5-7b's 28 heads",
    ),
    Case(
        "startup",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        2,
        "kv heads",
        files={"s.yaml": with_model(_MODEL_40_10, 4)},
        outputs=("out",),
        name="tensor_parallel_size 4 divides 40 heads but not 10 KV heads",
    ),
    Case(
        "startup",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        0,
        "outputs",
        files={"s.yaml": with_model("llama-3.1-8b", 16)},
        outputs=("out",),
        name="tensor_parallel_size 16 above 8 KV heads (replicated) starts",
    ),
    Case(
        "startup",
        ("step", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "3", "--decode", "8x512"),
        2,
        "attention heads",
        name="step --tp 3 on 32 attention heads",
    ),
    Case(
        "startup",
        ("disagg", "s.yaml", "-o", "out"),
        2,
        "attention heads",
        files={
            "s.yaml": with_model("llama-3.1-8b", 3)
            + "cluster: {mode: disaggregated, prefill: {replicas: 1}, decode: {replicas: 1}}\n"
        },
        outputs=("out",),
        name="disagg with tensor_parallel_size 3 on 32 heads",
    ),
]
