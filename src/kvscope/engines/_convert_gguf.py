"""Convert a GGUF model file to a Hugging Face folder (safetensors + tokenizer + chat template).

Run as a script with the engine's own interpreter (it needs torch, transformers and gguf, which
kvscope itself does not depend on):  python _convert_gguf.py MODEL.gguf OUT_DIR
"""

import json
import sys
from pathlib import Path


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=name, dequantize=True),
    )
    # save_pretrained refuses packed GGUF weights; after dequantizing they are plain tensors.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    messages = [{"role": "user", "content": "What is 2+2?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    print(json.dumps({"saved": str(out), "chat_prompt_example": prompt}))


if __name__ == "__main__":
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
