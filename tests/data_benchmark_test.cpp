// corpus_encoding.h (the encoder `cqk data encode` runs) and `cqk bench data`
// end to end on a small generated text. No timing assertions: the figures
// exist, are positive and are consistent with each other.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cqk/corpus_encoding.h"
#include "cqk/token_file.h"
#include "cqk/tokenizer.h"
#include "temp_dir.h"
#include "test_io.h"
#include "word_count.h"

namespace {

using cqk::testing::read_file;
using cqk::testing::run_command;
using cqk::testing::TempDir;

using nlohmann::json;

// Lines of words drawn from a small, skewed vocabulary: text a BPE model can learn.
void write_text(const std::string& path, int lines, unsigned seed) {
  static const std::vector<std::string> words = {"the", "coupled", "query", "key", "attention", "of", "a",
                                                 "model", "learns", "head", "token", "and", "with", "map",
                                                 "invertible", "scores", "values", "é", "日本"};
  std::mt19937 rng(seed);
  std::geometric_distribution<int> pick(0.25);
  std::uniform_int_distribution<int> length(3, 14);
  std::ofstream out(path);
  for (int i = 0; i < lines; ++i) {
    const int n = length(rng);
    for (int w = 0; w < n; ++w) out << (w ? " " : "") << words[static_cast<size_t>(pick(rng)) % words.size()];
    out << (i % 7 == 0 ? "\r\n" : "\n");
  }
}

std::string trained_tokenizer(const TempDir& tmp, const std::string& text) {
  cqk::TokenizerTrainOptions options;
  options.inputs = {text};
  options.vocab_size = 300;
  options.model_path = tmp / "tok.model";
  options.threads = 1;
  cqk::train_tokenizer(options);
  return options.model_path;
}

TEST(CorpusEncoding, TokenFileDoesNotDependOnThreadsAndDecodesToTheText) {
  TempDir tmp("cqk-encode");
  const std::string text = tmp / "text.txt";
  write_text(text, 1500, 1);
  const cqk::Tokenizer tokenizer(trained_tokenizer(tmp, text));
  const auto one = cqk::encode_text_file(tokenizer, text, tmp / "one.bin", "one", 1);
  const auto three = cqk::encode_text_file(tokenizer, text, tmp / "three.bin", "three", 3);
  // The text as encoded: line ends normalised to "\n".
  std::string expected = read_file(text), normalised;
  for (size_t i = 0; i < expected.size(); ++i)
    if (!(expected[i] == '\r' && i + 1 < expected.size() && expected[i + 1] == '\n')) normalised += expected[i];
  EXPECT_EQ(one.lines, 1500);
  EXPECT_EQ(one.bytes, static_cast<int64_t>(normalised.size()));
  EXPECT_EQ(one.words, cqk::testing::reference_word_count(normalised));
  EXPECT_EQ(one.tokens, three.tokens);
  EXPECT_EQ(three.bytes, one.bytes);
  EXPECT_EQ(three.words, one.words);
  EXPECT_EQ(read_file(tmp / "one.bin"), read_file(tmp / "three.bin"));

  // The token file decodes back to the text.
  const cqk::TokenFile file(tmp / "one.bin");
  ASSERT_EQ(static_cast<int64_t>(file.size()), one.tokens);
  std::vector<int> ids(static_cast<size_t>(file.size()));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(file[static_cast<int64_t>(i)]);
  EXPECT_EQ(tokenizer.decode(ids), normalised);
}

TEST(BenchData, ReportsEveryStageAndTheLoaderAgainstTraining) {
  TempDir tmp("cqk-bench-data");
  const std::string text = tmp / "text.txt";
  write_text(text, 3000, 2);
  const std::string tool = CQK_TOOL;
  const auto r = run_command(tool + " --threads 1 bench data --input " + text +
                     " --vocab-size 300 --jobs 1 --seq-len 32 --batch-size 4 --batches 200 --train-steps 1"
                     " --work-dir " + (tmp / "work") + " --set train.threads=1 --set data.batch_size=4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // The JSON object is the last line (the log lines come before it).
  const auto last = r.out.rfind("\n{");
  ASSERT_NE(last, std::string::npos) << r.out;
  const json j = json::parse(r.out.substr(last + 1));
  EXPECT_EQ(j["format"], "file");
  EXPECT_EQ(j["vocab_size"], 300);
  EXPECT_GT(j["tokenizer_seconds"].get<double>(), 0.0);
  // One file serves all three splits and is encoded once.
  EXPECT_EQ(j["encode"]["lines"], 3000);
  EXPECT_GT(j["encode"]["tokens"].get<int64_t>(), 3000);
  EXPECT_GT(j["encode"]["tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["loader"]["tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["loader"]["tokens_per_s_without_prefetch"].get<double>(), 0.0);
  const double training = j["training"]["tokens_per_s"].get<double>();
  EXPECT_GT(training, 0.0);
  EXPECT_NEAR(j["training"]["loader_over_training"].get<double>(), j["loader"]["tokens_per_s"].get<double>() / training,
              1e-6 * j["training"]["loader_over_training"].get<double>());
  // --work-dir keeps what was made: the tokenizer and a token file per split.
  for (const char* name : {"tokenizer.model", "tokens/train.bin", "tokens/valid.bin", "tokens/test.bin"})
    EXPECT_FALSE(read_file(tmp / "work/" + name).empty()) << name;

  const auto missing = run_command(tool + " bench data --input " + (tmp / "no-such-file.txt") + " --no-training");
  EXPECT_EQ(missing.exit_code, 2) << missing.out;
  EXPECT_NE(missing.out.find("no-such-file.txt"), std::string::npos) << missing.out;
}

}  // namespace
