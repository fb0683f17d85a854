// evaluation.h: bits per byte, word perplexity and the seen/unseen split of the
// loss, each against a reference computed here independently: the model's
// logits through log_softmax in float64, byte and word counts from the text
// itself, seen sets from the token ids.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "cqk/corpus_encoding.h"
#include "cqk/evaluation.h"
#include "cqk/evaluation_report.h"
#include "cqk/recall_task.h"
#include "cqk/text_corpus.h"
#include "cqk/token_file.h"
#include "cqk/token_loader.h"
#include "cqk/tokenizer.h"
#include "temp_dir.h"
#include "test_io.h"
#include "word_count.h"

namespace {

using cqk::testing::TempDir;
using cqk::testing::reference_word_count;
using cqk::testing::write_file;

const c10::Device kCpu(c10::kCPU);

// A random model whose predictions differ from token to token (init_std large
// enough that the loss is not just ln V).
cqk::TransformerLM random_model(int64_t vocab) {
  at::manual_seed(3);
  cqk::ModelConfig config;
  config.vocab_size = vocab;
  config.width = 32;
  config.layers = 1;
  config.heads = 2;
  config.init_std = 0.3;
  cqk::TransformerLM model(config);
  model->eval();
  return model;
}

// -log p(ids[i+1] | ids[0..i]) for i in [0, n), in float64, from one forward pass over ids[0..n).
std::vector<double> reference_nll(cqk::TransformerLM& model, const std::vector<int64_t>& ids, int64_t n) {
  at::NoGradGuard no_grad;
  const auto inputs = at::tensor(std::vector<int64_t>(ids.begin(), ids.begin() + n)).unsqueeze(0);
  const auto targets = at::tensor(std::vector<int64_t>(ids.begin() + 1, ids.begin() + n + 1));
  const auto log_p = at::log_softmax(model->forward(inputs)[0].to(at::kDouble), -1);
  const auto nll = -log_p.gather(1, targets.unsqueeze(1)).squeeze(1);
  return {nll.data_ptr<double>(), nll.data_ptr<double>() + n};
}

std::vector<int64_t> token_ids(const std::string& path) {
  const cqk::TokenFile file(path);
  std::vector<int64_t> ids(static_cast<std::size_t>(file.size()));
  file.read(0, file.size(), ids.data());
  return ids;
}

double sum(const std::vector<double>& values) {
  double total = 0;
  for (const double v : values) total += v;
  return total;
}

cqk::DataConfig token_data(const std::string& dir, int64_t seq_len, int64_t batch_size) {
  cqk::DataConfig data;
  data.kind = cqk::DataKind::Tokens;
  data.dir = dir;
  data.seq_len = seq_len;
  data.batch_size = batch_size;
  data.prefetch = 0;
  return data;
}

// A tokenizer trained on English-like text, a validation text with characters
// it never saw (byte fallback: several ids per character) and runs of spaces.
class TextEvaluation : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string train;
    for (int i = 0; i < 400; ++i)
      train += "the model reads line " + std::to_string(i % 37) + " of the quiet harbour and the old clock .\n";
    // The first line is empty, so the split's first token (never a target) is
    // the newline: one byte. ASCII first, so that the first window's text is valid UTF-8.
    valid_ = "\nthe clock reads the harbour line 12 .\n  the old  model .\n\tthe quiet line 7 of the model .\n"
             "naïve café, Zürich — 東京 and 🙂 are new here .\n\n the end .\n";
    std::filesystem::create_directories(tmp_ / "corpus");
    write_file(tmp_ / "corpus/train.txt", train);
    write_file(tmp_ / "corpus/valid.txt", valid_);
    write_file(tmp_ / "corpus/test.txt", valid_);
    cqk::TokenizerTrainOptions options;
    options.inputs = {tmp_ / "corpus/train.txt"};
    options.vocab_size = 300;
    options.model_path = tmp_ / "tokenizer.model";
    options.threads = 1;
    cqk::train_tokenizer(options);
    const cqk::Tokenizer tokenizer(options.model_path);
    cqk::encode_corpus(cqk::detect_corpus(tmp_ / "corpus"), tokenizer, tmp_ / "tokens", 1);
    ids_ = token_ids(tmp_ / "tokens/valid.bin");
  }

  TempDir tmp_{"cqk-eval-text"};
  std::string valid_;
  std::vector<int64_t> ids_;
};

