"""The Hugging Face config of an exported cqk model (`model_type` "cqk").

config.json holds cqk's own model config under its own names (the keys of
config.yaml's `model` section, include/cqk/config.h), resolved by `cqk
export`; attribute_map gives the standard names transformers and lm-eval read.
"""
from transformers import PretrainedConfig

# The fields of cqk's model config, as TransformerLM (cqk_model.py) takes them.
CQK_MODEL_FIELDS = ("vocab_size", "width", "layers", "heads", "kv_heads", "mlp", "mlp_hidden", "rope_base",
                    "init_std", "norm_eps", "attention")


class CqkConfig(PretrainedConfig):
    model_type = "cqk"
    attribute_map = {"hidden_size": "width", "num_hidden_layers": "layers", "num_attention_heads": "heads",
                     "intermediate_size": "mlp_hidden", "rope_theta": "rope_base", "rms_norm_eps": "norm_eps"}

    vocab_size: int = 32000
    width: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 0
    mlp: str = "swiglu"
    mlp_hidden: int = 0
    rope_base: float = 10000.0
    init_std: float = 0.02
    norm_eps: float = 1e-5
    attention: dict | None = None
    # cqk's data.seq_len: generation keeps the last this many tokens as context, as `cqk generate` does.
    max_position_embeddings: int = 32
    tie_word_embeddings: bool = True
    use_cache: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def cqk_model_config(self):
        """The dict cqk_model.TransformerLM takes."""
        return {name: getattr(self, name) for name in CQK_MODEL_FIELDS}
