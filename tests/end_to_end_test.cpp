// End to end through the tool, as a user would: text the test generates ->
// `cqk data tokenizer` -> `cqk data encode` -> `cqk train` (vanilla, and coupled
// Differential) -> the validation loss must fall well below the unigram
// entropy of the encoded text, i.e. the model learned context, not frequencies.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cqk/token_file.h"
#include "temp_dir.h"

namespace {

// Sentences from a small template grammar: many distinct words (high unigram
// entropy) in a rigid order (low conditional entropy).
std::string generated_text(unsigned seed, int sentences) {
  const std::vector<std::string> adjectives{"red", "quiet", "tall", "old", "bright", "small", "green", "slow"};
  const std::vector<std::string> nouns{"river", "garden", "engine", "teacher", "window", "harbour", "forest", "clock"};
  const std::vector<std::string> verbs{"watches", "follows", "paints", "repairs", "visits", "remembers"};
  std::mt19937 rng(seed);
  const auto pick = [&](const std::vector<std::string>& words) { return words[rng() % words.size()]; };
  std::string text;
  for (int i = 0; i < sentences; ++i) {
    text += "the " + pick(adjectives) + " " + pick(nouns) + " " + pick(verbs) + " the " + pick(nouns) + " near the " +
            pick(adjectives) + " " + pick(nouns) + " .\n";
  }
  return text;
}

int run(const std::string& command) { return std::system((command + " > /dev/null 2>&1").c_str()); }

double unigram_entropy(const cqk::TokenFile& tokens) {
  std::map<uint32_t, double> counts;
  for (int64_t i = 0; i < tokens.size(); ++i) counts[tokens[i]] += 1.0;
  double entropy = 0.0;
  for (const auto& [token, count] : counts) {
    const double p = count / static_cast<double>(tokens.size());
    entropy -= p * std::log(p);
  }
  return entropy;
}

class EndToEnd : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string corpus = dir_ / "corpus";
    ASSERT_EQ(run("mkdir -p " + corpus), 0);
    const std::pair<const char*, unsigned> splits[] = {{"train.txt", 1}, {"valid.txt", 2}, {"test.txt", 3}};
    for (const auto& [name, seed] : splits) std::ofstream(corpus + "/" + name) << generated_text(seed, seed == 1 ? 3000 : 300);
    const std::string tool = CQK_TOOL;
    ASSERT_EQ(run(tool + " data tokenizer --input " + corpus + "/train.txt --vocab-size 320 --out " +
                  (dir_ / "tokenizer.model")),
              0);
    ASSERT_EQ(run(tool + " data encode --input " + corpus + " --tokenizer " + (dir_ / "tokenizer.model") +
                  " --out " + (dir_ / "tokens")),
              0);
  }

  // Trains on the encoded text and returns the final validation loss per token.
  double train(const std::string& name, const std::string& extra) {
    const std::string run_dir = dir_ / name;
    const std::string command = std::string(CQK_TOOL) + " train --set data.kind=tokens --set data.dir=" +
                                (dir_ / "tokens") +
                                " --set data.seq_len=32 --set data.batch_size=16 --set model.width=64"
                                " --set model.layers=2 --set model.heads=4 --set train.steps=200 --set train.lr=3.0e-3"
                                " --set train.warmup_steps=20 --set train.eval_every=100 --set train.log_every=50"
                                " --set train.checkpoint_every=100 --set run.dir=" +
                                run_dir + " " + extra;
    EXPECT_EQ(run(command), 0) << command;
    std::ifstream results(run_dir + "/results.json");
    return nlohmann::json::parse(results)["valid"]["loss"].get<double>();
  }

  cqk::testing::TempDir dir_{"cqk-e2e"};
};

TEST_F(EndToEnd, LossFallsWellBelowTheUnigramEntropy) {
  const double entropy = unigram_entropy(cqk::TokenFile(dir_ / "tokens/valid.bin"));
  ASSERT_GT(entropy, 2.5) << "the generated text must not be trivially predictable from frequencies";
  const double vanilla = train("vanilla", "--set model.attention.coupling.kind=none");
  const double coupled_diff =
      train("diff-affine", "--set model.attention.kind=diff --set model.attention.coupling.kind=affine");
  std::printf("unigram entropy %.3f nats; valid loss: vanilla %.3f, coupled diff %.3f\n", entropy, vanilla,
              coupled_diff);
  EXPECT_LT(vanilla, 0.5 * entropy) << "unigram entropy " << entropy;
  EXPECT_LT(coupled_diff, 0.5 * entropy) << "unigram entropy " << entropy;
}

}  // namespace
