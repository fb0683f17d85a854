#include <ftw.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "cqk/batch_source.h"
#include "cqk/token_file.h"
#include "cqk/token_loader.h"

namespace {
namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "cqk-loader-XXXXXX").string();
    path = mkdtemp(pattern.data());
  }
  // Not std::filesystem::remove_all: libtorch.so exports its own copy (built
  // with a newer libstdc++) which calls a symbol Debian's libstdc++ lacks and
  // crashes, whichever overload is used.
  ~TempDir() {
    nftw(path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
  }
};

// Token i of every split is i itself (vocab 60000), so a token's value is its position.
constexpr int64_t kVocab = 60000;

void write_split(const fs::path& dir, const std::string& name, int32_t count, uint64_t checksum = 42) {
  std::vector<int32_t> ids(static_cast<std::size_t>(count));
  for (int32_t i = 0; i < count; ++i) ids[static_cast<std::size_t>(i)] = i;
  cqk::write_token_file((dir / (name + ".bin")).string(), ids, kVocab, checksum);
}

struct Splits {
  TempDir dir;
  Splits(int32_t train = 20000, int32_t valid = 1234, int32_t test = 999) {
    write_split(dir.path, "train", train);
    write_split(dir.path, "valid", valid);
    write_split(dir.path, "test", test);
  }
};

cqk::DataConfig config_for(const fs::path& dir, int64_t seq_len = 16, int64_t batch = 8, int64_t prefetch = 2) {
  cqk::DataConfig config;
  config.kind = cqk::DataKind::Tokens;
  config.dir = dir.string();
  config.seq_len = seq_len;
  config.batch_size = batch;
  config.prefetch = prefetch;
  return config;
}

void expect_same(const cqk::Batch& a, const cqk::Batch& b) {
  EXPECT_TRUE(at::equal(a.inputs, b.inputs));
  EXPECT_TRUE(at::equal(a.targets, b.targets));
}

TEST(TokenLoader, TrainingBatchesAreContiguousShiftedWindows) {
  Splits splits;
  auto source = cqk::make_batch_source(config_for(splits.dir.path), 7);
  EXPECT_EQ(source->vocab_size(), kVocab);
  for (int n = 0; n < 5; ++n) {
    const auto batch = source->next_train();
    ASSERT_EQ(batch.inputs.sizes(), (at::IntArrayRef{8, 16}));
    ASSERT_EQ(batch.inputs.scalar_type(), at::kLong);
    // Tokens are their positions: a window is a run of consecutive values.
    const auto steps = batch.inputs.slice(1, 1) - batch.inputs.slice(1, 0, -1);
    EXPECT_TRUE(steps.eq(1).all().item<bool>());
    EXPECT_TRUE(at::equal(batch.targets, batch.inputs + 1));
    EXPECT_GE(batch.inputs.min().item<int64_t>(), 0);
    EXPECT_LT(batch.targets.max().item<int64_t>(), 20000);
  }
  EXPECT_EQ(source->train_position(), 5);
}

TEST(TokenLoader, SameSeedSameBatchesOtherSeedOthers) {
  Splits splits;
  auto a = cqk::make_batch_source(config_for(splits.dir.path), 3);
  auto b = cqk::make_batch_source(config_for(splits.dir.path, 16, 8, 0), 3);  // no prefetch: same batches
  auto c = cqk::make_batch_source(config_for(splits.dir.path), 4);
  bool differs = false;
  for (int n = 0; n < 6; ++n) {
    const auto x = a->next_train();
    expect_same(x, b->next_train());
    differs = differs || !at::equal(x.inputs, c->next_train().inputs);
  }
  EXPECT_TRUE(differs);
}

TEST(TokenLoader, SeekContinuesExactlyWhereDrawingWould) {
  Splits splits;
  for (int64_t prefetch : {0, 1, 3}) {
    auto reference = cqk::make_batch_source(config_for(splits.dir.path, 16, 8, prefetch), 11);
    std::vector<cqk::Batch> drawn;
    for (int n = 0; n < 10; ++n) drawn.push_back(reference->next_train());

    auto resumed = cqk::make_batch_source(config_for(splits.dir.path, 16, 8, prefetch), 11);
    resumed->seek_train(6);
    EXPECT_EQ(resumed->train_position(), 6);
    for (int n = 6; n < 10; ++n) expect_same(resumed->next_train(), drawn[n]);
    // Seeking back while the prefetcher is ahead.
    resumed->seek_train(2);
    expect_same(resumed->next_train(), drawn[2]);
    expect_same(resumed->next_train(), drawn[3]);
    resumed->seek_train(9);
    expect_same(resumed->next_train(), drawn[9]);
    EXPECT_EQ(resumed->train_position(), 10);
  }
}

