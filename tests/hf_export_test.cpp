// `cqk export` end to end: tiny runs of every attention kind (affine coupling)
// and every other coupling kind (vanilla attention) on text, exported and loaded
// by transformers (tests/hf_export_check.py): the Python model's logits match
// cqk's within 1e-5 of their scale, the loss with labels is their float64
// negative log-likelihood, greedy generation gives cqk's tokens, and
// the tokenizer encodes and decodes as cqk does. Bad run folders write nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "cqk/attention_options.h"
#include "cqk/coupling_options.h"
#include "generated_text.h"
#include "temp_dir.h"
#include "test_io.h"

namespace {

using cqk::testing::CommandResult;
using cqk::testing::folder_entries;
using cqk::testing::read_file;
using cqk::testing::run_command;
using cqk::testing::shell_quote;
using cqk::testing::TempDir;
using cqk::testing::write_file;
using json = nlohmann::json;

const std::string kTool = CQK_TOOL;
// Non-ASCII characters, a blank line and leading spaces: what a tokenizer round trip must keep.
const std::string kTextPrompt = "  the caf\xc3\xa9 \xe2\x80\x94 \xe6\x9d\xb1\xe4\xba\xac\n\n   the dog";

// Why the Python checks cannot run here, or "" when they can.
std::string python_missing(const std::string& modules) {
  const std::string python = CQK_PYTHON;
  if (python.empty() || ::access(python.c_str(), X_OK) != 0) return "no Python (CQK_PYTHON='" + python + "')";
  if (run_command(shell_quote(python) + " -c 'import " + modules + "'").exit_code != 0)
    return python + " lacks " + modules + " (scripts/setup.sh installs them)";
  return "";
}

// The Python model's kind lists are cqk's kind tables, in the same order.
TEST(HfExportModel, PythonKindListsAreTheCppKindTables) {
  if (const auto why = python_missing("torch"); !why.empty()) GTEST_SKIP() << why;
  const std::string script = "import sys; sys.path.insert(0, sys.argv[1]); import cqk_model; "
                             "print('|'.join(cqk_model.ATTENTION_KINDS)); print('|'.join(cqk_model.COUPLING_KINDS))";
  const auto result = run_command(shell_quote(CQK_PYTHON) + " -c " + shell_quote(script) + " " +
                                  shell_quote(std::string(CQK_SOURCE_DIR) + "/python/cqk_hf"));
  ASSERT_EQ(result.exit_code, 0) << result.out;
  const auto joined = [](const std::vector<std::string>& names) {
    std::string text;
    for (const auto& name : names) text += (text.empty() ? "" : "|") + name;
    return text;
  };
  EXPECT_EQ(result.out, joined(cqk::attention_kind_names()) + "\n" + joined(cqk::coupling_kind_names()) + "\n");
}

CommandResult tool(const std::string& args, const std::string& stderr_path) {
  return run_command(kTool + " " + args, stderr_path);
}

// A text corpus -> tokenizer -> token folder, and tiny runs trained on it.
class HfExport : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::vector<std::string> words = {"cat", "dog", "sat", "ran", "on", "mat", "red", "big", "hat", "sun"};
    const std::string corpus = dir_ / "corpus";
    ASSERT_EQ(run_command("mkdir -p " + corpus).exit_code, 0);
    write_file(corpus + "/train.txt", cqk::testing::grammar_text(words, 1, 400));
    write_file(corpus + "/valid.txt", cqk::testing::grammar_text(words, 2, 20));
    write_file(corpus + "/test.txt", cqk::testing::grammar_text(words, 3, 20));
    ASSERT_EQ(run_command(kTool + " data tokenizer --input " + corpus + "/train.txt --vocab-size 300 --out " +
                          (dir_ / "tokenizer.model")).exit_code, 0);
    const auto encode = run_command(kTool + " data encode --input " + corpus + " --tokenizer " +
                                    (dir_ / "tokenizer.model") + " --out " + (dir_ / "tokens"));
    ASSERT_EQ(encode.exit_code, 0) << encode.out;
  }

  // Trains `name` for a few steps on the token folder; returns the run folder.
  std::string train(const std::string& name, const std::string& settings) {
    const std::string run = dir_ / name;
    const auto r = run_command(
        kTool + " --threads 1 train --set data.kind=tokens --set data.dir=" + (dir_ / "tokens") +
        " --set data.seq_len=48 --set data.batch_size=4 --set model.width=32 --set model.layers=2 --set model.heads=4"
        " --set train.steps=30 --set train.lr=1e-2 --set train.warmup_steps=1 --set train.eval_every=100"
        " --set train.eval_batches=1 --set train.checkpoint_every=30 --set train.device=cpu --set run.dir=" + run +
        " " + settings);
    if (r.exit_code != 0) ADD_FAILURE() << "cqk train " << settings << ": " << r.out;
    return run;
  }

  TempDir dir_{"cqk-hf-export"};
};

