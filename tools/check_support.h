#pragma once
// What the GPU checks (fused_check.h) and the CPU emulation tests
// (tests/kernel_emulation/) both need around a launch: outputs poisoned with
// NaN, and the launchers' tokens-per-block override. ATen only.
#include <ATen/ATen.h>

#include <cstdlib>
#include <limits>
#include <string>

namespace cqk::fused_check {

// A contiguous tensor like `like` filled with NaN: an element the kernel does
// not write stays NaN and fails the comparison.
inline at::Tensor poisoned(const at::Tensor& like) {
  return at::full(like.sizes(), std::numeric_limits<double>::quiet_NaN(),
                  like.options().memory_format(at::MemoryFormat::Contiguous));
}

// Sets CQK_FUSED_TOKENS_PER_BLOCK for the lifetime of the object (tokens > 0;
// otherwise leaves the launchers' choice).
class TokensPerBlock {
 public:
  explicit TokensPerBlock(int64_t tokens) : active_(tokens > 0) {
    if (const char* old = std::getenv("CQK_FUSED_TOKENS_PER_BLOCK")) old_ = old, had_ = true;
    if (active_) setenv("CQK_FUSED_TOKENS_PER_BLOCK", std::to_string(tokens).c_str(), 1);
  }
  ~TokensPerBlock() {
    if (!active_) return;
    if (had_) setenv("CQK_FUSED_TOKENS_PER_BLOCK", old_.c_str(), 1);
    else unsetenv("CQK_FUSED_TOKENS_PER_BLOCK");
  }
  TokensPerBlock(const TokensPerBlock&) = delete;
  TokensPerBlock& operator=(const TokensPerBlock&) = delete;

 private:
  bool active_, had_ = false;
  std::string old_;
};

}  // namespace cqk::fused_check
