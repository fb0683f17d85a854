#include "cqk/evaluation_report.h"

#include <cstdio>

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

std::string number(const char* spec, double value) {
  char text[64];
  std::snprintf(text, sizeof text, spec, value);
  return text;
}

std::string target_loss_text(const char* name, const TargetLoss& part) {
  return std::string(" | ") + name + " loss " + (part.loss ? number("%.6f", *part.loss) : std::string("-")) + " (" +
         std::to_string(part.tokens) + ")";
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
  std::string text = "ppl " + number("%.6f", e.perplexity) + " | loss " + number("%.6f", e.loss) + " | accuracy " +
                     number("%.4f", e.accuracy) + " | tokens " + std::to_string(e.tokens);
  if (e.bits_per_byte) text += " | bpb " + number("%.6f", *e.bits_per_byte);
  if (e.word_perplexity) text += " | word ppl " + number("%.6f", *e.word_perplexity);
  return text + target_loss_text("seen", e.seen) + target_loss_text("unseen", e.unseen);
}

}  // namespace cqk