struct Case {
  std::string name, settings;
};

TEST_F(HfExport, TransformersModelMatchesCqk) {
  const std::string missing = python_missing("transformers, safetensors, sentencepiece");
  if (!missing.empty()) GTEST_SKIP() << missing;
  const std::vector<Case> cases = {
      {"vanilla-none", "--set model.attention.coupling.kind=none"},
      {"vanilla-affine", ""},
      {"diff-affine", "--set model.attention.kind=diff"},
      {"qknorm-affine", "--set model.attention.kind=qknorm"},
      // every=1: MTA on both layers; a small kernel so it reaches past the diagonal.
      {"mta-affine", "--set model.attention.kind=mta --set model.attention.mta.every=1"
                     " --set model.attention.mta.query_kernel=3 --set model.attention.mta.key_kernel=3"},
      {"vanilla-noninvertible", "--set model.attention.coupling.kind=noninvertible"},
      {"vanilla-uncoupled", "--set model.attention.coupling.kind=uncoupled --set model.kv_heads=2 --set model.mlp=gelu"},
      {"vanilla-dynamics", "--set model.attention.coupling.kind=dynamics --set model.attention.coupling.dt_init=0.1"},
      {"diff-dynamics-euler", "--set model.attention.kind=diff --set model.attention.coupling.kind=dynamics"
                              " --set model.attention.coupling.integrator=euler"
                              " --set model.attention.coupling.separate_pairs=true"},
  };
  const std::string greedy_prompt = "5 17 42 9 100 3 77 8";
  // 8 + 45 tokens run past data.seq_len (48): both sides must crop the context alike.
  const int greedy_tokens = 45;
  json checks = json::array();
  for (const auto& c : cases) {
    const std::string run = train(c.name, c.settings), out = dir_ / (c.name + "-hf");
    const auto exported = tool("export " + run + " --out " + out, dir_ / "stderr.txt");
    ASSERT_EQ(exported.exit_code, 0) << c.name << ": " << exported.out << exported.err;
    const std::string logits = dir_ / (c.name + "-logits.safetensors");
    const auto greedy = tool("generate " + run + " --ids --prompt " + shell_quote(greedy_prompt) + " --tokens " +
                                 std::to_string(greedy_tokens) + " --temperature 0 --logits-out " + logits,
                             dir_ / "stderr.txt");
    ASSERT_EQ(greedy.exit_code, 0) << c.name << ": " << greedy.err;
    std::vector<int64_t> ids;
    std::istringstream in(greedy.out);
    for (int64_t id; in >> id;) ids.push_back(id);
    ASSERT_EQ(ids.size(), static_cast<size_t>(greedy_tokens)) << greedy.out;
    checks.push_back({{"dir", out}, {"logits", logits}, {"greedy", ids}});
  }
  // The text run: cqk encodes the prompt and prints the decoded continuation.
  const std::string text_logits = dir_ / "text-logits.safetensors";
  const auto text = tool("generate " + (dir_ / "vanilla-affine") + " --prompt " + shell_quote(kTextPrompt) +
                             " --tokens 12 --temperature 0 --logits-out " + text_logits,
                         dir_ / "stderr.txt");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  ASSERT_FALSE(text.out.empty());
  const auto text_greedy = tool("generate " + (dir_ / "vanilla-affine") + " --prompt " + shell_quote(kTextPrompt) +
                                    " --tokens 3 --temperature 0 --ids",
                                dir_ / "stderr.txt");
  EXPECT_NE(text_greedy.exit_code, 0) << "--ids takes ids, not text";
  checks.push_back({{"dir", dir_ / "vanilla-affine-hf"},
                    {"logits", text_logits},
                    {"greedy", json::array()},
                    {"text", {{"prompt", kTextPrompt}, {"continuation", text.out.substr(0, text.out.size() - 1)},
                              {"tokens", 12}}}});
  write_file(dir_ / "cases.json", checks.dump());

  const auto check = run_command(shell_quote(CQK_PYTHON) + " " + CQK_SOURCE_DIR + "/tests/hf_export_check.py " +
                                 (dir_ / "cases.json") + " 2>" + (dir_ / "python-stderr.txt"));
  ASSERT_EQ(check.exit_code, 0) << check.out << read_file(dir_ / "python-stderr.txt");
  std::istringstream lines(check.out);
  size_t seen = 0;
  for (std::string line; std::getline(lines, line); ++seen) {
    const auto r = json::parse(line);
    EXPECT_LE(r["max_rel"].get<double>(), 1e-5) << line;
    EXPECT_LE(r["loss_rel"].get<double>(), 1e-5) << line;
    if (r.contains("greedy")) EXPECT_EQ(r["greedy"], r["greedy_cqk"]) << line;
    if (r.contains("encoded_same")) {
      EXPECT_TRUE(r["encoded_same"].get<bool>()) << line;
      EXPECT_TRUE(r["round_trip_same"].get<bool>()) << line;
      EXPECT_TRUE(r["continuation_same"].get<bool>()) << line << "\ncqk: " << text.out;
    }
    std::cout << line << "\n";
  }
  EXPECT_EQ(seen, checks.size()) << check.out;
}

