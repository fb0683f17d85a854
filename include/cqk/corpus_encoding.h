#pragma once
// Text to token files: what `cqk data encode` and `cqk bench data` run
// (Tokenizer from cqk_support, TokenFileWriter from token_file.h).
#include <cstdint>
#include <string>

#include "cqk/text_corpus.h"
#include "cqk/tokenizer.h"

namespace cqk {

struct EncodeStats {
  int64_t lines = 0;
  int64_t tokens = 0;
  int64_t bytes = 0;    // of the text the tokens decode to: each line (without a '\r' before its '\n') and a newline
  int64_t words = 0;    // line_words summed over the lines (word-level perplexity)
  double seconds = 0;   // wall time, including writing the token file
};

// Encodes the text file `input` into the token file `output` (written
// atomically): each line's ids followed by tokenizer.newline_id(). Lines are
// read in blocks; each block is cut into one contiguous range per thread (jobs
// threads, <= 0: all available cores) and the results are written in order, so
// the file does not depend on `jobs`. Logs progress every 2 s, labelled `label`.
EncodeStats encode_text_file(const Tokenizer& tokenizer, const std::string& input, const std::string& output,
                             const std::string& label, int jobs);

// Encodes the splits of `corpus` into out_dir/{train,valid,test}.bin (no
// train.bin for an evaluation-only corpus) and writes out_dir/meta.json
// (source, tokenizer checksum, per-split lines, tokens, bytes and words) and a
// copy of the tokenizer (out_dir/tokenizer.model, for decoding and bits per
// byte). A split whose file is the same as an earlier split's is not encoded
// again: its token file is a copy. Returns the totals of the splits actually encoded.
EncodeStats encode_corpus(const TextCorpus& corpus, const Tokenizer& tokenizer, const std::string& out_dir, int jobs);

}  // namespace cqk
