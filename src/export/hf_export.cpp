#include "cqk/hf_export.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "cqk/safetensors.h"
#include "export/hf_model_code.h"
#include "export/model_config_json.h"

namespace cqk {

namespace fs = std::filesystem;

namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) throw std::runtime_error("cannot write " + path.string());
}

nlohmann::json hf_config(const Config& config, bool with_tokenizer,
                         const HfExportSource& source) {
  auto json = model_config_json(config.model);
  // The MLP's width as built (model.mlp_hidden 0 means "derived from the width").
  json["mlp_hidden"] = mlp_hidden_size(config.model);
  json["model_type"] = "cqk";
  json["architectures"] = {"CqkForCausalLM"};
  json["auto_map"] = {{"AutoConfig", "configuration_cqk.CqkConfig"},
                      {"AutoModelForCausalLM", "modeling_cqk.CqkForCausalLM"}};
  json["max_position_embeddings"] = config.data.seq_len;
  json["tie_word_embeddings"] = true;
  json["use_cache"] = false;
  json["dtype"] = "float32";
  if (with_tokenizer) {  // sentencepiece's defaults, which `cqk data tokenizer` keeps
    json["bos_token_id"] = 1;
    json["eos_token_id"] = 2;
  }
  json["cqk_source"] = {{"run_dir", fs::absolute(source.run_dir).string()},
                        {"checkpoint", fs::absolute(source.checkpoint).string()},
                        {"step", source.step},
                        {"data_kind", to_string(config.data.kind)}};
  return json;
}

nlohmann::json tokenizer_config(const Config& config) {
  return {{"tokenizer_class", "CqkTokenizer"},
          {"auto_map", {{"AutoTokenizer", {"tokenization_cqk.CqkTokenizer", nullptr}}}},
          {"model_max_length", config.data.seq_len},
          {"unk_token", "<unk>"},
          {"bos_token", "<s>"},
          {"eos_token", "</s>"}};
}

void write_folder(TransformerLM& model, const Config& config, const std::optional<std::string>& tokenizer_path,
                  const HfExportSource& source, const fs::path& dir) {
  NamedTensors tensors;
  for (const auto& item : model->named_parameters()) tensors.emplace_back(item.key(), item.value().to(at::kFloat));
  for (const auto& item : model->named_buffers()) tensors.emplace_back(item.key(), item.value());
  save_safetensors((dir / "model.safetensors").string(), tensors, {{"format", "pt"}});
  write_text(dir / "config.json", hf_config(config, tokenizer_path.has_value(), source).dump(2) + "\n");
  for (std::size_t i = 0; i < embedded::kHfModelCodeCount; ++i) {
    const auto& file = embedded::kHfModelCode[i];
    const bool tokenizer_code = std::string(file.name) == "tokenization_cqk.py";
    if (!tokenizer_code || tokenizer_path) write_text(dir / file.name, file.text);
  }
  if (tokenizer_path) {
    fs::copy_file(*tokenizer_path, dir / "tokenizer.model");
    write_text(dir / "tokenizer_config.json", tokenizer_config(config).dump(2) + "\n");
  }
}

}  // namespace

void export_hf(TransformerLM& model, const Config& config, const std::optional<std::string>& tokenizer_path,
               const HfExportSource& source, const std::string& out_dir) {
  // "exports/x/" names the folder x: without the trailing separator the staging folder is x's sibling, not its child.
  fs::path out = fs::absolute(out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();
  if (fs::exists(out) && !(fs::is_directory(out) && fs::is_empty(out)))
    throw std::runtime_error(out_dir + " exists and is not an empty folder; export writes a new folder");
  const fs::path staging = out.parent_path() / ("." + out.filename().string() + ".tmp." + std::to_string(::getpid()));
  fs::create_directories(staging);
  try {
    write_folder(model, config, tokenizer_path, source, staging);
    if (fs::exists(out)) fs::remove(out);  // the empty folder the user made
    fs::rename(staging, out);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    throw;
  }
}

}  // namespace cqk
