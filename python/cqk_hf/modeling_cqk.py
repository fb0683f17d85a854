"""A transformers causal LM around the cqk model (cqk_model.py).

The parameters keep cqk's names (embedding.weight, blocks.0.attention.q_proj.weight,
...), so model.safetensors from `cqk export` loads as it is. No KV cache: every
generation step runs the whole context, cut to the last max_position_embeddings
(cqk's data.seq_len) tokens, as `cqk generate` does.
"""
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_cqk import CqkConfig
from .cqk_model import TransformerLM, lm_logits


class CqkForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = CqkConfig
    _no_split_modules = ["Block"]  # device_map="auto" keeps each block on one device

    def __init__(self, config):
        super().__init__(config)
        # TransformerLM's modules as this model's own, so the names are cqk's.
        lm = TransformerLM(config.cqk_model_config())
        self.embedding, self.blocks, self.final_norm = lm.embedding, lm.blocks, lm.final_norm
        self.post_init()

    def get_input_embeddings(self):
        return self.embedding

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        if attention_mask is not None and not bool(attention_mask.cummin(-1).values.eq(attention_mask).all()):
            # Right padding is harmless to a causal model; left padding would shift the positions.
            raise ValueError("cqk models take no left-padded batches (no attention mask); use batch size 1")
        logits = lm_logits(self, input_ids)
        loss = None
        if labels is not None:
            # transformers' convention: labels are aligned with input_ids (the model
            # shifts them: position t predicts t + 1), and -100 marks ignored targets.
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten().to(logits.device),
                                   ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        window = self.config.max_position_embeddings
        return {"input_ids": input_ids[:, -window:]}
