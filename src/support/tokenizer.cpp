#include "cqk/tokenizer.h"

#include <sched.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <regex>
#include <stdexcept>
#include <unordered_map>

#include "cqk/atomic_file.h"
#include "cqk/log.h"
#include "cqk/text_corpus.h"

namespace cqk {
namespace {

int cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return 1;
}

// Streams the lines of several files into the sentencepiece trainer.
class FileLines : public sentencepiece::SentenceIterator {
 public:
  explicit FileLines(std::vector<std::string> files) : files_(std::move(files)) { advance(); }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return status_; }
  int64_t lines() const { return lines_; }

 private:
  void advance() {
    try {
      for (;;) {
        if (!reader_) {
          if (next_file_ == files_.size()) {
            done_ = true;
            return;
          }
          reader_ = std::make_unique<LineReader>(files_[next_file_++]);
        }
        if (reader_->next(line_)) {
          if (!line_.empty() && line_.back() == '\r') line_.pop_back();
          if (line_.find_first_not_of(' ') == std::string::npos) continue;  // blank lines teach nothing
          ++lines_;
          return;
        }
        reader_.reset();
      }
    } catch (const std::exception& e) {
      status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kInternal, e.what());
      done_ = true;
    }
  }

  std::vector<std::string> files_;
  std::size_t next_file_ = 0;
  std::unique_ptr<LineReader> reader_;
  std::string line_;
  bool done_ = false;
  int64_t lines_ = 0;
  sentencepiece::util::Status status_;
};

std::string vocab_path_for(const std::string& model_path) {
  const std::string suffix = ".model";
  if (model_path.size() > suffix.size() &&
      model_path.compare(model_path.size() - suffix.size(), suffix.size(), suffix) == 0)
    return model_path.substr(0, model_path.size() - suffix.size()) + ".vocab";
  return model_path + ".vocab";
}

// sentencepiece's error, or, for a vocabulary without room for every character
// of the corpus (coverage 1.0) and the byte pieces, the size it needs: its own
// advice, lowering character_coverage, is not a cqk option.
std::string training_failure(const std::string& message, int vocab_size) {
  static const std::regex too_few(R"(Vocabulary size is smaller than required_chars\. ([0-9]+) vs ([0-9]+))");
  std::smatch m;
  if (std::regex_search(message, m, too_few))
    return "tokenizer vocab size " + std::to_string(vocab_size) + " is too small for this corpus: it needs at least " +
           m[2].str() + " (an id for each of its characters, the 256 bytes and the special tokens)";
  return "sentencepiece training failed: " + message;
}

}  // namespace

uint64_t fnv1a64(const void* data, std::size_t size, uint64_t hash) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

std::string checksum_hex(uint64_t checksum) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%016llx", static_cast<unsigned long long>(checksum));
  return text;
}

uint64_t file_checksum(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  std::vector<char> buffer(1 << 16);
  uint64_t hash = kFnv1aOffset;
  for (;;) {
    const std::size_t n = std::fread(buffer.data(), 1, buffer.size(), file);
    hash = fnv1a64(buffer.data(), n, hash);
    if (n < buffer.size()) break;
  }
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) throw std::runtime_error("cannot read " + path);
  return hash;
}

