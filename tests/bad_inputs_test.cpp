#include <dirent.h>
#include <ftw.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cqk/coupling_options.h"
#include "cqk/token_file.h"
#include "kind_choices.h"
#include "temp_dir.h"
#include "test_io.h"

// The corpus of bad inputs in tests/bad_inputs/ (cases.yaml says what each case
// runs and the error it must give), run through the `cqk` tool: every one ends
// with one error line naming the problem, a non-zero exit, no crash, no torch
// backtrace and nothing written to disk.
namespace {

using cqk::testing::choices;
using cqk::testing::CommandResult;
using cqk::testing::folder_entries;
using cqk::testing::read_file;
using cqk::testing::run_command;
using cqk::testing::shell_quote;
using cqk::testing::TempDir;
using cqk::testing::write_file;

const std::string kCorpus = std::string(CQK_SOURCE_DIR) + "/tests/bad_inputs";

struct Case {
  std::string name, args, setup;
  std::string env;               // VAR=value assignments the command runs with
  std::vector<std::string> expect;
  int log_lines = 0;             // "[hh:mm:ss info|warning]" lines allowed before the error line
  bool during_training = false;  // found by the training loop: the run dir may exist, without checkpoints
  bool skip_as_root = false;     // relies on file permissions, which root ignores
  std::string manifest_error;    // cases.yaml could not be read
};

std::ostream& operator<<(std::ostream& out, const Case& c) {
  return out << c.name << ": " << (c.env.empty() ? "" : c.env + " ") << "cqk " << c.args;
}

std::vector<Case> load_cases() {
  std::vector<Case> cases;
  try {
    const YAML::Node list = YAML::LoadFile(kCorpus + "/cases.yaml");
    for (const auto& node : list) {
      Case c;
      c.name = node["name"].as<std::string>();
      c.args = node["args"].as<std::string>();
      if (node["setup"]) c.setup = node["setup"].as<std::string>();
      if (node["env"]) c.env = node["env"].as<std::string>();
      if (node["log_lines"]) c.log_lines = node["log_lines"].as<int>();
      if (node["during_training"]) c.during_training = node["during_training"].as<bool>();
      if (node["skip_as_root"]) c.skip_as_root = node["skip_as_root"].as<bool>();
      const YAML::Node expect = node["expect"];
      if (expect.IsSequence()) {
        for (const auto& e : expect) c.expect.push_back(e.as<std::string>());
      } else {
        c.expect.push_back(expect.as<std::string>());
      }
      cases.push_back(c);
    }
  } catch (const std::exception& e) {
    Case broken;
    broken.name = "manifest";
    broken.manifest_error = std::string("tests/bad_inputs/cases.yaml: ") + e.what();
    cases = {broken};
  }
  return cases;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = text.find(from, at)) != std::string::npos; at += to.size()) text.replace(at, from.size(), to);
  return text;
}

// Runs `cqk ARGS` (through the shell, so ARGS may quote) in `cwd`, one torch thread,
// with the environment assignments `env` adds.
CommandResult run_tool(const std::string& args, const std::string& cwd, const std::string& scratch,
                       const std::string& env = "") {
  return run_command("cd '" + cwd + "' && CQK_NUM_THREADS=1 " + env + " " + std::string(CQK_TOOL) + " " + args,
                     scratch + "/stderr.txt");
}

// --- fixtures ---------------------------------------------------------------------

constexpr uint64_t kVocab = 64;
constexpr uint64_t kTokenizerChecksum = 0x5eed5eed5eed5eedULL;
constexpr int32_t kTokens = 2000;

std::vector<int32_t> ramp(int32_t n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = (i * 7919) % static_cast<int32_t>(kVocab);
  return ids;
}

void patch(const std::string& path, std::streamoff offset, const std::string& bytes) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(offset);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!file) throw std::runtime_error("cannot patch " + path);
}

std::string le32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }

// {tmp}/data: three good splits made with the token file API, then the damage `variant` names.
void make_tokens(const std::string& tmp, const std::string& variant) {
  const std::string data = tmp + "/data";
  ::mkdir(data.c_str(), 0755);
  for (const char* split : {"train", "valid", "test"})
    cqk::write_token_file(data + "/" + split + ".bin", ramp(kTokens), kVocab, kTokenizerChecksum);
  const std::string train = data + "/train.bin";
  if (variant.empty()) return;
  if (variant == "no-test") {
    ::unlink((data + "/test.bin").c_str());
  } else if (variant == "dir-as-file") {
    ::unlink(train.c_str());
    ::mkdir(train.c_str(), 0755);
  } else if (variant == "empty") {
    write_file(train, "");
  } else if (variant == "truncated") {
    if (::truncate(train.c_str(), 64 + 200) != 0) throw std::runtime_error("truncate failed");
  } else if (variant == "trailing") {
    std::ofstream(data + "/valid.bin", std::ios::binary | std::ios::app) << "xyz";
  } else if (variant == "foreign") {
    // A NumPy .npy file of uint16, what a user might have lying around instead.
    const std::string npy = std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                            "{'descr': '<u2', 'fortran_order': False, 'shape': (2000,), }";
    write_file(train, npy + std::string(4000, '\x01'));
  } else if (variant == "version") {
    patch(train, 8, le32(2));
  } else if (variant == "width") {
    patch(train, 12, le32(4));
  } else if (variant == "other-tokenizer") {
    cqk::write_token_file(data + "/valid.bin", ramp(kTokens), kVocab, 0x0123456789abcdefULL);
  } else if (variant == "bad-ids") {
    patch(train, 64, std::string(2 * kTokens, '\xff'));  // every id 65535, the vocabulary is 64
  } else if (variant == "short") {
    cqk::write_token_file(train, ramp(10), kVocab, kTokenizerChecksum);
  } else if (variant == "mode-000") {
    ::chmod(train.c_str(), 0);
  } else {
    throw std::invalid_argument("unknown tokens variant '" + variant + "'");
  }
}

const char* const kTinyRun =
    "--threads 1 train --set model.width=32 --set model.layers=1 --set model.heads=4 --set data.seq_len=16"
    " --set data.batch_size=4 --set data.recall.pairs=2 --set data.recall.vocab_size=32"
    " --set data.recall.train_examples=100 --set data.recall.eval_examples=16 --set train.steps=3"
    " --set train.checkpoint_every=1 --set train.keep_checkpoints=5 --set train.eval_every=100"
    " --set train.device=cpu --max-steps 2";  // paused: a resume has a step to take

void train_tiny(const std::string& run_dir, const std::string& extra, const std::string& scratch) {
  const auto r = run_tool(std::string(kTinyRun) + " --set run.dir=" + run_dir + " " + extra, scratch, scratch);
  if (r.exit_code != 0) throw std::runtime_error("fixture training failed: " + r.err);
}

// {tmp}/trained: a tiny run paused with checkpoints at steps 1 and 2 of 3, then
// changed as `variant` says; "finished-CHANGE": resumed to its end first.
void make_trained(const std::string& tmp, const std::string& variant, const std::string& scratch) {
  const std::string run = tmp + "/trained";
  train_tiny(run, "", scratch);
  const std::string checkpoints = run + "/checkpoints";
  std::string change = variant;
  if (change.rfind("finished", 0) == 0) {
    const auto r = run_tool("--threads 1 train --resume " + run, scratch, scratch);
    if (r.exit_code != 0) throw std::runtime_error("fixture resume failed: " + r.err);
    change = change.substr(std::min(change.size(), std::string("finished-").size()));
  }
  if (change.empty()) return;
  if (change == "corrupt") {
    for (const auto& name : folder_entries(checkpoints)) {
      const std::string path = checkpoints + "/" + name;
      std::string bytes = read_file(path);
      bytes[bytes.size() / 2] ^= 0x20;
      write_file(path, bytes);
    }
  } else if (change == "no-checkpoints") {
    for (const auto& name : folder_entries(checkpoints)) ::unlink((checkpoints + "/" + name).c_str());
  } else if (change == "other-config") {
    // The checkpoints of another run (another width) put in this run's place.
    const std::string other = scratch + "/other";
    train_tiny(other, "--set model.width=64", scratch);
    for (const auto& name : folder_entries(checkpoints)) ::unlink((checkpoints + "/" + name).c_str());
    for (const auto& name : folder_entries(other + "/checkpoints"))
      write_file(checkpoints + "/" + name, read_file(other + "/checkpoints/" + name));
  } else if (change == "bad-config") {
    const std::string path = run + "/config.yaml";
    std::string text = read_file(path);
    const size_t at = text.find("  width:");
    if (at == std::string::npos) throw std::runtime_error("no width in " + path);
    text.replace(at, 8, "  widht:");
    write_file(path, text);
  } else {
    throw std::invalid_argument("unknown trained variant '" + variant + "'");
  }
}