// A step's sequences do not depend on its split into micro-batches: 8 x 1 draws
// what 4 x 2 and 2 x 4 draw (data.batch_size x train.grad_accum), so the arms of
// a pair may split a step differently and still see the same data.
TEST(TokenLoader, AStepsSequencesDoNotDependOnItsMicroBatchSplit) {
  Splits splits;
  auto whole = cqk::make_batch_source(config_for(splits.dir.path, 16, 8, 0), 5);
  for (int64_t micro : {4, 2}) {
    auto split = cqk::make_batch_source(config_for(splits.dir.path, 16, micro, 0), 5);
    for (int step = 0; step < 3; ++step) {
      std::vector<at::Tensor> inputs;
      for (int64_t m = 0; m < 8 / micro; ++m) inputs.push_back(split->next_train().inputs);
      EXPECT_TRUE(at::equal(at::cat(inputs), whole->next_train().inputs)) << "micro-batch " << micro << ", step " << step;
    }
    whole->seek_train(0);
  }
}

TEST(TokenLoader, RankSlicesAreDisjointAndMakeTheGlobalBatch) {
  Splits splits;
  auto whole = cqk::make_batch_source(config_for(splits.dir.path, 16, 8), 5);
  std::vector<std::unique_ptr<cqk::BatchSource>> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(cqk::make_batch_source(config_for(splits.dir.path, 16, 8), 5, r, 4));
  for (int n = 0; n < 4; ++n) {
    const auto global = whole->next_train();
    std::vector<at::Tensor> inputs, targets;
    for (auto& rank : ranks) {
      auto part = rank->next_train();
      ASSERT_EQ(part.inputs.size(0), 2);
      inputs.push_back(part.inputs);
      targets.push_back(part.targets);
    }
    EXPECT_TRUE(at::equal(at::cat(inputs), global.inputs));
    EXPECT_TRUE(at::equal(at::cat(targets), global.targets));
  }
  try {
    cqk::make_batch_source(config_for(splits.dir.path, 16, 6), 5, 0, 4);
    FAIL() << "batch 6 on 4 ranks should be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("data.batch_size (6) must be divisible by the world size (4)"), std::string::npos)
        << e.what();
  }
}

// Every target token 1..N-1 scored exactly once, for every stride and world size.
TEST(TokenLoader, EvalWindowsScoreEveryTokenExactlyOnce) {
  Splits splits(20000, 1234, 999);
  for (int64_t stride : {0, 16, 8, 5, 1}) {
    for (int world : {1, 3}) {
      std::map<int64_t, int> seen;
      int64_t batches = -1;
      for (int rank = 0; rank < world; ++rank) {
        auto config = config_for(splits.dir.path, 16, 6);
        config.eval_stride = stride;
        auto source = cqk::make_batch_source(config, 1, rank, world);
        const auto eval = source->eval_batches(cqk::Split::Valid, 0);
        if (batches >= 0) EXPECT_EQ(static_cast<int64_t>(eval.size()), batches) << "ranks see the same batch count";
        batches = static_cast<int64_t>(eval.size());
        for (const auto& batch : eval) {
          ASSERT_EQ(batch.inputs.size(1), 16);
          const auto in = batch.inputs.contiguous();
          const auto tg = batch.targets.contiguous();
          const auto* x = in.data_ptr<int64_t>();
          const auto* y = tg.data_ptr<int64_t>();
          for (int64_t i = 0; i < tg.numel(); ++i) {
            if (y[i] < 0) continue;
            EXPECT_EQ(y[i], x[i] + 1) << "targets are the next token";
            ++seen[y[i]];
          }
        }
      }
      ASSERT_EQ(seen.size(), 1233u) << "stride " << stride << " world " << world;
      EXPECT_EQ(seen.begin()->first, 1);
      EXPECT_EQ(seen.rbegin()->first, 1233);
      for (const auto& [token, count] : seen) ASSERT_EQ(count, 1) << "token " << token << " stride " << stride;
    }
  }
}

TEST(TokenLoader, StridedWindowsScoreTheLastStrideTargets) {
  const auto windows = cqk::eval_windows(100, 16, 4);
  ASSERT_GE(windows.size(), 3u);
  EXPECT_EQ(windows[0].start, 0);
  EXPECT_EQ(windows[0].first_scored, 0);
  for (std::size_t i = 1; i + 1 < windows.size(); ++i) {
    EXPECT_EQ(windows[i].start, static_cast<int64_t>(4 * i));
    EXPECT_EQ(windows[i].first_scored, 12) << "only the last 4 of 16 targets are new";
  }
  // The last window ends at the last token: start 99 - 16 = 83.
  EXPECT_EQ(windows.back().start, 83);
  // Non-overlapping: 0, 16, ..., 80, then 83 scoring only targets 97..99.
  const auto plain = cqk::eval_windows(100, 16, 16);
  EXPECT_EQ(plain.size(), 7u);
  EXPECT_EQ(plain.back().start, 83);
  EXPECT_EQ(plain.back().first_scored, 96 - 83);
  // A split shorter than one window: one window, padded.
  const auto tiny = cqk::eval_windows(5, 16, 16);
  ASSERT_EQ(tiny.size(), 1u);
  EXPECT_EQ(tiny[0].start, 0);
  EXPECT_THROW(cqk::eval_windows(100, 16, 17), std::invalid_argument);
}

