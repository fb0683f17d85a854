#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "cqk/batch_source.h"
#include "cqk/recall_task.h"

namespace {

cqk::DataConfig recall_config(int64_t seq_len = 64, int64_t pairs = 8, int64_t batch = 16) {
  cqk::DataConfig config;
  config.kind = cqk::DataKind::Recall;
  config.seq_len = seq_len;
  config.batch_size = batch;
  config.recall.vocab_size = 128;
  config.recall.pairs = pairs;
  config.recall.train_examples = 500;
  config.recall.eval_examples = 100;
  return config;
}

// Checks every rule of one sequence; returns the query positions.
std::vector<int64_t> check_sequence(const int64_t* x, const int64_t* y, int64_t T, int64_t P, int64_t V) {
  std::map<int64_t, int64_t> value_of;
  std::set<int64_t> values;
  for (int64_t i = 0; i < P; ++i) {
    const int64_t key = x[2 * i], value = x[2 * i + 1];
    EXPECT_GE(key, 1);
    EXPECT_LT(key, V / 2) << "keys from the lower half, 0 excluded";
    EXPECT_GE(value, V / 2);
    EXPECT_LT(value, V) << "values from the upper half";
    EXPECT_TRUE(value_of.emplace(key, value).second) << "keys are distinct";
    EXPECT_TRUE(values.insert(value).second) << "values are distinct";
    EXPECT_EQ(y[2 * i], -100);
    EXPECT_EQ(y[2 * i + 1], -100);
  }
  std::vector<int64_t> queries;
  std::set<int64_t> asked;
  for (int64_t t = 2 * P; t < T; ++t) {
    if (y[t] >= 0) {
      queries.push_back(t);
      EXPECT_TRUE(value_of.count(x[t])) << "a query is a key of the sequence";
      EXPECT_EQ(y[t], value_of[x[t]]) << "the target is the value paired with the key";
      EXPECT_TRUE(asked.insert(x[t]).second) << "each key is asked once";
    } else {
      EXPECT_EQ(x[t], cqk::kRecallFiller) << "non-query positions hold the filler";
    }
  }
  EXPECT_EQ(static_cast<int64_t>(queries.size()), P);
  return queries;
}

TEST(Recall, SequencesFollowTheTaskRules) {
  const auto config = recall_config();
  auto source = cqk::make_batch_source(config, 1);
  EXPECT_EQ(source->vocab_size(), 128);
  for (int n = 0; n < 3; ++n) {
    const auto batch = source->next_train();
    ASSERT_EQ(batch.inputs.sizes(), (at::IntArrayRef{16, 64}));
    ASSERT_EQ(batch.targets.scalar_type(), at::kLong);
    const auto x = batch.inputs.contiguous(), y = batch.targets.contiguous();
    for (int64_t b = 0; b < 16; ++b)
      check_sequence(x.data_ptr<int64_t>() + b * 64, y.data_ptr<int64_t>() + b * 64, 64, 8, 128);
  }
  for (auto split : {cqk::Split::Valid, cqk::Split::Test}) {
    const auto eval = source->eval_batches(split, 0);
    ASSERT_EQ(eval.size(), 7u);  // 100 examples in batches of 16
    EXPECT_EQ(eval.back().inputs.size(0), 4);
    for (const auto& batch : eval) {
      const auto x = batch.inputs.contiguous(), y = batch.targets.contiguous();
      for (int64_t b = 0; b < x.size(0); ++b)
        check_sequence(x.data_ptr<int64_t>() + b * 64, y.data_ptr<int64_t>() + b * 64, 64, 8, 128);
    }
  }
}

TEST(Recall, TightestFitAndTooShortSequences) {
  auto config = recall_config(24, 8, 4);  // exactly 3 * pairs
  auto source = cqk::make_batch_source(config, 2);
  const auto batch = source->next_train();
  const auto x = batch.inputs.contiguous(), y = batch.targets.contiguous();
  for (int64_t b = 0; b < 4; ++b) {
    const auto queries = check_sequence(x.data_ptr<int64_t>() + b * 24, y.data_ptr<int64_t>() + b * 24, 24, 8, 128);
    EXPECT_EQ(queries.front(), 16);
    EXPECT_EQ(queries.back(), 23);
  }
  config.seq_len = 23;
  try {
    cqk::make_batch_source(config, 2);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("data.seq_len (23)"), std::string::npos) << e.what();
  }
  config = recall_config();
  config.recall.pairs = 64;  // only 63 keys in [1, 64)
  config.seq_len = 256;
  EXPECT_THROW(cqk::make_batch_source(config, 2), std::invalid_argument);
}