// lm-eval's hf model on an export folder and a local multiple-choice task (no
// download): its accuracy is the one the exported model's own log-likelihoods give.
TEST_F(HfExport, LmEvalScoresALocalTask) {
  const std::string missing = python_missing("lm_eval, accelerate, transformers");
  if (!missing.empty())
    GTEST_SKIP() << missing << "; lm-eval is optional (+620 MB): CQK_WITH_LM_EVAL=1 scripts/setup.sh";
  const std::string run = train("run", ""), out = dir_ / "hf";
  ASSERT_EQ(tool("export " + run + " --out " + out, dir_ / "stderr.txt").exit_code, 0);
  // Docs from the training grammar: "the <w> <w>" and two continuations, the first one right.
  const std::vector<std::string> words = {"cat", "dog", "sat", "ran", "on", "mat", "red", "big", "hat", "sun"};
  std::string docs;
  for (size_t i = 0; i < 12; ++i) {
    const std::string context = "the " + words[i % words.size()] + " " + words[(3 * i + 1) % words.size()];
    docs += json{{"context", context}, {"choices", {" " + words[(7 * i + 2) % words.size()], " the the"}},
                 {"answer", 0}}.dump() + "\n";
  }
  write_file(dir_ / "docs.jsonl", docs);
  ASSERT_EQ(run_command("mkdir -p " + (dir_ / "tasks")).exit_code, 0);
  write_file(dir_ / "tasks/cqk_local.yaml",
             "task: cqk_local\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: " + (dir_ / "docs.jsonl") +
                 "\ntest_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{context}}\"\n"
                 "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{answer}}\"\ntarget_delimiter: \"\"\n"
                 "metric_list:\n  - metric: acc\n");
  const std::string python = shell_quote(CQK_PYTHON);
  const auto lm_eval = run_command("HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 " + python +
                                   " -m lm_eval --model hf --model_args pretrained=" + out +
                                   ",trust_remote_code=True,dtype=float32 --tasks cqk_local --include_path " +
                                   (dir_ / "tasks") + " --device cpu --batch_size 1 --output_path " +
                                   (dir_ / "lm-eval"));
  ASSERT_EQ(lm_eval.exit_code, 0) << lm_eval.out;
  const auto results_file = run_command("find " + (dir_ / "lm-eval") + " -name 'results_*.json'");
  ASSERT_FALSE(results_file.out.empty()) << lm_eval.out;
  const auto results = json::parse(read_file(results_file.out.substr(0, results_file.out.find('\n'))));
  const double acc = results["results"]["cqk_local"]["acc,none"].get<double>();
  const auto own = run_command(python + " " + CQK_SOURCE_DIR + "/tests/hf_export_check.py --choice-accuracy " + out +
                               " " + (dir_ / "docs.jsonl") + " 2>/dev/null");
  ASSERT_EQ(own.exit_code, 0) << own.out;
  const auto expected = json::parse(own.out);
  EXPECT_EQ(expected["docs"].get<int>(), 12);
  EXPECT_DOUBLE_EQ(acc, expected["acc"].get<double>()) << lm_eval.out;
}

