"""Runs in .venv-sglang: SGLang's own request model and grammar backend on kvscope's routing call.

stdin: {"body": <the chat request kvscope sends>, "tokenizer": <folder>, "replies": [...]}.
SGLang's ChatCompletionRequest parses the body, to_sampling_params() turns its response_format
into the `json_schema` SGLang constrains with, and SGLang's XGrammarGrammarBackend (its default
grammar backend) compiles it. Each reply is fed token by token to a fresh matcher, then EOS.
stdout: {"json_schema": str, "max_new_tokens": int, "replies": {reply: {"accepted", "ends"}}}.
"""

import json
import sys

from server_args_probe import declare_torchvision_ops


def main() -> None:
    job = json.load(sys.stdin)
    declare_torchvision_ops()
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from transformers import AutoTokenizer

    request = ChatCompletionRequest(**job["body"])
    params = request.to_sampling_params(stop=[], model_generation_config={})
    tokenizer = AutoTokenizer.from_pretrained(job["tokenizer"])
    backend = XGrammarGrammarBackend(tokenizer, vocab_size=len(tokenizer))
    replies = {}
    for text in job["replies"]:
        matcher = backend.dispatch_json(params["json_schema"]).matcher
        ids = tokenizer.encode(text, add_special_tokens=False)
        accepted = all(matcher.accept_token(i) for i in ids)
        ends = accepted and matcher.accept_token(tokenizer.eos_token_id) and matcher.is_terminated()
        replies[text] = {"accepted": accepted, "ends": bool(ends)}
    out = {"json_schema": params["json_schema"], "max_new_tokens": params["max_new_tokens"]}
    print(json.dumps({**out, "replies": replies}))


if __name__ == "__main__":
    main()
