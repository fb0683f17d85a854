#include "cqk/evaluation_report.h"

#include "support/printf_number.h"

namespace cqk {
namespace {

nlohmann::json target_loss_json(const TargetLoss& part) {
  nlohmann::json j = {{"tokens", part.tokens}};
  if (part.loss) j["loss"] = *part.loss;
  return j;
}

void flatten(const std::string& prefix, const nlohmann::json& object, nlohmann::json& out) {
  for (const auto& [key, value] : object.items()) {
    if (value.is_object()) flatten(prefix + key + "_", value, out);
    else out[prefix + key] = value;
  }
}

std::string target_loss_text(const char* name, const TargetLoss& part) {
  return std::string(" | ") + name + " loss " + (part.loss ? printf_number("%.6f", *part.loss) : std::string("-")) +
         " (" + std::to_string(part.tokens) + ")";
}

}  // namespace

nlohmann::json evaluation_json(const Evaluation& e) {
  nlohmann::json j = {{"loss", e.loss}, {"ppl", e.perplexity}, {"accuracy", e.accuracy}, {"tokens", e.tokens}};
  if (e.bits_per_byte) {
    j["bpb"] = *e.bits_per_byte;
    j["bytes"] = e.bytes;
  }
  if (e.word_perplexity) {
    j["word_ppl"] = *e.word_perplexity;
    j["words"] = e.words;
  }
  j["seen"] = target_loss_json(e.seen);
  j["unseen"] = target_loss_json(e.unseen);
  return j;
}

nlohmann::json flat_evaluation_json(const std::string& prefix, const Evaluation& evaluation) {
  nlohmann::json out = nlohmann::json::object();
  flatten(prefix, evaluation_json(evaluation), out);
  return out;
}

std::string describe(const Evaluation& e) {
  std::string text = "ppl " + printf_number("%.6f", e.perplexity) + " | loss " + printf_number("%.6f", e.loss) +
                     " | accuracy " + printf_number("%.4f", e.accuracy) + " | tokens " + std::to_string(e.tokens);
  if (e.bits_per_byte) text += " | bpb " + printf_number("%.6f", *e.bits_per_byte);
  if (e.word_perplexity) text += " | word ppl " + printf_number("%.6f", *e.word_perplexity);
  return text + target_loss_text("seen", e.seen) + target_loss_text("unseen", e.unseen);
}

nlohmann::json coupling_json(const std::vector<CouplingDiagnostics>& layers) {
  auto out = nlohmann::json::array();
  for (const auto& l : layers) {
    nlohmann::json j = {{"layer", l.layer}, {"q_change", l.q_change}, {"k_change", l.k_change}};
    if (l.mean_abs_log_scale) j["mean_abs_log_scale"] = *l.mean_abs_log_scale;
    if (l.mean_log_det) j["mean_log_det"] = *l.mean_log_det;
    out.push_back(j);
  }
  return out;
}

std::vector<CouplingDiagnostics> coupling_from_json(const nlohmann::json& layers) {
  std::vector<CouplingDiagnostics> out;
  for (const auto& j : layers) {
    CouplingDiagnostics l;
    l.layer = j.at("layer").get<int64_t>();
    l.q_change = j.at("q_change").get<double>();
    l.k_change = j.at("k_change").get<double>();
    if (j.contains("mean_abs_log_scale")) l.mean_abs_log_scale = j["mean_abs_log_scale"].get<double>();
    if (j.contains("mean_log_det")) l.mean_log_det = j["mean_log_det"].get<double>();
    out.push_back(l);
  }
  return out;
}

std::string describe(const std::vector<CouplingDiagnostics>& layers) {
  if (layers.empty()) return "no coupling";
  const auto mean = mean_over_layers(layers);
  std::string text = "coupling over " + std::to_string(layers.size()) + " layers: q change " +
                     printf_number("%.4f", mean.q_change) + " | k change " + printf_number("%.4f", mean.k_change);
  if (mean.mean_abs_log_scale) text += " | mean |s| " + printf_number("%.4f", *mean.mean_abs_log_scale);
  if (mean.mean_log_det) text += " | log det " + printf_number("%.4f", *mean.mean_log_det);
  return text;
}

}  // namespace cqk
