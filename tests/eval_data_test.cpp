// `cqk eval` on a run trained on text: the metrics of results.json and
// metrics.jsonl, and `cqk eval RUN --data DIR` on an out-of-domain file
// encoded as an evaluation-only folder. References come from the token files
// and the text themselves: byte and word counts from the text, the seen set
// from the run's train.bin.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cqk/token_file.h"
#include "generated_text.h"
#include "temp_dir.h"
#include "test_io.h"
#include "word_count.h"

namespace {

using cqk::testing::CommandResult;
using cqk::testing::grammar_text;
using cqk::testing::read_file;
using cqk::testing::reference_word_count;
using cqk::testing::run_command;
using cqk::testing::shell_quote;
using cqk::testing::TempDir;
using cqk::testing::write_file;
using nlohmann::json;

const std::vector<std::string> kTrainingWords{"red", "river", "garden", "engine", "watches", "old", "clock", "near"};

std::vector<int64_t> token_ids(const std::string& path) {
  const cqk::TokenFile file(path);
  std::vector<int64_t> ids(static_cast<std::size_t>(file.size()));
  file.read(0, file.size(), ids.data());
  return ids;
}

class EvalData : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(tmp_ / "corpus");
    write_file(tmp_ / "corpus/train.txt", grammar_text(kTrainingWords, 1, 1500));
    // An empty first line: the split's first token, never a target, is one newline byte.
    write_file(tmp_ / "corpus/valid.txt", "\n" + grammar_text(kTrainingWords, 2, 100));
    write_file(tmp_ / "corpus/test.txt", grammar_text(kTrainingWords, 3, 100));
    ASSERT_EQ(tool("data tokenizer --input " + tmp_ / "corpus/train.txt" + " --vocab-size 300 --out " +
                   tmp_ / "tok/tokenizer.model")
                  .exit_code,
              0);
    ASSERT_EQ(tool("data encode --input " + tmp_ / "corpus" + " --tokenizer " + tmp_ / "tok/tokenizer.model" +
                   " --out " + tokens_)
                  .exit_code,
              0);
    const auto trained = train();
    ASSERT_EQ(trained.exit_code, 0) << trained.out << trained.err;
  }

  // A run of 10 steps on tokens_ in run_.
  CommandResult train() const {
    return tool("train --set data.kind=tokens --set data.dir=" + tokens_ +
                " --set data.seq_len=32 --set data.batch_size=8 --set model.width=32"
                " --set model.layers=1 --set model.heads=2 --set train.steps=10 --set train.warmup_steps=2"
                " --set train.eval_every=5 --set train.eval_batches=1 --set train.log_every=5"
                " --set train.checkpoint_every=10 --set train.device=cpu --set run.dir=" +
                run_);
  }

  CommandResult tool(const std::string& args) const {
    return run_command(std::string(CQK_TOOL) + " " + args, tmp_ / "stderr.txt");
  }

  TempDir tmp_{"cqk-eval-data"};
  const std::string tokens_ = tmp_ / "tokens";
  const std::string run_ = tmp_ / "run";
};

