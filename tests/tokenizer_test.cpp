// The sentencepiece tokenizer, the corpus readers, `cqk data` and the WikiText
// download script. Runs in cqk_tests, which also loads libtorch: the first test
// is the check that sentencepiece (with its own protobuf) and torch coexist.
#include <ftw.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sys/wait.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cqk/text_corpus.h"
#include "cqk/token_file.h"
#include "cqk/tokenizer.h"
#include "test_io.h"
#include "word_count.h"

namespace {

using cqk::testing::read_file;
using cqk::testing::reference_word_count;
using cqk::testing::shell_quote;
namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "cqk-tokenizer-XXXXXX").string();
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

// Deterministic English-like text: words built from syllables, WikiText-style lines.
std::string generated_text(int lines, uint64_t seed) {
  static const char* syllables[] = {"ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "an", "er",
                                    "in", "on", "the", "ing", "st", "pre", "tion", "al"};
  uint64_t state = seed * 0x9e3779b97f4a7c15ULL + 1;
  auto next = [&](uint64_t n) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state % n;
  };
  std::ostringstream out;
  for (int l = 0; l < lines; ++l) {
    if (l % 10 == 0) {
      out << " = Heading " << l << " = \n \n";
      continue;
    }
    out << ' ';
    const auto words = 5 + next(15);
    for (uint64_t w = 0; w < words; ++w) {
      const auto parts = 1 + next(3);
      for (uint64_t p = 0; p < parts; ++p) out << syllables[next(18)];
      out << (next(8) == 0 ? " , " : " ");
    }
    out << ". \n";
  }
  return out.str();
}

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// Runs a shell command; returns its exit status and sets `output` to stdout+stderr.
int run(const std::string& command, std::string* output = nullptr) {
  const auto r = cqk::testing::run_command(command);
  if (output) *output = r.out;
  return r.exit_code;
}

// A tiny model trained once for the whole file.
const fs::path& tiny_model() {
  static TempDir dir;
  static const fs::path model = [] {
    write_text(dir.path / "corpus.txt", generated_text(3000, 1));
    cqk::TokenizerTrainOptions options;
    options.inputs = {(dir.path / "corpus.txt").string()};
    options.vocab_size = 400;
    options.model_path = (dir.path / "tiny.model").string();
    cqk::train_tokenizer(options);
    return dir.path / "tiny.model";
  }();
  return model;
}

// --- sentencepiece and libtorch in one process ---------------------------------------

TEST(Tokenizer, SentencepieceAndTorchLiveInOneProcess) {
  // Torch first (its libraries, thread pool and allocator are up) ...
  const auto a = at::randn({64, 64});
  const auto before = at::matmul(a, a.t()).sum().item<double>();
  // ... then sentencepiece trains (protobuf serialisation), loads and encodes ...
  const cqk::Tokenizer tokenizer(tiny_model().string());
  EXPECT_EQ(tokenizer.vocab_size(), 400);
  const std::string text = " the prestion kaloming , shita . ";
  const auto ids = tokenizer.encode(text);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(tokenizer.decode(ids), text);
  // ... and torch still works, on the ids too.
  const auto tensor = at::tensor(std::vector<int64_t>(ids.begin(), ids.end()));
  EXPECT_EQ(tensor.numel(), static_cast<int64_t>(ids.size()));
  EXPECT_DOUBLE_EQ(at::matmul(a, a.t()).sum().item<double>(), before);
  const auto embedded = at::embedding(at::randn({400, 8}), tensor);
  EXPECT_EQ(embedded.size(0), static_cast<int64_t>(ids.size()));
}