void make_corpus(const std::string& tmp) {
  const std::string corpus = tmp + "/corpus";
  ::mkdir(corpus.c_str(), 0755);
  for (const char* split : {"train", "valid", "test"})
    write_file(corpus + "/" + split + ".txt", "the cat sat on the mat\nthe dog sat on the log\n");
}

void set_up(const std::string& setup, const std::string& tmp, const std::string& scratch) {
  if (setup.empty()) return;
  const size_t dash = setup.find('-');
  const std::string kind = setup.substr(0, dash);
  const std::string variant = dash == std::string::npos ? "" : setup.substr(dash + 1);
  if (kind == "tokens") return make_tokens(tmp, variant);
  if (kind == "trained") return make_trained(tmp, variant, scratch);
  if (kind == "corpus") return make_corpus(tmp);
  throw std::invalid_argument("unknown setup '" + setup + "'");
}

// --- what is on disk ------------------------------------------------------------------

struct Entry {
  bool directory = false;
  std::string content;
};
using Tree = std::map<std::string, Entry>;

Tree* g_tree = nullptr;
size_t g_root_length = 0;

int record(const char* path, const struct stat* info, int type, struct FTW*) {
  std::string relative = std::string(path).substr(g_root_length);
  if (relative.empty()) return 0;
  Entry entry;
  entry.directory = type == FTW_D || type == FTW_DNR;
  if (!entry.directory && S_ISREG(info->st_mode)) entry.content = read_file(path);
  (*g_tree)[relative] = entry;
  return 0;
}

Tree snapshot(const std::string& root) {
  Tree tree;
  g_tree = &tree;
  g_root_length = root.size();
  ::nftw(root.c_str(), record, 16, FTW_PHYS);
  g_tree = nullptr;
  return tree;
}

// What changed on disk that a failed command must not change.
std::vector<std::string> disk_changes(const Tree& before, const Tree& after, const Case& c) {
  std::vector<std::string> problems;
  const auto in_run = [](const std::string& path) { return path == "/run" || path.rfind("/run/", 0) == 0; };
  for (const auto& [path, entry] : after) {
    const auto it = before.find(path);
    const bool is_log = path.size() >= 10 && path.compare(path.size() - 10, 10, "/train.log") == 0;
    if (it == before.end()) {
      // An error found while training may leave the started run, but no checkpoint.
      const bool allowed = c.during_training && in_run(path) && path.rfind("/run/checkpoints/", 0) != 0 &&
                           path != "/run/results.json" && path != "/run/model.pt";
      if (!allowed) problems.push_back("created " + path);
    } else if (entry.content != it->second.content) {
      const bool grew = is_log && entry.content.compare(0, it->second.content.size(), it->second.content) == 0;
      if (!grew) problems.push_back("changed " + path);
    }
  }
  for (const auto& [path, entry] : before)
    if (!after.count(path)) problems.push_back("removed " + path);
  return problems;
}

// --- the test ---------------------------------------------------------------------------

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class BadInput : public ::testing::TestWithParam<Case> {};

