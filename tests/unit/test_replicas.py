"""The serving replica of each call, from the replicas' logs and KV events."""

from kvscope.finalize import replicas

A, B, C, D = (f"{c * 8}-1111-4111-8111-{c * 12}" for c in "abcd")
LOGS = {
    # as vLLM 0.32 writes them with --enable-log-requests (the suffix is vLLM's own)
    "r0": f"(APIServer pid=25170) INFO 11-24 21:46:24 [async_llm.py:578] Added request "
    f"chatcmpl-{A}-a29d9626.\n"
    f"(APIServer pid=25170) INFO 11-24 21:46:26 [async_llm.py:578] Added request chatcmpl-{C}.\n"
    f"(APIServer pid=25170) INFO 11-24 21:46:27 [logger.py:66] Received request chatcmpl-{B}: "
    "params: ...\n",
    "r1": f"(APIServer pid=25171) INFO 11-24 21:46:22 [async_llm.py:578] Added request "
    f"chatcmpl-{B}-9e7360fe.\n"
    f"(APIServer pid=25171) INFO 11-24 21:46:26 [async_llm.py:578] Added request chatcmpl-{C}.\n",
}


def test_from_logs() -> None:
    got = replicas.from_logs(LOGS, [A, B, C, D])
    # B is only *received* on r0 (never added there); C was added on both: unknown
    assert got == {A: "r0", B: "r1", C: None, D: None}


def test_from_kv_events() -> None:
    got = replicas.from_kv_events({"r0": [A, None, A], "r1": [B, C], "r2": [C]}, [A, B, C, D])
    assert got == {A: "r0", B: "r1", C: None, D: None}