TEST_F(EvalData, ResultsMetricsAndEvalReportTheSameMetrics) {
  const auto results = json::parse(read_file(run_ + "/results.json"));
  const auto& valid = results["valid"];
  // The whole split: bits per byte over its bytes, word perplexity over its words.
  const std::string text = read_file(tmp_ / "corpus/valid.txt");
  const auto ids = token_ids(tokens_ + "/valid.bin");
  const auto targets = static_cast<int64_t>(ids.size()) - 1;
  ASSERT_EQ(valid["tokens"].get<int64_t>(), targets);
  const double nll = valid["loss"].get<double>() * static_cast<double>(targets);
  EXPECT_EQ(valid["bytes"].get<int64_t>(), static_cast<int64_t>(text.size()) - 1);
  EXPECT_NEAR(valid["bpb"].get<double>(), nll / std::log(2.0) / valid["bytes"].get<double>(), 1e-9);
  EXPECT_EQ(valid["words"].get<int64_t>(), reference_word_count(text));
  EXPECT_NEAR(valid["word_ppl"].get<double>(), std::exp(nll / valid["words"].get<double>()), 1e-6);
  EXPECT_EQ(valid["seen"]["tokens"].get<int64_t>() + valid["unseen"]["tokens"].get<int64_t>(), targets);

  // metrics.jsonl's evaluation at step 5 covers one batch: no word perplexity.
  // Its last line, the final evaluations, covers the whole splits as results.json does.
  std::istringstream lines(read_file(run_ + "/metrics.jsonl"));
  int evaluations = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto row = json::parse(line);
    if (row.contains("test_loss")) {
      EXPECT_DOUBLE_EQ(row["valid_word_ppl"].get<double>(), valid["word_ppl"].get<double>()) << line;
      EXPECT_EQ(row["valid_tokens"].get<int64_t>(), targets) << line;
      continue;
    }
    if (!row.contains("valid_loss")) continue;
    ++evaluations;
    for (const char* key : {"valid_ppl", "valid_bpb", "valid_bytes", "valid_seen_loss", "valid_seen_tokens",
                            "valid_unseen_tokens", "valid_tokens"})
      EXPECT_TRUE(row.contains(key)) << key << " in " << line;
    EXPECT_FALSE(row.contains("valid_word_ppl")) << line;
    EXPECT_EQ(row["valid_tokens"].get<int64_t>(), 8 * 32) << line;
  }
  EXPECT_EQ(evaluations, 1);

  // `cqk eval` over the whole split repeats the final evaluation.
  const auto eval = tool("eval " + run_ + " --json");
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const auto line = json::parse(eval.out);
  for (const char* key : {"loss", "ppl", "bpb", "word_ppl"})
    EXPECT_NEAR(line[key].get<double>(), valid[key].get<double>(), 1e-6 * valid[key].get<double>()) << key;
  EXPECT_EQ(line["seen"]["tokens"], valid["seen"]["tokens"]);
  EXPECT_NEAR(line["seen"]["loss"].get<double>(), valid["seen"]["loss"].get<double>(), 1e-6);
  EXPECT_EQ(line["words"], valid["words"]);
  EXPECT_EQ(line["data"], tokens_);
  const auto partial = json::parse(tool("eval " + run_ + " --batches 1 --json").out);
  EXPECT_FALSE(partial.contains("word_ppl")) << partial.dump();
  EXPECT_TRUE(partial.contains("bpb")) << partial.dump();
}

