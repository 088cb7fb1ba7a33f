"""Real models' shapes, from their Hugging Face configs (no weights), and the planner's machine
presets: what the planner tests, the placement-sum test and bench/plan_time.py plan with."""

from __future__ import annotations

from sidecar.model_info import model_from_hf_config
from sidecar.planner import cpu_only_box, desktop_16gb_pcie5x16, laptop_4gb_pcie4x8

QWEN3_30B_A3B = {
    "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 48,
    "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
}
LLAMA_8B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256, "max_position_embeddings": 131072,
}
SMOLLM2 = {
    "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
    "num_key_value_heads": 3, "num_hidden_layers": 30, "vocab_size": 49152, "tie_word_embeddings": True,
}

HARDWARE = {"laptop": laptop_4gb_pcie4x8, "desktop": desktop_16gb_pcie5x16, "cpu_box": cpu_only_box}
MODELS = {
    "qwen3_30b_a3b": lambda: model_from_hf_config(QWEN3_30B_A3B, "Q4_K_M", name="Qwen3-30B-A3B"),
    "llama_8b": lambda: model_from_hf_config(LLAMA_8B, "Q4_K_M", name="Llama-3.1-8B"),
    "smollm2": lambda: model_from_hf_config(SMOLLM2, "Q4_1", name="SmolLM2-135M"),
}
_cache: dict = {}


def model(name: str):
    if name not in _cache:
        _cache[name] = MODELS[name]()
    return _cache[name]


GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "mm_tokens_per_image": 256,
    "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "num_hidden_layers": 34,
                    "vocab_size": 262208, "sliding_window": 1024, "max_position_embeddings": 131072},
    "vision_config": {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
                      "num_attention_heads": 16, "image_size": 896, "patch_size": 14},
}
