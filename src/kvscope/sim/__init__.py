"""What-if replay: a request trace in block form, replayed through a prefix-cache simulator.

Data flow: a source (a kvscope run directory, a Mooncake trace, a token-id trace) -> `Trace`
(trace.py: per request its timing, identities and chained block keys) -> `simulate` under a
policy and a capacity -> `SimResult` (per request cached blocks, evictions) -> summaries per
agent and transition, fidelity against the engine's measured cached tokens.
"""