TEST_P(BadInput, GivesOneErrorLineAndWritesNothing) {
  const Case& c = GetParam();
  ASSERT_TRUE(c.manifest_error.empty()) << c.manifest_error;
  if (c.skip_as_root && ::geteuid() == 0) GTEST_SKIP() << "root ignores file permissions";
  TempDir tmp("cqk-bad-input"), scratch("cqk-bad-input-scratch");
  ASSERT_NO_THROW(set_up(c.setup, tmp.path(), scratch.path())) << c.setup;
  std::string args = replace_all(c.args, "{run}", tmp / "run");
  args = replace_all(args, "{tmp}", tmp.path());
  args = replace_all(args, "{dir}", kCorpus);

  const Tree before = snapshot(tmp.path());
  const CommandResult r = run_tool(args, tmp.path(), scratch.path(), c.env);
  const Tree after = snapshot(tmp.path());

  const std::string shown = c.env + " cqk " + args + "\nexit " + std::to_string(r.exit_code) + "\nstdout:\n" + r.out +
                            "\nstderr:\n" + r.err;
  ASSERT_EQ(r.signal, 0) << "killed by signal " << r.signal << "\n" << shown;
  EXPECT_EQ(r.exit_code, 2) << shown;
  EXPECT_EQ(r.out, "") << shown;
  for (const char* never : {"terminate called", "Exception raised from", "Sanitizer", "runtime error:", "Aborted",
                            "Segmentation fault", "Traceback"})
    EXPECT_EQ(r.err.find(never), std::string::npos) << never << "\n" << shown;

  ASSERT_FALSE(r.err.empty()) << shown;
  EXPECT_EQ(r.err.back(), '\n') << shown;
  const auto lines = lines_of(r.err);
  ASSERT_EQ(lines.size(), static_cast<size_t>(c.log_lines) + 1) << shown;
  const std::regex log_line(R"(^\[\d\d:\d\d:\d\d (info|warning)\] .+)");
  for (int i = 0; i < c.log_lines; ++i)
    EXPECT_TRUE(std::regex_match(lines[static_cast<size_t>(i)], log_line)) << lines[static_cast<size_t>(i)];
  const std::string& error = lines.back();
  EXPECT_EQ(error.rfind("cqk: error: ", 0), 0u) << shown;
  for (const auto& expected : c.expect) {
    const std::string fragment = replace_all(expected, "{coupling_kinds}", choices(cqk::coupling_kind_names()));
    EXPECT_NE(error.find(fragment), std::string::npos) << "expected '" << fragment << "' in:\n" << error;
  }

  for (const auto& problem : disk_changes(before, after, c)) ADD_FAILURE() << problem << "\n" << shown;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = info.param.name;
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Corpus, BadInput, ::testing::ValuesIn(load_cases()), case_name);

// The inherit-missing case from a folder over 150 characters deep, as in a
// deeply nested clone: the one error line names the missing file in full.
TEST(BadInputs, MissingBaseFileIsNamedInFullFromADeepFolder) {
  TempDir tmp("cqk-bad-input"), scratch("cqk-bad-input-scratch");
  std::string deep = tmp.path();
  while (deep.size() < 160) {
    deep += "/a-folder-name-of-some-length";
    ASSERT_EQ(::mkdir(deep.c_str(), 0755), 0) << deep;
  }
  write_file(deep + "/inherit-missing.yaml", read_file(kCorpus + "/inherit-missing.yaml"));
  const CommandResult r = run_tool("train " + shell_quote(deep + "/inherit-missing.yaml") +
                                       " --set run.dir=" + shell_quote(tmp / "run"),
                                   tmp.path(), scratch.path());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const auto lines = lines_of(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_NE(lines[0].find("inherit: cannot read '" + deep + "/no-such-base.yaml': "), std::string::npos)
      << lines[0];
}

// Every file of the corpus is used by a case, and case names are unique.
TEST(BadInputs, EveryCorpusFileIsUsedOnce) {
  const auto cases = load_cases();
  ASSERT_TRUE(cases.front().manifest_error.empty()) << cases.front().manifest_error;
  std::set<std::string> names;
  for (const auto& c : cases) EXPECT_TRUE(names.insert(case_name({c, 0})).second) << "duplicate case " << c.name;
  for (const auto& file : folder_entries(kCorpus)) {
    if (file == "cases.yaml") continue;
    const bool used = std::any_of(cases.begin(), cases.end(), [&](const Case& c) {
      return c.args.find("{dir}/" + file + " ") != std::string::npos ||
             (file == "inherit-cycle-b.yaml" && c.name == "inherit-cycle");
    });
    EXPECT_TRUE(used) << file << " is not used by any case in cases.yaml";
  }
  std::printf("bad inputs: %zu cases\n", cases.size());
}

}  // namespace