TEST(Tokenizer, EncodeDecodeRoundTripWithByteFallback) {
  const cqk::Tokenizer tokenizer(tiny_model().string());
  const std::vector<std::string> texts = {
      " = Heading 7 = ",
      "kalo mine  rushi   poter",            // runs of spaces are kept
      "  leading and trailing  ",
      "naïve café — Zürich, 東京 and emoji 🙂",  // unseen characters: byte fallback
      "digits 1234567890 and tabs\tinside",
      "",
  };
  for (const auto& text : texts) {
    const auto ids = tokenizer.encode(text);
    for (int id : ids) EXPECT_NE(id, tokenizer.unk_id()) << "nothing maps to <unk>: " << text;
    EXPECT_EQ(tokenizer.decode(ids), text);
  }
  EXPECT_EQ(tokenizer.piece(tokenizer.newline_id()), "<0x0A>");
  EXPECT_EQ(tokenizer.decode({tokenizer.newline_id()}), "\n");
}

TEST(Tokenizer, PieceByteLengthsAddUpToTheTextsBytes) {
  const cqk::Tokenizer tokenizer(tiny_model().string());
  const auto lengths = tokenizer.piece_byte_lengths();
  ASSERT_EQ(lengths.size(), 400u);
  EXPECT_EQ(lengths[static_cast<std::size_t>(tokenizer.bos_id())], 0);
  EXPECT_EQ(lengths[static_cast<std::size_t>(tokenizer.eos_id())], 0);
  EXPECT_EQ(lengths[static_cast<std::size_t>(tokenizer.newline_id())], 1);
  // Multi-byte characters the model never saw become several byte pieces.
  for (const std::string text : {" the prestion kaloming , shita . ", "naïve café — Zürich, 東京 🙂\n", "  a\tb  \n\n"}) {
    const auto ids = tokenizer.encode(text);
    std::size_t bytes = 0;
    for (const int id : ids) bytes += static_cast<std::size_t>(lengths[static_cast<std::size_t>(id)]);
    EXPECT_EQ(bytes, text.size()) << text;
  }
}

TEST(Tokenizer, ChecksumIsFnv1aOfTheModelFile) {
  const cqk::Tokenizer tokenizer(tiny_model().string());
  const auto bytes = read_file(tiny_model());
  EXPECT_EQ(tokenizer.checksum(), cqk::fnv1a64(bytes.data(), bytes.size()));
  EXPECT_EQ(tokenizer.checksum(), cqk::file_checksum(tiny_model().string()));
  EXPECT_EQ(cqk::fnv1a64("", 0), cqk::kFnv1aOffset);
  EXPECT_EQ(cqk::fnv1a64("a", 1), 0xaf63dc4c8601ec8cULL);  // the published FNV-1a 64 test vector
  EXPECT_TRUE(fs::exists(fs::path(tiny_model()).replace_extension(".vocab")));
  EXPECT_THROW(cqk::Tokenizer("/nonexistent/x.model"), std::runtime_error);
}

TEST(Tokenizer, TrainingErrorsAreReported) {
  TempDir dir;
  cqk::TokenizerTrainOptions options;
  options.inputs = {(dir.path / "missing.txt").string()};
  options.vocab_size = 400;
  options.model_path = (dir.path / "m.model").string();
  EXPECT_THROW(cqk::train_tokenizer(options), std::runtime_error);
  options.vocab_size = 100;
  EXPECT_THROW(cqk::train_tokenizer(options), std::invalid_argument);
  EXPECT_FALSE(fs::exists(options.model_path));
}

// Fewer ids than the corpus's characters need: the size it needs, not
// sentencepiece's advice to lower character_coverage (not a cqk option).
TEST(Tokenizer, AVocabularyTooSmallForTheCorpusSaysTheSizeNeeded) {
  TempDir dir;
  std::string text;
  for (char32_t c = 0x4E00; c < 0x4E00 + 400; ++c) {  // 400 CJK ideographs, 3 UTF-8 bytes each
    text += static_cast<char>(0xE0 | (c >> 12));
    text += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    text += static_cast<char>(0x80 | (c & 0x3F));
    if (c % 20 == 19) text += '\n';
  }
  write_text(dir.path / "corpus.txt", text);
  cqk::TokenizerTrainOptions options;
  options.inputs = {(dir.path / "corpus.txt").string()};
  options.vocab_size = 300;
  options.model_path = (dir.path / "m.model").string();
  try {
    cqk::train_tokenizer(options);
    ADD_FAILURE() << "trained";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    // 400 characters, 256 bytes, unk, bos and eos.
    EXPECT_EQ(message, "tokenizer vocab size 300 is too small for this corpus: it needs at least 659 (an id for each "
                       "of its characters, the 256 bytes and the special tokens)");
  }
  EXPECT_FALSE(fs::exists(options.model_path));
}

