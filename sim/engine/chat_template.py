"""The chat endpoint's per-request chat-template parse on the API server's loop.

A `/v1/chat/completions` request is turned into a prompt by the model's Jinja chat template
before it is tokenized. In vLLM 0.11.0 that step parses the whole template again for every
request, on the event loop: `OpenAIServing._preprocess_chat` (0.11.0
`vllm/entrypoints/openai/serving_engine.py:L736-797`) calls `apply_hf_chat_template`
synchronously (L791, no `await` before it), which calls `resolve_chat_template_kwargs`
(0.11.0 `vllm/entrypoints/chat_utils.py:L1575-1601`, called at L1627): it builds a new
`jinja2.sandbox.ImmutableSandboxedEnvironment`, `env.parse`s the template and walks the AST for
its undeclared variables, with no cache. 0.11.1 moved that parse into
`_resolve_chat_template_kwargs` behind `lru_cache` (0.11.1 `chat_utils.py:L1522-1535`), and
0.12.0, 0.14.0, 0.19.1 (`vllm/renderers/hf.py:L372-383`), 0.20.0, 0.25.1, 0.26.0 and 0.33.0 keep
it cached. Earlier, releases up to 0.9.1 parsed the template per request in
`_detect_content_format` instead (vllm PR #20065 added its `lru_cache`; 0.9.2 to 0.10.2 have it
cached and no `resolve_chat_template_kwargs`), so of kvsim's pins only 0.11.0 pays the parse.

gpt-oss does not go through the Jinja template: 0.11.0 `serving_chat.py:L146` sets
`use_harmony` when the model type is `gpt_oss`, and such requests are rendered by
`_make_request_with_harmony` (L260) instead of `_preprocess_chat` (L223-239).

The cost is a sourced figure, not a fit: vllm PR #20065
(https://github.com/vllm-project/vllm/pull/20065, 2025-06-25, merged; text states no licence,
the figure is a fact) measured the uncached per-request template parse of that era
(`_detect_content_format`: compile, `parse`, walk the AST) at "6-8 seconds" over 1,000 requests
of a throughput benchmark on a meta-llama model: 6-8 ms a request. kvsim takes the range's
midpoint, 7 ms, for 0.11.0's parse, the nearest published measurement of the same work
(a fresh Jinja environment, a parse and an AST walk of the model's template). Pre-registered
(2026-12-05) before any replay with it: this value, gated as below, and no other cost moved.

Example: 1,000 chat requests to a Qwen3 model on pin 0.11.0 sent at once queue 1,000 x 7 ms =
7 s of template parsing on one API server's loop ahead of the engine core, on top of their
`request_s` (2 ms each); the same burst to `/v1/completions`, to gpt-oss, or on pin 0.19.1
costs none of it.

What this leaves out: rendering the template itself (cached compile in transformers; it stays
in the fitted `request_s`), the template's extra prompt tokens (each measurement's notes), the
template's length (every model is charged the one figure), and the 0.9.2-0.10.2 releases a
replay maps onto pin 0.11.0 (the rule keys on the pin kvsim simulates).
"""

from __future__ import annotations

import enum

from sim.errors import InputError

#: Seconds of loop time the uncached parse costs a chat request (vllm PR #20065: 6-8 s per
#: 1,000 requests; the midpoint). Sourced, not fitted.
CHAT_TEMPLATE_PARSE_S = 0.007

#: kvsim pins whose chat path parses the Jinja template afresh for every request (0.11.0
#: `chat_utils.py:L1575-1601`; cached from 0.11.1 on).
REPARSING_RELEASES: frozenset[str] = frozenset({"0.11.0"})


class Endpoint(enum.Enum):
    """The OpenAI endpoint a benchmark client sends its requests to."""

    COMPLETIONS = "completions"
    CHAT = "chat"


#: `vllm bench serve --backend` -> the endpoint it sends to (0.11.0 `vllm/benchmarks/lib/
#: endpoint_request_func.py:L521-527` `ASYNC_REQUEST_FUNCS`: "vllm" and "openai" post to
#: /v1/completions, "openai-chat" to /v1/chat/completions; the default is "openai").
BACKEND_ENDPOINTS: dict[str, Endpoint] = {
    "openai": Endpoint.COMPLETIONS,
    "vllm": Endpoint.COMPLETIONS,
    "openai-chat": Endpoint.CHAT,
}


def endpoint_of_backend(backend: str) -> Endpoint:
    """The endpoint `vllm bench serve --backend backend` sends to ("openai-chat" -> CHAT);
    a backend kvsim does not replay is an InputError naming the option."""
    endpoint = BACKEND_ENDPOINTS.get(backend)
    if endpoint is None:
        known = ", ".join(BACKEND_ENDPOINTS)
        raise InputError(f"--backend {backend!r}: kvsim replays {known}")
    return endpoint


def uses_harmony(model_name: str) -> bool:
    """Whether vLLM renders the model's chat requests with openai-harmony, not its Jinja
    template (`model_type == "gpt_oss"`; kvsim's catalog names those models gpt-oss-*)."""
    return model_name.lower().startswith("gpt-oss")


def chat_template_s(release: str, endpoint: Endpoint, model_name: str) -> float:
    """Loop seconds the chat template costs one request of a run: `CHAT_TEMPLATE_PARSE_S` for
    a chat request on a re-parsing pin to a Jinja-template model, else 0 (example: pin 0.11.0,
    chat, "qwen3-14b" -> 0.007; the same with "gpt-oss-20b", on "0.19.1", or to completions
    -> 0.0)."""
    if endpoint is not Endpoint.CHAT or release not in REPARSING_RELEASES:
        return 0.0
    return 0.0 if uses_harmony(model_name) else CHAT_TEMPLATE_PARSE_S