TEST(Recall, DeterministicSeekableAndSeeded) {
  const auto config = recall_config();
  auto a = cqk::make_batch_source(config, 9);
  auto b = cqk::make_batch_source(config, 9);
  auto c = cqk::make_batch_source(config, 10);
  std::vector<cqk::Batch> drawn;
  for (int n = 0; n < 6; ++n) {
    drawn.push_back(a->next_train());
    const auto other = b->next_train();
    EXPECT_TRUE(at::equal(drawn.back().inputs, other.inputs));
    EXPECT_TRUE(at::equal(drawn.back().targets, other.targets));
  }
  EXPECT_FALSE(at::equal(drawn[0].inputs, c->next_train().inputs));
  b->seek_train(3);
  EXPECT_TRUE(at::equal(b->next_train().inputs, drawn[3].inputs));
  EXPECT_EQ(b->train_position(), 4);
  // The evaluation sets are fixed by the seed and differ from each other.
  const auto valid = a->eval_batches(cqk::Split::Valid, 1)[0];
  EXPECT_TRUE(at::equal(valid.inputs, b->eval_batches(cqk::Split::Valid, 1)[0].inputs));
  EXPECT_FALSE(at::equal(valid.inputs, a->eval_batches(cqk::Split::Test, 1)[0].inputs));
  EXPECT_FALSE(at::equal(valid.inputs, c->eval_batches(cqk::Split::Valid, 1)[0].inputs));
}

TEST(Recall, TrainingDrawsFromAFixedPool) {
  auto config = recall_config();
  config.recall.train_examples = 5;
  auto source = cqk::make_batch_source(config, 4);
  std::set<std::vector<int64_t>> distinct;
  for (int n = 0; n < 10; ++n) {
    const auto x = source->next_train().inputs.contiguous();
    for (int64_t b = 0; b < x.size(0); ++b)
      distinct.insert(std::vector<int64_t>(x.data_ptr<int64_t>() + b * 64, x.data_ptr<int64_t>() + (b + 1) * 64));
  }
  EXPECT_EQ(distinct.size(), 5u);
}

// As for token files: 16 x 1 draws what 8 x 2 draws.
TEST(Recall, AStepsExamplesDoNotDependOnItsMicroBatchSplit) {
  auto whole = cqk::make_batch_source(recall_config(64, 8, 16), 3);
  auto split = cqk::make_batch_source(recall_config(64, 8, 8), 3);
  for (int step = 0; step < 3; ++step) {
    const auto first = split->next_train().inputs, second = split->next_train().inputs;
    EXPECT_TRUE(at::equal(at::cat({first, second}), whole->next_train().inputs)) << "step " << step;
  }
}

TEST(Recall, RankSlicesMakeTheGlobalBatch) {
  const auto config = recall_config(64, 8, 16);
  auto whole = cqk::make_batch_source(config, 3);
  std::vector<std::unique_ptr<cqk::BatchSource>> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(cqk::make_batch_source(config, 3, r, 4));
  for (int n = 0; n < 3; ++n) {
    const auto global = whole->next_train();
    std::vector<at::Tensor> parts;
    for (auto& rank : ranks) parts.push_back(rank->next_train().inputs);
    EXPECT_TRUE(at::equal(at::cat(parts), global.inputs));
  }
  // Evaluation: the ranks together cover each example once; padding scores nothing.
  int64_t scored = 0;
  for (auto& rank : ranks)
    for (const auto& batch : rank->eval_batches(cqk::Split::Valid, 0)) scored += batch.targets.ge(0).sum().item<int64_t>();
  EXPECT_EQ(scored, 100 * 8);
  EXPECT_THROW(cqk::make_batch_source(recall_config(64, 8, 10), 3, 0, 4), std::invalid_argument);
}

TEST(Recall, PowerLawPlacesQueriesNearTheContext) {
  auto mean_distance = [](double alpha) {
    auto config = recall_config(256, 8, 64);
    config.recall.power_law = alpha;
    auto source = cqk::make_batch_source(config, 1);
    const auto y = source->next_train().targets;
    const auto positions = at::arange(256, at::kLong).expand_as(y);
    return positions.masked_select(y.ge(0)).to(at::kDouble).mean().item<double>() - 16.0;
  };
  const double near = mean_distance(0.1), uniform = mean_distance(1.0);
  EXPECT_LT(near, 0.6 * uniform) << near << " vs " << uniform;
  EXPECT_GT(uniform, 90.0);  // uniform over 240 slots: about 120
}

TEST(Recall, ScoredAccuracyCountsOnlyScoredPositions) {
  const auto config = recall_config(64, 8, 4);
  auto source = cqk::make_batch_source(config, 1);
  const auto batch = source->next_train();
  const auto scored_targets = batch.targets.clamp_min(0);
  auto logits = at::one_hot(scored_targets, 128).to(at::kFloat);
  auto all = cqk::scored_accuracy(logits, batch.targets);
  EXPECT_EQ(all.total, 4 * 8);
  EXPECT_EQ(all.correct, 4 * 8);
  EXPECT_DOUBLE_EQ(all.accuracy(), 1.0);
  // Break the prediction of one scored position and of every unscored one.
  const auto positions = batch.targets[0].ge(0).nonzero().flatten();
  const int64_t broken = positions[0].item<int64_t>();
  logits[0][broken].zero_();
  logits[0][broken][(batch.targets[0][broken].item<int64_t>() + 1) % 128] = 1;
  logits.index_put_({batch.targets.lt(0)}, at::zeros({128}));
  auto some = cqk::scored_accuracy(logits, batch.targets);
  EXPECT_EQ(some.correct, 31);
  EXPECT_EQ(some.total, 32);
  some += all;
  EXPECT_EQ(some.total, 64);
  EXPECT_THROW(cqk::scored_accuracy(logits[0], batch.targets), std::invalid_argument);
}

}  // namespace