TEST(TokenLoader, ShortSplitAndMaxBatches) {
  Splits splits(20000, 1234, 10);
  auto source = cqk::make_batch_source(config_for(splits.dir.path, 16, 4), 1);
  const auto test = source->eval_batches(cqk::Split::Test, 0);
  ASSERT_EQ(test.size(), 1u);
  ASSERT_EQ(test[0].inputs.size(0), 1);
  EXPECT_EQ(test[0].targets.ge(0).sum().item<int64_t>(), 9);
  EXPECT_EQ(test[0].targets[0][9].item<int64_t>(), -100);
  const auto valid = source->eval_batches(cqk::Split::Valid, 3);
  EXPECT_EQ(valid.size(), 3u);
  EXPECT_EQ(valid[0].inputs[0][0].item<int64_t>(), 0);
  EXPECT_EQ(valid[1].inputs[0][0].item<int64_t>(), 4 * 16);
}

TEST(TokenLoader, ConfigurationErrors) {
  Splits splits;
  auto config = config_for(splits.dir.path / "nowhere");
  EXPECT_THROW(cqk::make_batch_source(config, 1), std::runtime_error);
  config = config_for(splits.dir.path);
  config.eval_stride = 17;
  EXPECT_THROW(cqk::make_batch_source(config, 1), std::invalid_argument);
  // A split encoded with another tokenizer.
  write_split(splits.dir.path, "test", 999, 43);
  try {
    cqk::make_batch_source(config_for(splits.dir.path), 1);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("test.bin"), std::string::npos) << e.what();
  }
}

TEST(TokenLoader, EvaluationOnlyFolderHasNoTrainingSplit) {
  TempDir dir;
  write_split(dir.path, "valid", 100);
  write_split(dir.path, "test", 50);
  // valid's word count is current; test's belongs to another encoding (other token count).
  std::ofstream(dir.path / "meta.json")
      << R"({"splits": {"valid": {"tokens": 100, "words": 17}, "test": {"tokens": 49, "words": 5}}})";
  EXPECT_THROW(cqk::TokenBatchSource(config_for(dir.path), 1), std::runtime_error) << "training needs train.bin";

  cqk::TokenBatchSource source(config_for(dir.path), 1, 0, 1, cqk::TokenFolder::Evaluation);
  EXPECT_EQ(source.vocab_size(), kVocab);
  EXPECT_EQ(source.tokenizer_checksum(), 42u);
  int64_t scored = 0;
  for (const auto& batch : source.eval_batches(cqk::Split::Valid, 0)) scored += batch.targets.ge(0).sum().item<int64_t>();
  EXPECT_EQ(scored, 99);
  EXPECT_EQ(source.split_words(cqk::Split::Valid), 17);
  EXPECT_EQ(source.split_words(cqk::Split::Test), std::nullopt);
  EXPECT_TRUE(source.token_bytes().empty()) << "no tokenizer.model";
  EXPECT_THROW(source.next_train(), std::runtime_error);
  EXPECT_THROW(source.targets_in_training(), std::runtime_error);

  // A tokenizer.model that is not the one the files were encoded with is refused.
  std::ofstream(dir.path / "tokenizer.model") << "another tokenizer";
  try {
    cqk::TokenBatchSource other(config_for(dir.path), 1, 0, 1, cqk::TokenFolder::Evaluation);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("differs from the token files' tokenizer checksum 0x000000000000002a"),
              std::string::npos)
        << e.what();
  }
}

// The fingerprint covers the evaluation splits too: a valid.bin or test.bin
// encoded again under a run would change its final figures without a word.
TEST(TokenLoader, TheDataFingerprintCoversEverySplit) {
  Splits splits;
  const auto config = config_for(splits.dir.path);
  const std::string recorded = cqk::data_fingerprint(config);
  EXPECT_NE(recorded.find(", train.bin 20000 tokens, valid.bin 1234 tokens, test.bin 999 tokens"), std::string::npos)
      << recorded;
  EXPECT_NO_THROW(cqk::check_data_fingerprint(recorded, config));
  // A record of train.bin alone, as earlier builds wrote it, still agrees.
  EXPECT_NO_THROW(cqk::check_data_fingerprint(recorded.substr(0, recorded.find(", valid.bin")), config));
  write_split(splits.dir.path, "valid", 1300);
  try {
    cqk::check_data_fingerprint(recorded, config);
    FAIL() << "a changed valid.bin passed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("valid.bin 1300 tokens"), std::string::npos) << e.what();
  }
  // ... and one of another train.bin does not.
  std::string other_train = recorded.substr(0, recorded.find(", valid.bin"));
  other_train.replace(other_train.find("20000"), 5, "19999");
  EXPECT_THROW(cqk::check_data_fingerprint(other_train, config), std::runtime_error);
}

TEST(TokenLoader, SplitNames) {
  EXPECT_EQ(cqk::split_name(cqk::Split::Train), "train");
  EXPECT_EQ(cqk::split_name(cqk::Split::Valid), "valid");
  EXPECT_EQ(cqk::split_name(cqk::Split::Test), "test");
}

}  // namespace