// --- corpus readers ----------------------------------------------------------------------

TEST(DataCorpus, DetectsTheLayouts) {
  TempDir dir;
  for (const char* name : {"wiki.train.raw", "wiki.valid.raw", "wiki.test.raw"}) write_text(dir.path / "raw" / name, "x\n");
  for (const char* name : {"wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens"})
    write_text(dir.path / "tok" / name, "x\n");
  for (const char* name : {"train.txt", "valid.txt", "test.txt"}) write_text(dir.path / "txt" / name, "x\n");
  for (const char* name : {"wiki.train.raw", "wiki.valid.raw", "wiki.test.raw"})
    write_text(dir.path / "nested" / "wikitext-103-raw" / name, "x\n");

  EXPECT_EQ(cqk::detect_corpus((dir.path / "raw").string()).format, "wikitext-raw");
  const auto tokens = cqk::detect_corpus((dir.path / "tok").string());
  EXPECT_EQ(tokens.format, "wikitext-tokens");
  EXPECT_EQ(tokens.split("valid"), (dir.path / "tok" / "wiki.valid.tokens").string());
  EXPECT_EQ(cqk::detect_corpus((dir.path / "txt").string()).format, "plain");
  const auto nested = cqk::detect_corpus((dir.path / "nested").string());
  EXPECT_EQ(nested.train, (dir.path / "nested" / "wikitext-103-raw" / "wiki.train.raw").string());
  EXPECT_EQ(cqk::tokenizer_inputs({(dir.path / "raw").string()}),
            std::vector<std::string>{(dir.path / "raw" / "wiki.train.raw").string()});

  write_text(dir.path / "partial" / "wiki.train.raw", "x\n");  // valid and test missing
  try {
    cqk::detect_corpus((dir.path / "partial").string());
    FAIL();
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    for (const char* name : {"wiki.train.tokens", "wiki.test.raw", "valid.txt"})
      EXPECT_NE(message.find(name), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
  EXPECT_THROW(cqk::tokenizer_inputs({(dir.path / "nope.txt").string()}), std::runtime_error);
}

TEST(DataCorpus, LineReaderKeepsEveryLine) {
  TempDir dir;
  std::string long_line(3 << 20, 'x');  // longer than the read block
  write_text(dir.path / "a.txt", "one\n\ntwo\r\n" + long_line + "\nlast without newline");
  cqk::LineReader reader((dir.path / "a.txt").string());
  std::vector<std::string> lines;
  for (std::string line; reader.next(line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0], "one");
  EXPECT_EQ(lines[1], "");
  EXPECT_EQ(lines[2], "two\r");
  EXPECT_EQ(lines[3], long_line);
  EXPECT_EQ(lines[4], "last without newline");
  EXPECT_EQ(reader.bytes_read(), reader.file_size());
}

// --- cqk data: tokenizer + encode, decoded back to the text -------------------------------

TEST(DataCommand, TokenizerAndEncodeRoundTrip) {
  TempDir dir;
  const auto corpus = dir.path / "corpus";
  write_text(corpus / "wiki.train.raw", generated_text(3000, 2));
  write_text(corpus / "wiki.valid.raw", generated_text(200, 3));
  write_text(corpus / "wiki.test.raw", generated_text(150, 4) + "naïve 東京 line without newline at the end");
  const auto model = dir.path / "tok" / "bpe.model";
  std::string output;
  ASSERT_EQ(run(std::string(CQK_TOOL) + " data tokenizer --input " + shell_quote(corpus.string()) +
                    " --vocab-size 500 --out " + shell_quote(model.string()),
                &output),
            0)
      << output;
  const auto out = dir.path / "tokens";
  ASSERT_EQ(run(std::string(CQK_TOOL) + " data encode --input " + shell_quote(corpus.string()) + " --tokenizer " +
                    shell_quote(model.string()) + " --out " + shell_quote(out.string()) + " --jobs 3",
                &output),
            0)
      << output;
  EXPECT_NE(output.find("lines/s"), std::string::npos) << output;

  const cqk::Tokenizer tokenizer(model.string());
  const auto meta = nlohmann::json::parse(read_file(out / "meta.json"));
  for (const char* split : {"train", "valid", "test"}) {
    const cqk::TokenFile file((out / (std::string(split) + ".bin")).string(), tokenizer.checksum());
    EXPECT_EQ(file.vocab_size(), 500);
    std::vector<int32_t> ids(static_cast<std::size_t>(file.size()));
    file.read(0, file.size(), ids.data());
    std::string text = read_file(corpus / ("wiki." + std::string(split) + ".raw"));
    if (text.back() != '\n') text += '\n';  // every encoded line ends with the newline token
    EXPECT_EQ(tokenizer.decode(std::vector<int>(ids.begin(), ids.end())), text) << split;
    const auto& counts = meta["splits"][split];
    EXPECT_EQ(counts["tokens"].get<int64_t>(), file.size()) << split;
    EXPECT_EQ(counts["bytes"].get<int64_t>(), static_cast<int64_t>(text.size())) << split;
    EXPECT_EQ(counts["words"].get<int64_t>(), reference_word_count(text)) << split;
  }
  EXPECT_TRUE(fs::exists(out / "tokenizer.model"));

  // A token file checked against another tokenizer is refused.
  EXPECT_THROW(cqk::TokenFile((out / "train.bin").string(), tokenizer.checksum() ^ 1), std::runtime_error);
}

TEST(DataCommand, ASingleFileMakesAnEvaluationOnlyFolder) {
  TempDir dir;
  const std::string text = generated_text(120, 5) + "naïve 東京\n";
  write_text(dir.path / "wiki.valid.tokens", text);
  const auto out = dir.path / "ood";
  std::string output;
  ASSERT_EQ(run(std::string(CQK_TOOL) + " data encode --input " + shell_quote((dir.path / "wiki.valid.tokens").string()) +
                    " --tokenizer " + shell_quote(tiny_model().string()) + " --out " + shell_quote(out.string()),
                &output),
            0)
      << output;
  EXPECT_FALSE(fs::exists(out / "train.bin"));
  EXPECT_EQ(read_file(out / "valid.bin"), read_file(out / "test.bin"));
  EXPECT_EQ(read_file(out / "tokenizer.model"), read_file(tiny_model()));
  const cqk::Tokenizer tokenizer(tiny_model().string());
  const cqk::TokenFile file((out / "valid.bin").string(), tokenizer.checksum());
  std::vector<int32_t> ids(static_cast<std::size_t>(file.size()));
  file.read(0, file.size(), ids.data());
  EXPECT_EQ(tokenizer.decode(std::vector<int>(ids.begin(), ids.end())), text);

  const auto meta = nlohmann::json::parse(read_file(out / "meta.json"));
  EXPECT_EQ(meta["format"], "evaluation-only");
  EXPECT_FALSE(meta["splits"].contains("train"));
  for (const char* split : {"valid", "test"}) {
    EXPECT_EQ(meta["splits"][split]["tokens"].get<int64_t>(), file.size());
    EXPECT_EQ(meta["splits"][split]["bytes"].get<int64_t>(), static_cast<int64_t>(text.size()));
    EXPECT_EQ(meta["splits"][split]["words"].get<int64_t>(), reference_word_count(text));
  }
}

TEST(DataCommand, ErrorsAreOneLineAndNonZero) {
  TempDir dir;
  std::string output;
  EXPECT_NE(run(std::string(CQK_TOOL) + " data encode --input " + shell_quote((dir.path / "none").string()) +
                    " --tokenizer x.model --out " + shell_quote((dir.path / "out").string()),
                &output),
            0);
  EXPECT_NE(output.find("does not exist"), std::string::npos) << output;
  EXPECT_EQ(output.find('\n'), output.size() - 1) << output;
  write_text(dir.path / "empty" / "train.txt", "");
  EXPECT_NE(run(std::string(CQK_TOOL) + " data encode --input " + shell_quote((dir.path / "empty").string()) +
                    " --tokenizer x.model --out " + shell_quote((dir.path / "out").string()),
                &output),
            0);
  EXPECT_NE(output.find("wiki.train.tokens"), std::string::npos) << output;
}

// --- scripts/get_wikitext103.sh, offline: verify + unpack a small archive ---------------

TEST(DataScript, VerifiesAndUnpacksAnArchive) {
  TempDir dir;
  const auto staged = dir.path / "staged" / "wikitext-103-raw";
  for (const char* split : {"train", "valid", "test"})
    write_text(staged / ("wiki." + std::string(split) + ".raw"), " = " + std::string(split) + " = \n text\n");
  const bool have_zip = run("command -v zip") == 0;
  const auto archive = dir.path / (have_zip ? "w.zip" : "w.tar.gz");
  const std::string pack = have_zip ? "zip -qr " + shell_quote(archive.string()) + " wikitext-103-raw"
                                    : "tar czf " + shell_quote(archive.string()) + " wikitext-103-raw";
  ASSERT_EQ(run("cd " + shell_quote((dir.path / "staged").string()) + " && " + pack), 0);
  std::string sha;
  ASSERT_EQ(run("sha256sum " + shell_quote(archive.string()) + " | cut -d' ' -f1", &sha), 0);
  sha = sha.substr(0, 64);

  const std::string script = std::string(CQK_SOURCE_DIR) + "/scripts/get_wikitext103.sh";
  const auto dest = dir.path / "data" / "wikitext-103";
  std::string output;
  ASSERT_EQ(run("bash " + shell_quote(script) + " --from-archive " + shell_quote(archive.string()) + " --sha256 " + sha +
                    " --dest " + shell_quote(dest.string()),
                &output),
            0)
      << output;
  EXPECT_EQ(read_file(dest / "wiki.valid.raw"), " = valid = \n text\n");
  const auto corpus = cqk::detect_corpus(dest.string());
  EXPECT_EQ(corpus.format, "wikitext-raw");
  // No temporary folder is left next to the destination.
  EXPECT_EQ(std::distance(fs::directory_iterator(dest.parent_path()), fs::directory_iterator()), 1);

  // A wrong digest: rejected, nothing unpacked.
  const auto other = dir.path / "other";
  std::string wrong = sha;
  wrong[0] = wrong[0] == '0' ? '1' : '0';
  ASSERT_NE(run("bash " + shell_quote(script) + " --from-archive " + shell_quote(archive.string()) + " --sha256 " +
                    wrong + " --dest " + shell_quote(other.string()),
                &output),
            0);
  EXPECT_NE(output.find("checksum mismatch"), std::string::npos) << output;
  EXPECT_NE(output.find(wrong), std::string::npos) << output;
  EXPECT_FALSE(fs::exists(other));

  // The digest can come from the environment (CQK_WIKITEXT_SHA256).
  ASSERT_NE(run("CQK_WIKITEXT_SHA256=" + wrong + " bash " + shell_quote(script) + " --from-archive " +
                    shell_quote(archive.string()) + " --dest " + shell_quote(other.string())),
            0);
  // An archive without the expected files.
  const auto bad = dir.path / "bad.tar";
  ASSERT_EQ(run("tar cf " + shell_quote(bad.string()) + " -C " + shell_quote(staged.string()) + " wiki.train.raw"), 0);
  std::string bad_sha;
  run("sha256sum " + shell_quote(bad.string()) + " | cut -d' ' -f1", &bad_sha);
  EXPECT_NE(run("bash " + shell_quote(script) + " --from-archive " + shell_quote(bad.string()) + " --sha256 " +
                    bad_sha.substr(0, 64) + " --dest " + shell_quote(other.string()),
                &output),
            0);
  EXPECT_NE(output.find("wiki.valid.raw"), std::string::npos) << output;
}

}  // namespace
