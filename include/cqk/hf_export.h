#pragma once
// A trained cqk model as a Hugging Face model folder (`cqk export RUN --out DIR`):
//   model.safetensors      every parameter under its cqk state-dict name
//                          (embedding.weight, blocks.0.attention.q_proj.weight, ...), float32
//   config.json            model_type "cqk": the run's model config under config.yaml's names,
//                          max_position_embeddings = data.seq_len, auto_map to the code below
//   configuration_cqk.py, modeling_cqk.py, cqk_model.py
//                          the model code (python/cqk_hf/, built into the library)
//   tokenizer.model, tokenization_cqk.py, tokenizer_config.json
//                          the run's sentencepiece model (runs on token files only)
// so that transformers' Auto classes load it with trust_remote_code=True, offline.
#include <optional>
#include <string>

#include "cqk/config.h"
#include "cqk/model.h"

namespace cqk {

struct HfExportSource {
  std::string run_dir;
  std::string checkpoint;
  int64_t step = 0;
};

// Writes the folder `out_dir`, which must not exist or be empty: everything is
// written into a temporary folder next to it and renamed at the end, so a
// failure leaves nothing behind. Throws std::runtime_error naming the problem.
void export_hf(TransformerLM& model, const Config& config, const std::optional<std::string>& tokenizer_path,
               const HfExportSource& source, const std::string& out_dir);

}  // namespace cqk
