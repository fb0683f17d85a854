#include "cqk/corpus_encoding.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "cqk/log.h"
#include "cqk/runtime.h"
#include "cqk/token_file.h"

namespace cqk {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string human(double value) {
  char text[32];
  if (value >= 1e9) std::snprintf(text, sizeof(text), "%.2fG", value / 1e9);
  else if (value >= 1e6) std::snprintf(text, sizeof(text), "%.2fM", value / 1e6);
  else if (value >= 1e3) std::snprintf(text, sizeof(text), "%.1fk", value / 1e3);
  else std::snprintf(text, sizeof(text), "%.0f", value);
  return text;
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

EncodeStats encode_text_file(const Tokenizer& tokenizer, const std::string& input, const std::string& output,
                             const std::string& label, int jobs) {
  constexpr std::size_t kBlockLines = 1 << 16;
  if (jobs <= 0) jobs = available_cpus();
  const auto start = Clock::now();
  auto last_report = start;
  LineReader reader(input);
  TokenFileWriter writer(output, static_cast<uint64_t>(tokenizer.vocab_size()), tokenizer.checksum());
  const int newline = tokenizer.newline_id();
  std::vector<std::string> block;
  std::vector<std::vector<int32_t>> pieces(static_cast<std::size_t>(jobs));
  std::vector<int64_t> words(static_cast<std::size_t>(jobs));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(jobs));
  EncodeStats stats;
  std::string line;
  for (bool more = true; more;) {
    block.clear();
    while (block.size() < kBlockLines && (more = reader.next(line))) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      stats.bytes += static_cast<int64_t>(line.size()) + 1;  // the line and its newline token
      block.push_back(line);
    }
    if (block.empty()) break;
    const std::size_t per = (block.size() + static_cast<std::size_t>(jobs) - 1) / static_cast<std::size_t>(jobs);
    auto work = [&](std::size_t t) {
      try {
        auto& out = pieces[t];
        out.clear();
        const std::size_t lo = std::min(block.size(), t * per), hi = std::min(block.size(), lo + per);
        for (std::size_t i = lo; i < hi; ++i) {
          const auto ids = tokenizer.encode(block[i]);
          out.insert(out.end(), ids.begin(), ids.end());
          out.push_back(newline);
          words[t] += line_words(block[i]);
        }
      } catch (...) {
        errors[t] = std::current_exception();
      }
    };
    std::vector<std::thread> threads;
    for (std::size_t t = 1; t < static_cast<std::size_t>(jobs); ++t) threads.emplace_back(work, t);
    work(0);
    for (auto& thread : threads) thread.join();
    for (const auto& error : errors)
      if (error) std::rethrow_exception(error);
    for (const auto& out : pieces) writer.append(out);
    stats.lines += static_cast<int64_t>(block.size());
    if (seconds_since(last_report) >= 2.0) {
      last_report = Clock::now();
      const double elapsed = seconds_since(start);
      const double done = reader.file_size() > 0 ? 100.0 * static_cast<double>(reader.bytes_read()) /
                                                       static_cast<double>(reader.file_size())
                                                 : 0.0;
      char pct[16];
      std::snprintf(pct, sizeof(pct), "%.0f%%", done);
      log::info("encode " + label + ": " + pct + ", " + human(static_cast<double>(stats.lines)) + " lines, " +
                human(static_cast<double>(writer.count())) + " tokens, " +
                human(static_cast<double>(stats.lines) / elapsed) + " lines/s");
    }
  }
  stats.tokens = static_cast<int64_t>(writer.count());
  for (const int64_t w : words) stats.words += w;
  writer.finish();
  stats.seconds = seconds_since(start);
  const double secs = std::max(stats.seconds, 1e-9);
  log::info("encode " + label + ": " + std::to_string(stats.lines) + " lines -> " + std::to_string(stats.tokens) +
            " tokens in " + std::to_string(stats.seconds).substr(0, 6) + " s (" +
            human(static_cast<double>(stats.lines) / secs) + " lines/s, " +
            human(static_cast<double>(stats.tokens) / secs) + " tokens/s) -> " + output);
  return stats;
}

EncodeStats encode_corpus(const TextCorpus& corpus, const Tokenizer& tokenizer, const std::string& out_dir, int jobs) {
  fs::create_directories(out_dir);
  nlohmann::json meta = {{"format", corpus.format},
                         {"source", fs::absolute(corpus.dir.empty() ? corpus.valid : corpus.dir).string()},
                         {"tokenizer", fs::absolute(tokenizer.path()).string()},
                         {"tokenizer_checksum", checksum_hex(tokenizer.checksum())},  // FNV-1a 64 of the .model
                         {"vocab_size", tokenizer.vocab_size()},
                         {"newline_id", tokenizer.newline_id()}};
  EncodeStats total;
  std::map<std::string, std::pair<std::string, EncodeStats>> encoded;  // text file -> (token file, its stats)
  for (const char* split : kCorpusSplits) {
    const std::string& input = corpus.split(split);
    if (input.empty()) continue;  // an evaluation-only corpus has no train split
    const auto output = (fs::path(out_dir) / (std::string(split) + ".bin")).string();
    const std::string text_file = fs::weakly_canonical(input).string();
    EncodeStats stats;
    if (const auto same = encoded.find(text_file); same != encoded.end()) {
      fs::copy_file(same->second.first, output, fs::copy_options::overwrite_existing);
      stats = same->second.second;
    } else {
      stats = encode_text_file(tokenizer, input, output, split, jobs);
      encoded.emplace(text_file, std::make_pair(output, stats));
      total.lines += stats.lines;
      total.tokens += stats.tokens;
      total.bytes += stats.bytes;
      total.words += stats.words;
      total.seconds += stats.seconds;
    }
    meta["splits"][split] = {{"file", input},         {"lines", stats.lines}, {"tokens", stats.tokens},
                             {"bytes", stats.bytes},  {"words", stats.words}};
  }
  // The tokenizer travels with its token files (for decoding, generation, bits per byte).
  const auto copy = fs::path(out_dir) / "tokenizer.model";
  std::error_code ec;
  if (!fs::equivalent(tokenizer.path(), copy, ec))
    fs::copy_file(tokenizer.path(), copy, fs::copy_options::overwrite_existing);
  std::ofstream(fs::path(out_dir) / "meta.json") << meta.dump(2) << "\n";
  return total;
}

}  // namespace cqk