TEST_F(TextEvaluation, BitsPerByteAndWordPerplexityOfTheWholeSplit) {
  const int64_t targets = static_cast<int64_t>(ids_.size()) - 1;
  ASSERT_GT(targets, 60);
  // One window holds the whole split: the reference is one forward pass.
  cqk::TokenBatchSource source(token_data(tmp_ / "tokens", targets + 8, 2), 1);
  auto model = random_model(source.vocab_size());
  const auto e = cqk::evaluate(model, source, cqk::Split::Valid, 0, kCpu, cqk::target_tables(source));

  const double nll = sum(reference_nll(model, ids_, targets));
  const auto bytes = static_cast<int64_t>(valid_.size()) - 1;  // all but the first newline
  ASSERT_EQ(e.tokens, targets);
  EXPECT_NEAR(e.loss, nll / static_cast<double>(targets), 1e-6);
  EXPECT_EQ(e.bytes, bytes);
  ASSERT_TRUE(e.bits_per_byte);
  EXPECT_NEAR(*e.bits_per_byte, nll / std::log(2.0) / static_cast<double>(bytes), 1e-6 * *e.bits_per_byte);
  const int64_t words = reference_word_count(valid_);
  EXPECT_EQ(e.words, words);
  ASSERT_TRUE(e.word_perplexity);
  EXPECT_NEAR(*e.word_perplexity, std::exp(nll / static_cast<double>(words)), 1e-6 * *e.word_perplexity);
  // Every valid target also occurs in train.txt except the new characters' bytes.
  EXPECT_GT(e.unseen.tokens, 0);
  EXPECT_EQ(e.seen.tokens + e.unseen.tokens, e.tokens);
}

TEST_F(TextEvaluation, BitsPerByteOfPartOfTheSplitCountsOnlyItsTargets) {
  // The first window of 24 tokens: targets 1..24, whose text is the decoded
  // first 25 ids less the leading newline (decoded by sentencepiece, not the byte table).
  const int64_t window = 24;
  cqk::TokenBatchSource source(token_data(tmp_ / "tokens", window, 1), 1);
  auto model = random_model(source.vocab_size());
  const auto e = cqk::evaluate(model, source, cqk::Split::Valid, 1, kCpu, cqk::target_tables(source));

  const cqk::Tokenizer tokenizer(tmp_ / "tokens/tokenizer.model");
  const std::string text = tokenizer.decode(std::vector<int>(ids_.begin(), ids_.begin() + window + 1));
  ASSERT_EQ(text, valid_.substr(0, text.size())) << "the window must end on a character boundary";
  const double nll = sum(reference_nll(model, ids_, window));
  const auto bytes = static_cast<int64_t>(text.size()) - 1;
  ASSERT_EQ(e.tokens, window);
  EXPECT_EQ(e.bytes, bytes);
  ASSERT_TRUE(e.bits_per_byte);
  EXPECT_NEAR(*e.bits_per_byte, nll / std::log(2.0) / static_cast<double>(bytes), 1e-6 * *e.bits_per_byte);
  EXPECT_FALSE(e.word_perplexity) << "part of a split has no word count";
}

// Tokens 1, 2, 3 are training targets; 5 is only the first training token (an
// input, never a target); 7 never occurs.
TEST(Evaluation, SeenAndUnseenTargetsOfAHandMadeTokenFile) {
  TempDir tmp("cqk-eval-seen");
  std::vector<int32_t> train{5};
  for (int i = 0; i < 30; ++i) train.insert(train.end(), {1, 2, 3});
  cqk::write_token_file(tmp / "train.bin", train, 16, 9);
  const std::vector<int64_t> valid{1, 2, 5, 3, 7, 1, 2};  // targets 2 5 3 7 1 2: seen 2 3 1 2, unseen 5 7
  cqk::write_token_file(tmp / "valid.bin", std::vector<int32_t>(valid.begin(), valid.end()), 16, 9);
  cqk::write_token_file(tmp / "test.bin", {1, 2, 3}, 16, 9);
  cqk::TokenBatchSource source(token_data(tmp.path(), 8, 1), 1);

  const auto seen = source.targets_in_training();
  std::vector<uint8_t> expected(16, 0);
  expected[1] = expected[2] = expected[3] = 1;
  EXPECT_EQ(seen, expected);

  auto model = random_model(16);
  const auto e = cqk::evaluate(model, source, cqk::Split::Valid, 0, kCpu, cqk::target_tables(source));
  const auto nll = reference_nll(model, valid, 6);
  const double seen_nll = nll[0] + nll[2] + nll[4] + nll[5], unseen_nll = nll[1] + nll[3];
  EXPECT_EQ(e.tokens, 6);
  EXPECT_EQ(e.seen.tokens, 4);
  EXPECT_EQ(e.unseen.tokens, 2);
  ASSERT_TRUE(e.seen.loss && e.unseen.loss);
  EXPECT_NEAR(*e.seen.loss, seen_nll / 4, 1e-6);
  EXPECT_NEAR(*e.unseen.loss, unseen_nll / 2, 1e-6);
  EXPECT_NEAR(e.loss, (seen_nll + unseen_nll) / 6, 1e-6);
  // No tokenizer.model and no meta.json in the folder: no bytes, no words.
  EXPECT_FALSE(e.bits_per_byte);
  EXPECT_FALSE(e.word_perplexity);

  // Against another training set (every id seen) the same targets are all seen.
  const auto all_seen = cqk::evaluate(model, source, cqk::Split::Valid, 0, kCpu,
                                      cqk::TargetTables{std::vector<uint8_t>(16, 1), {}});
  EXPECT_EQ(all_seen.seen.tokens, 6);
  EXPECT_EQ(all_seen.unseen.tokens, 0);
  EXPECT_FALSE(all_seen.unseen.loss);
  EXPECT_THROW(cqk::evaluate(model, source, cqk::Split::Valid, 0, kCpu, cqk::TargetTables{{1, 1}, {}}),
               std::invalid_argument);
}