TEST_F(EvalData, OtherTextIsEvaluatedAgainstTheRunsTrainingTargets) {
  // Letters and accents the training text never had (byte pieces, never a
  // training target) and an empty first line (the first token: one newline byte).
  const std::string ood = "\n" + grammar_text({"quartz", "zebra", "jumps", "über", "café", "fjord", "river"}, 4, 40);
  write_file(tmp_ / "ood.txt", ood);
  const auto encoded =
      tool("data encode --input " + tmp_ / "ood.txt" + " --tokenizer " + tokens_ + "/tokenizer.model --out " + tmp_ / "ood");
  ASSERT_EQ(encoded.exit_code, 0) << encoded.err;

  const auto r = tool("eval " + run_ + " --data " + tmp_ / "ood" + " --split valid --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto e = json::parse(r.out);
  const auto ids = token_ids(tmp_ / "ood/valid.bin");
  const auto targets = static_cast<int64_t>(ids.size()) - 1;
  EXPECT_EQ(e["data"], tmp_ / "ood");
  ASSERT_EQ(e["tokens"].get<int64_t>(), targets);
  const double nll = e["loss"].get<double>() * static_cast<double>(targets);
  EXPECT_EQ(e["bytes"].get<int64_t>(), static_cast<int64_t>(ood.size()) - 1);
  EXPECT_NEAR(e["bpb"].get<double>(), nll / std::log(2.0) / static_cast<double>(ood.size() - 1), 1e-9);
  EXPECT_EQ(e["words"].get<int64_t>(), reference_word_count(ood));

  // Seen: the ids that are targets somewhere in the run's train.bin (not the ood folder's: it has none).
  const auto train = token_ids(tokens_ + "/train.bin");
  const std::set<int64_t> seen(train.begin() + 1, train.end());
  int64_t unseen = 0;
  for (std::size_t i = 1; i < ids.size(); ++i) unseen += seen.count(ids[i]) == 0;
  ASSERT_GT(unseen, 0);
  EXPECT_EQ(e["unseen"]["tokens"].get<int64_t>(), unseen);
  EXPECT_EQ(e["seen"]["tokens"].get<int64_t>(), targets - unseen);
  EXPECT_NEAR(e["seen"]["loss"].get<double>() * static_cast<double>(targets - unseen) +
                  e["unseen"]["loss"].get<double>() * static_cast<double>(unseen),
              nll, 1e-6 * nll);

  const auto text = tool("eval " + run_ + " --data " + tmp_ / "ood" + " --split test");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out.rfind("test of " + tmp_ / "ood" + ": ppl ", 0), 0u) << text.out;
  EXPECT_NE(text.out.find(" | bpb "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(" | unseen loss "), std::string::npos) << text.out;
}

// --save keeps what --json prints in RUN/evals/NAME.json, and `cqk stats`
// reads it as the run's NAME_* metrics.
TEST_F(EvalData, SavedEvaluationsAreMetricsOfTheRun) {
  write_file(tmp_ / "ood.txt", grammar_text({"quartz", "zebra", "river", "clock"}, 6, 40));
  ASSERT_EQ(tool("data encode --input " + tmp_ / "ood.txt" + " --tokenizer " + tokens_ + "/tokenizer.model --out " +
                 tmp_ / "ood")
                .exit_code,
            0);
  const auto r = tool("eval " + run_ + " --data " + tmp_ / "ood" + " --split valid --save ood-1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto printed = json::parse(r.out);
  const auto saved = json::parse(read_file(run_ + "/evals/ood-1.json"));
  EXPECT_EQ(saved, printed);
  EXPECT_EQ(saved["step"], json::parse(read_file(run_ + "/results.json"))["steps"]);

  const auto stats = tool("stats " + run_ + " --metric ood-1_bpb");
  ASSERT_EQ(stats.exit_code, 0) << stats.out << stats.err;
  char bpb[32];
  std::snprintf(bpb, sizeof bpb, " %.3f |", printed["bpb"].get<double>());
  EXPECT_NE(stats.out.find("ood-1_bpb mean ± sd |"), std::string::npos) << stats.out;
  EXPECT_NE(stats.out.find(bpb), std::string::npos) << stats.out;

  // Names that are not a saved evaluation's are refused before anything is evaluated.
  for (const std::string name : {"test", "Ood", "a_b", "../x"}) {
    const auto bad = tool("eval " + run_ + " --data " + tmp_ / "ood" + " --save " + shell_quote(name));
    EXPECT_EQ(bad.exit_code, 2) << name;
    EXPECT_EQ(bad.out, "") << name;
    EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
    EXPECT_NE(bad.err.find("evaluation name '" + name + "'"), std::string::npos) << bad.err;
  }
  EXPECT_FALSE(std::filesystem::exists(run_ + "/evals/test.json"));
  const auto part = tool("eval " + run_ + " --data " + tmp_ / "ood" + " --batches 1 --save ood-2");
  EXPECT_EQ(part.exit_code, 2);
  EXPECT_NE(part.err.find("--save needs the whole split"), std::string::npos) << part.err;
  EXPECT_FALSE(std::filesystem::exists(run_ + "/evals/ood-2.json"));

  // A new run in the folder (the old one's checkpoints and results gone: a finished run is refused) takes the old
  // model's evaluations away.
  ASSERT_EQ(run_command("rm -r " + shell_quote(run_ + "/checkpoints") + " " + shell_quote(run_ + "/results.json")).exit_code,
            0);
  const auto again = train();
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_FALSE(std::filesystem::exists(run_ + "/evals")) << again.err;
}

TEST_F(EvalData, AFolderOfAnotherTokenizerIsRefused) {
  ASSERT_EQ(tool("data tokenizer --input " + tmp_ / "corpus/train.txt" + " --vocab-size 310 --out " +
                 tmp_ / "other/tokenizer.model")
                .exit_code,
            0);
  write_file(tmp_ / "ood.txt", grammar_text(kTrainingWords, 5, 20));
  ASSERT_EQ(tool("data encode --input " + tmp_ / "ood.txt" + " --tokenizer " + tmp_ / "other/tokenizer.model" +
                 " --out " + tmp_ / "other-ood")
                .exit_code,
            0);
  for (const std::string& folder : {tmp_ / "other-ood", tmp_ / "missing"}) {
    const auto r = tool("eval " + run_ + " --data " + folder + " --split valid --json");
    EXPECT_EQ(r.exit_code, 2) << folder;
    EXPECT_EQ(r.out, "") << "nothing but the error";
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("cqk: error: ", 0), 0u) << r.err;
  }
  const auto r = tool("eval " + run_ + " --data " + tmp_ / "other-ood");
  EXPECT_NE(r.err.find("encoded with another tokenizer"), std::string::npos) << r.err;
}

// The run's own token files gone (another folder, or moved): one line that says
// where eval looked for them, also with --data (their training split decides
// which targets count as seen).
TEST_F(EvalData, MissingRunDataSaysWhereEvalLooked) {
  std::filesystem::rename(tokens_, tmp_ / "moved");
  for (const std::string& args : {std::string(), " --data " + tmp_ / "moved"}) {
    const auto r = tool("eval " + run_ + args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(tokens_ + "/train.bin does not exist"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("eval reads the run's data.dir (" + run_ + "/config.yaml)"), std::string::npos) << r.err;
  }
}

}  // namespace
