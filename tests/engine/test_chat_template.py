"""The chat template's per-request parse on the API server's loop (`sim.engine.chat_template`):
it costs only chat requests, only on the pins whose vLLM parses the template per request, and
only models rendered by their Jinja template (not gpt-oss's harmony path)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.engine.api_server import ApiServer
from sim.engine.chat_template import (
    CHAT_TEMPLATE_PARSE_S,
    REPARSING_RELEASES,
    Endpoint,
    chat_template_s,
    endpoint_of_backend,
)
from sim.errors import InputError
from sim.vllm_bench.flags import RELEASES
from sim.workload.request import RequestSpec
from tests.engine.test_frontend import FIXED_S, PER_TOKEN_S, _run
from tests.harness.vllm_install import root_or_skip

MODELS = ("qwen3-14b", "llama-3.1-8b", "gpt-oss-20b", "gpt-oss-120b", "qwen2.5-7b")


@given(
    release=st.sampled_from(sorted(RELEASES)),
    endpoint=st.sampled_from(list(Endpoint)),
    model=st.sampled_from(MODELS),
)
def test_only_chat_on_a_reparsing_pin_to_a_jinja_model_pays(
    release: str, endpoint: Endpoint, model: str
) -> None:
    cost_s = chat_template_s(release, endpoint, model)
    pays = endpoint is Endpoint.CHAT and release == "0.11.0" and not model.startswith("gpt-oss")
    assert cost_s == (CHAT_TEMPLATE_PARSE_S if pays else 0.0)


def test_the_cost_is_the_midpoint_of_the_prs_range_not_a_fit() -> None:
    # vllm PR #20065: 6-8 s over 1,000 requests.
    assert pytest.approx((6.0 + 8.0) / 2 / 1000) == CHAT_TEMPLATE_PARSE_S


def _resolve_kwargs_parses_per_call(root: Path) -> bool:
    """Whether the release's `resolve_chat_template_kwargs` parses the template itself on every
    call (a `.parse(...)` in its own body) rather than through a cached helper."""
    for path in (root / "vllm/entrypoints/chat_utils.py", root / "vllm/renderers/hf.py"):
        if not path.exists():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "resolve_chat_template_kwargs":
                calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
                names = [c.func.attr for c in calls if isinstance(c.func, ast.Attribute)]
                names += [c.func.id for c in calls if isinstance(c.func, ast.Name)]
                assert "parse" in names or "_cached_resolve_chat_template_kwargs" in names
                return "parse" in names
    raise AssertionError(f"{root}: no resolve_chat_template_kwargs")


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_the_reparsing_pins_are_the_releases_whose_source_parses_per_request(
    release: str,
) -> None:
    root = root_or_skip(release)
    assert _resolve_kwargs_parses_per_call(root) == (release in REPARSING_RELEASES)


def test_gpt_oss_takes_the_harmony_path_in_0_11_0() -> None:
    """0.11.0 `serving_chat.py`: `use_harmony` is set from the model type gpt_oss, and the
    Jinja path (`_preprocess_chat`) runs only when it is not."""
    root = root_or_skip("0.11.0")
    text = (root / "vllm/entrypoints/openai/serving_chat.py").read_text(encoding="utf-8")
    assert 'self.use_harmony = model_config.hf_config.model_type == "gpt_oss"' in text
    jinja_branch = text.split("if not self.use_harmony:", 1)[1].split("else:", 1)[0]
    assert "self._preprocess_chat(" in jinja_branch


def test_the_worked_example_two_chat_prompts_queue_behind_each_others_parse() -> None:
    """The frontend docstring's example with a 7 ms chat template: first turns at 0-27 and
    27-54 ms, tokenizations at 54-59 and 59-64 ms, 10 ms hand-off: the scheduler gets them at
    69 and 74 ms (14 ms later than without the template, two parses queued)."""
    costs = ApiServer(request_s=0.020, prompt_token_s=5e-6, hand_off_s=0.010,
                      chat_template_s=0.007)  # fmt: skip
    assert costs.input_s(1000) == pytest.approx(0.032)
    engine = _run([RequestSpec(0, 0.0, 1000, 1), RequestSpec(1, 0.0, 1000, 1)], frontend=costs)
    times = engine.token_times_s
    assert times is not None
    first_end = 0.069 + FIXED_S + 1000 * PER_TOKEN_S
    assert times[0] == [pytest.approx(first_end)]
    assert times[1] == [pytest.approx(first_end + FIXED_S + 1000 * PER_TOKEN_S)]


def test_a_burst_of_chat_requests_waits_for_every_parse_before_it() -> None:
    """n one-token prompts at once, only the template costing: the k-th (0-based) reaches the
    engine after (k + 1) x 7 ms of parsing, so the last of 50 cannot start before 350 ms; without
    the template all 50 share the first step."""
    n = 50
    specs = [RequestSpec(i, 0.0, 1, 1) for i in range(n)]
    free = _run(specs)
    chat = _run(specs, frontend=ApiServer(chat_template_s=CHAT_TEMPLATE_PARSE_S))
    assert free.token_times_s is not None and chat.token_times_s is not None
    for k in range(n):
        assert chat.token_times_s[k][0] >= (k + 1) * CHAT_TEMPLATE_PARSE_S
    free_first = [t[0] for t in free.token_times_s.values()]
    assert free_first == [pytest.approx(FIXED_S + n * PER_TOKEN_S)] * n  # one shared step


def test_backends_map_to_vllms_endpoints_and_an_unknown_one_is_an_input_error() -> None:
    assert endpoint_of_backend("openai") is Endpoint.COMPLETIONS
    assert endpoint_of_backend("vllm") is Endpoint.COMPLETIONS
    assert endpoint_of_backend("openai-chat") is Endpoint.CHAT
    with pytest.raises(InputError, match="--backend 'tgi'"):
        endpoint_of_backend("tgi")


def test_a_negative_template_cost_is_refused() -> None:
    with pytest.raises(ValueError, match="chat_template_s"):
        ApiServer(chat_template_s=-0.001)