void train_tokenizer(const TokenizerTrainOptions& options) {
  if (options.inputs.empty()) throw std::invalid_argument("train_tokenizer: no input files");
  if (options.model_path.empty()) throw std::invalid_argument("train_tokenizer: no model path");
  if (options.vocab_size < 300)
    throw std::invalid_argument("tokenizer vocab size " + std::to_string(options.vocab_size) +
                                " is too small: byte fallback alone takes 259 ids");
  // sentencepiece refuses a sample of 1-100 lines with an internal error.
  if (options.max_sentences < 0 || (options.max_sentences > 0 && options.max_sentences <= 100))
    throw std::invalid_argument("tokenizer --max-sentences must be 0 (all lines) or more than 100, got " +
                                std::to_string(options.max_sentences));
  const int threads = options.threads > 0 ? options.threads : cores();
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"byte_fallback", "true"},
      {"character_coverage", "1.0"},
      // Identity normalisation, whitespace as is, no dummy space before each
      // text: decode(encode(x)) == x, also for concatenated lines.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"input_sentence_size", std::to_string(options.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", std::to_string(options.max_sentence_bytes)},
      {"num_threads", std::to_string(threads)},
      {"minloglevel", options.verbose ? "0" : "1"},
  };
  log::info("tokenizer: training BPE, vocabulary " + std::to_string(options.vocab_size) + ", on " +
            std::to_string(options.inputs.size()) + " file(s), " + std::to_string(threads) +
            " threads (minutes for a large corpus; sentencepiece's own log with --verbose)");
  FileLines lines(options.inputs);
  std::string serialized;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &serialized);
  if (!lines.status().ok()) throw std::runtime_error("tokenizer training input: " + lines.status().ToString());
  if (!status.ok()) throw std::runtime_error(training_failure(status.ToString(), options.vocab_size));

  sentencepiece::SentencePieceProcessor processor;
  const auto loaded = processor.LoadFromSerializedProto(serialized);
  if (!loaded.ok()) throw std::runtime_error("sentencepiece produced an unreadable model: " + loaded.ToString());
  write_file_atomically(options.model_path, serialized);
  std::string vocab;
  for (int id = 0; id < processor.GetPieceSize(); ++id) {
    vocab += processor.IdToPiece(id);
    vocab += '\t';
    vocab += std::to_string(processor.GetScore(id));
    vocab += '\n';
  }
  write_file_atomically(vocab_path_for(options.model_path), vocab);
  const std::string sample = options.max_sentences > 0 && lines.lines() > options.max_sentences
                                 ? "a sample of " + std::to_string(options.max_sentences) + " of "
                                 : "all ";
  log::info("tokenizer: trained BPE with " + std::to_string(processor.GetPieceSize()) + " pieces on " + sample +
            std::to_string(lines.lines()) + " lines -> " + options.model_path);
}

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor processor;
  int newline = -1;
};

Tokenizer::Tokenizer(const std::string& model_path) : impl_(std::make_unique<Impl>()), path_(model_path) {
  checksum_ = file_checksum(model_path);
  const auto status = impl_->processor.Load(model_path);
  if (!status.ok()) throw std::runtime_error("cannot load tokenizer " + model_path + ": " + status.ToString());
  const int newline = impl_->processor.PieceToId("<0x0A>");
  impl_->newline = newline != impl_->processor.unk_id() ? newline : impl_->processor.eos_id();
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int> Tokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = impl_->processor.Encode(text, &ids);
  if (!status.ok()) throw std::runtime_error("tokenizer " + path_ + ": encode failed: " + status.ToString());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  std::string text;
  const auto status = impl_->processor.Decode(ids, &text);
  if (!status.ok()) throw std::runtime_error("tokenizer " + path_ + ": decode failed: " + status.ToString());
  return text;
}

int Tokenizer::vocab_size() const { return impl_->processor.GetPieceSize(); }
int Tokenizer::unk_id() const { return impl_->processor.unk_id(); }
int Tokenizer::bos_id() const { return impl_->processor.bos_id(); }
int Tokenizer::eos_id() const { return impl_->processor.eos_id(); }
int Tokenizer::newline_id() const { return impl_->newline; }
std::string Tokenizer::piece(int id) const { return impl_->processor.IdToPiece(id); }

std::vector<int32_t> Tokenizer::piece_byte_lengths() const {
  std::vector<int32_t> lengths(static_cast<std::size_t>(vocab_size()));
  for (int id = 0; id < vocab_size(); ++id)
    // Decoded alone, a byte piece that is part of a multi-byte character would
    // come back as U+FFFD (3 bytes); in a text it stands for exactly one byte.
    lengths[static_cast<std::size_t>(id)] =
        impl_->processor.IsByte(id) ? 1 : static_cast<int32_t>(decode({id}).size());
  return lengths;
}

}  // namespace cqk