TEST(Evaluation, RecallTargetsSeenAreTheValuesOfTheTrainingPool) {
  cqk::DataConfig data;
  data.seq_len = 24;
  data.batch_size = 4;
  data.recall.vocab_size = 64;
  data.recall.pairs = 4;
  data.recall.train_examples = 1;  // one training sequence: four values seen
  data.recall.eval_examples = 12;
  cqk::RecallTask source(data, 2);
  const auto seen = source.targets_in_training();
  const auto example = source.train_batch(0).targets;
  std::set<int64_t> values;
  for (int64_t i = 0; i < example.size(1); ++i)
    if (example[0][i].item<int64_t>() >= 0) values.insert(example[0][i].item<int64_t>());
  ASSERT_EQ(values.size(), 4u);
  for (int64_t id = 0; id < 64; ++id) EXPECT_EQ(seen[static_cast<std::size_t>(id)], values.count(id)) << id;

  int64_t seen_targets = 0;
  for (const auto& batch : source.eval_batches(cqk::Split::Valid, 0))
    for (const int64_t value : values) seen_targets += batch.targets.eq(value).sum().item<int64_t>();
  auto model = random_model(64);
  const auto e = cqk::evaluate(model, source, cqk::Split::Valid, 0, kCpu, cqk::target_tables(source));
  EXPECT_EQ(e.tokens, 12 * 4);
  EXPECT_EQ(e.seen.tokens, seen_targets);
  EXPECT_EQ(e.unseen.tokens, e.tokens - seen_targets);
  EXPECT_FALSE(e.bits_per_byte) << "recall data is not text";
  EXPECT_FALSE(e.word_perplexity);
}

TEST(Evaluation, SummaryOfSumsAndItsJson) {
  cqk::EvaluationSums sums;
  sums.nll = 10.0;
  sums.seen_nll = 6.0;
  sums.tokens = 4;
  sums.seen_tokens = 3;
  sums.correct = 1;
  sums.bytes = 8;
  const auto round_trip = cqk::EvaluationSums::from_vector(sums.to_vector());
  EXPECT_EQ(round_trip.to_vector(), sums.to_vector());

  const auto e = cqk::summarize(sums, 5);
  EXPECT_DOUBLE_EQ(e.loss, 2.5);
  EXPECT_DOUBLE_EQ(e.perplexity, std::exp(2.5));
  EXPECT_DOUBLE_EQ(e.accuracy, 0.25);
  EXPECT_DOUBLE_EQ(*e.bits_per_byte, 10.0 / std::log(2.0) / 8.0);
  EXPECT_DOUBLE_EQ(*e.word_perplexity, std::exp(2.0));
  EXPECT_DOUBLE_EQ(*e.seen.loss, 2.0);
  EXPECT_DOUBLE_EQ(*e.unseen.loss, 4.0);
  EXPECT_EQ(e.unseen.tokens, 1);

  const auto flat = cqk::flat_evaluation_json("valid_", e);
  for (const char* key : {"valid_loss", "valid_ppl", "valid_accuracy", "valid_tokens", "valid_bpb", "valid_bytes",
                          "valid_word_ppl", "valid_words", "valid_seen_loss", "valid_seen_tokens", "valid_unseen_loss",
                          "valid_unseen_tokens"})
    EXPECT_TRUE(flat.contains(key)) << key << " in " << flat.dump();
  EXPECT_EQ(flat.size(), 12u) << flat.dump();
  EXPECT_DOUBLE_EQ(cqk::evaluation_json(e)["seen"]["loss"].get<double>(), 2.0);

  // Without bytes or words, and with no unseen target, those entries are left out.
  sums.bytes = 0;
  sums.seen_nll = sums.nll;
  sums.seen_tokens = sums.tokens;
  const auto j = cqk::evaluation_json(cqk::summarize(sums, std::nullopt));
  EXPECT_FALSE(j.contains("bpb") || j.contains("bytes") || j.contains("word_ppl") || j.contains("words")) << j.dump();
  EXPECT_EQ(j["unseen"], nlohmann::json({{"tokens", 0}}));
  EXPECT_EQ(cqk::describe(cqk::summarize(sums, std::nullopt)),
            "ppl 12.182494 | loss 2.500000 | accuracy 0.2500 | tokens 4 | seen loss 2.500000 (4) | unseen loss - (0)");
}

}  // namespace