// A bad run folder: one error line, a non-zero exit, and no output folder.
// README.md's transformers block as printed, on a text run exported where it
// looks (exports/150m-diff): it prints what `cqk generate --temperature 0` prints.
TEST_F(HfExport, ReadmeBlockRunsAsPrinted) {
  const std::string missing = python_missing("transformers, safetensors, sentencepiece");
  if (!missing.empty()) GTEST_SKIP() << missing;
  const std::string code = cqk::testing::readme_block("### Hugging Face: transformers and lm-eval", "python");
  ASSERT_NE(code.find("exports/150m-diff"), std::string::npos) << code;
  ASSERT_NE(code.find("max_new_tokens=40"), std::string::npos) << code;
  const std::string run = train("text-run", "");
  ASSERT_EQ(run_command("mkdir -p " + (dir_ / "exports")).exit_code, 0);
  const auto exported = tool("export " + run + " --out " + (dir_ / "exports/150m-diff"), dir_ / "stderr.txt");
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  write_file(dir_ / "readme.py", code);
  const auto python = run_command("cd " + shell_quote(dir_.path()) + " && " + shell_quote(CQK_PYTHON) + " readme.py",
                                  dir_ / "python-stderr.txt");
  ASSERT_EQ(python.exit_code, 0) << code << python.err;
  const auto cqk = tool("generate " + run + " --prompt 'The president said' --tokens 40 --temperature 0",
                        dir_ / "stderr.txt");
  ASSERT_EQ(cqk.exit_code, 0) << cqk.err;
  const auto trimmed = [](std::string text) {
    while (!text.empty() && text.back() == '\n') text.pop_back();
    return text;
  };
  EXPECT_FALSE(trimmed(cqk.out).empty());
  EXPECT_EQ(trimmed(python.out), trimmed(cqk.out));
}

// A model with more rows than the tokenizer has pieces (model.vocab_size set
// larger) samples only ids the tokenizer can decode. Barely trained, it would
// otherwise pick an id past the tokenizer's 300 for most tokens.
TEST_F(HfExport, GenerateSamplesOnlyIdsTheTokenizerDecodes) {
  const std::string run = train("wide-vocab", "--set model.vocab_size=1024 --set train.steps=2 --set train.checkpoint_every=2");
  for (const char* seed : {"1", "2", "3"}) {
    const auto r = tool("generate " + run + " --prompt 'the cat' --tokens 40 --temperature 1 --seed " + seed,
                        dir_ / "stderr.txt");
    EXPECT_EQ(r.exit_code, 0) << "seed " << seed << ": " << r.err;
  }
}

