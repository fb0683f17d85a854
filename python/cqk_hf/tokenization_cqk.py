"""The tokenizer of an exported cqk model: the run's sentencepiece model as cqk
uses it (src/support/tokenizer.cpp). Text is encoded by sentencepiece as a whole
(no added BOS/EOS, special-token strings in text are text) and ids decode with
sentencepiece's decoder, so ids and text are exactly cqk's.
"""
from transformers.tokenization_utils_sentencepiece import SentencePieceBackend


class CqkTokenizer(SentencePieceBackend):
    vocab_files_names = {"vocab_file": "tokenizer.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, unk_token="<unk>", bos_token="<s>", eos_token="</s>", **kwargs):
        kwargs.update(legacy=True, split_special_tokens=True, clean_up_tokenization_spaces=False,
                      special_tokens_pattern="none")
        super().__init__(vocab_file=vocab_file, unk_token=unk_token, bos_token=bos_token, eos_token=eos_token,
                         **kwargs)

    def _tokenize(self, text, **kwargs):
        return self.sp_model.encode(text, out_type=str)

    def convert_tokens_to_string(self, tokens):
        return self.sp_model.decode_pieces(tokens)

    def _decode(self, token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=None, **kwargs):
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        if skip_special_tokens:
            special = set(self.all_special_ids)
            ids = [i for i in ids if i not in special]
        return self.sp_model.decode(ids)
