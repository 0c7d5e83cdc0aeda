"""An attached server speaks as the family its /metrics named (engines.speaking_as)."""

from kvscope.config import EngineConfig
from kvscope.engines import make_engine, speaking_as
from kvscope.engines.attach import AttachEngine
from kvscope.engines.base import REQUEST_ID_HEADER
from kvscope.engines.sglang import SglangEngine
from kvscope.engines.vllm import VllmEngine

ATTACHED = EngineConfig(kind="attach", url="http://gpu:8000/", api_key_env="MY_KEY")


def test_an_attached_vllm_tags_its_calls_as_vllm() -> None:
    engine = make_engine(ATTACHED)
    assert engine.request_tags("u1", "planner") == ({}, {})  # unknown server: no tags
    wire = speaking_as(engine, "vllm")
    assert isinstance(wire, VllmEngine)
    body, headers = wire.request_tags("u1", "planner")
    assert body == {"request_id": "u1", "session_id": "u1"}
    assert headers == {REQUEST_ID_HEADER: "u1"}
    assert wire.base_url == "http://gpu:8000"  # still the attached server, not a launched one
    assert wire.config.api_key_env == "MY_KEY"
    assert wire.cache_reset_path == "/reset_prefix_cache"
    assert wire.prompt_ids_fields({"messages": []})  # asks for the prompt's token ids
    assert wire.gives_prompt_ids() and not engine.gives_prompt_ids()  # so ids are kept


def test_an_attached_sglang_tags_its_calls_as_sglang() -> None:
    wire = speaking_as(make_engine(ATTACHED), "sglang")
    assert isinstance(wire, SglangEngine)
    body, _ = wire.request_tags("u2", "")
    assert body == {"rid": "u2", "session_id": "u2"}
    assert wire.cache_reset_path == SglangEngine.cache_reset_path
    assert wire.gives_prompt_ids()  # return_input_ids_in_sglext: its ids come back with the reply


def test_unknown_family_and_launched_engines_are_left_as_they_are() -> None:
    engine = make_engine(ATTACHED)
    assert speaking_as(engine, None) is engine
    assert speaking_as(engine, "tgi") is engine
    assert speaking_as(engine, "attach") is engine
    assert isinstance(speaking_as(engine, None), AttachEngine)
    launched = make_engine(EngineConfig())
    assert speaking_as(launched, "sglang") is launched  # a launched engine knows what it is