// The run records what it trained on; a token folder encoded again with
// another tokenizer under the same path (or a relative data.dir read from
// another folder) is refused by every command that reads it, instead of
// evaluating, sampling or exporting against the wrong token files.
TEST_F(HfExport, CommandsRefuseARunWhoseTokenFolderHoldsOtherData) {
  // Paused after 2 of 4 steps, so that `train --resume` has a step to take.
  const std::string run = train("run", "--set train.steps=4 --set train.checkpoint_every=2 --max-steps 2");
  // The same vocabulary size, learnt from other text: another tokenizer.
  ASSERT_EQ(run_command(kTool + " data tokenizer --input " + (dir_ / "corpus/test.txt") +
                        " --vocab-size 300 --out " + (dir_ / "other.model")).exit_code, 0);
  ASSERT_EQ(run_command(kTool + " data encode --input " + (dir_ / "corpus") + " --tokenizer " + (dir_ / "other.model") +
                        " --out " + (dir_ / "other-tokens")).exit_code, 0);
  ASSERT_EQ(run_command("mv " + (dir_ / "tokens") + " " + (dir_ / "kept") + " && mv " + (dir_ / "other-tokens") + " " +
                        (dir_ / "tokens")).exit_code, 0);
  for (const std::string command : {"eval " + run, "generate " + run + " --prompt 'the cat' --tokens 3",
                                    "export " + run + " --out " + (dir_ / "export"), "train --resume " + run}) {
    const auto r = tool(command, dir_ / "stderr.txt");
    EXPECT_NE(r.exit_code, 0) << command;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << command << ": " << r.err;
    EXPECT_NE(r.err.find("holds other data than the run trained on (now tokenizer 0x"), std::string::npos)
        << command << ": " << r.err;
  }
  // No token folder at all: generate --ids needs none, eval names the missing file.
  ASSERT_EQ(run_command("rm -r " + (dir_ / "tokens")).exit_code, 0);
  EXPECT_EQ(tool("generate " + run + " --ids --prompt '1 2 3' --tokens 3", dir_ / "stderr.txt").exit_code, 0);
  const auto missing = tool("eval " + run, dir_ / "stderr.txt");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("train.bin does not exist"), std::string::npos) << missing.err;
  ASSERT_EQ(run_command("mv " + (dir_ / "kept") + " " + (dir_ / "tokens")).exit_code, 0);
  EXPECT_EQ(tool("eval " + run, dir_ / "stderr.txt").exit_code, 0);
}

TEST_F(HfExport, BadRunFolderWritesNothing) {
  const std::string run = train("run", "");
  int refusals = 0;
  const auto expect_refused = [&](const std::string& target, const std::string& must_contain) {
    const std::string out = dir_ / ("refused-" + std::to_string(++refusals));
    const auto r = tool("export " + target + " --out " + out, dir_ / "stderr.txt");
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("cqk: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(must_contain), std::string::npos) << "expected '" << must_contain << "' in: " << r.err;
    EXPECT_EQ(run_command("test -e " + out).exit_code, 1) << out << " was written";
    const auto left = folder_entries(dir_.path());
    EXPECT_EQ(std::count_if(left.begin(), left.end(), [](const std::string& n) { return n.find(".tmp.") != n.npos; }),
              0);
  };
  // No checkpoint.
  ASSERT_EQ(run_command("mkdir -p " + (dir_ / "empty") + " && cp " + run + "/config.yaml " + (dir_ / "empty")).exit_code,
            0);
  expect_refused(dir_ / "empty", "no checkpoints");
  // An unknown coupling kind in the run's config.
  ASSERT_EQ(run_command("cp -r " + run + " " + (dir_ / "edited") + " && sed -i 's/kind: \"affine\"/kind: bogus/' " +
                        (dir_ / "edited/config.yaml")).exit_code,
            0);
  expect_refused(dir_ / "edited", "bogus");
  // The data folder's tokenizer is gone.
  ASSERT_EQ(run_command("mv " + (dir_ / "tokens/tokenizer.model") + " " + (dir_ / "moved.model")).exit_code, 0);
  expect_refused(run, "tokenizer.model is missing");
  // An existing folder with content is never overwritten.
  ASSERT_EQ(run_command("mv " + (dir_ / "moved.model") + " " + (dir_ / "tokens/tokenizer.model")).exit_code, 0);
  const auto busy = tool("export " + run + " --out " + (dir_ / "tokens"), dir_ / "stderr.txt");
  EXPECT_NE(busy.exit_code, 0);
  EXPECT_NE(busy.err.find("not an empty folder"), std::string::npos) << busy.err;

  // A trailing separator names the same folder, new or made empty by the user.
  ASSERT_EQ(run_command("mkdir " + (dir_ / "made-empty")).exit_code, 0);
  for (const std::string name : {"new-folder/", "made-empty/"}) {
    const auto r = tool("export " + run + " --out " + (dir_ / name), dir_ / "stderr.txt");
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.err;
    EXPECT_EQ(run_command("test -f " + (dir_ / name) + "config.json").exit_code, 0) << name;
  }
}

}  // namespace
