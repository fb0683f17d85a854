#pragma once
// Which of torch's scaled_dot_product_attention backends cqk's attention
// prefers (train.sdpa_backend). The choice goes through torch's priority
// order: the named backend first, the others after it in torch's order, so a
// backend that cannot take an input shape falls back instead of failing. The
// order is a CUDA matter: on the CPU torch takes its flash kernel where it can
// and math otherwise.
// Torch-free declarations (the config loader reads the names).
#include <cstdint>
#include <string>
#include <vector>

#include "cqk/kind_table.h"

namespace cqk {

struct Config;  // config.h

enum class SdpaBackend {
  Auto,       // torch's own order: flash, efficient, math, cuDNN
  CuDnn,      // cuDNN's fused attention (torch tries it last by default)
  Flash,      // FlashAttention-2
  Efficient,  // memory-efficient attention
  Math,       // the unfused reference
};

// The config names, in enum order: what train.sdpa_backend accepts.
inline const KindTable<SdpaBackend, 5> kSdpaBackendNames = {{SdpaBackend::Auto, "auto"},
                                                            {SdpaBackend::CuDnn, "cudnn"},
                                                            {SdpaBackend::Flash, "flash"},
                                                            {SdpaBackend::Efficient, "efficient"},
                                                            {SdpaBackend::Math, "math"}};
inline const std::vector<std::string>& sdpa_backend_names() { return kind_names<kSdpaBackendNames>(); }
// Throws std::invalid_argument "unknown train.sdpa_backend 'x' (expected auto|cudnn|...)".
inline SdpaBackend parse_sdpa_backend(const std::string& name) {
  return parse_kind(kSdpaBackendNames, name, "train.sdpa_backend");
}
inline std::string to_string(SdpaBackend backend) { return kind_name(kSdpaBackendNames, backend); }

// Sets torch's process-wide SDPA priority order for `backend`.
void use_sdpa_backend(SdpaBackend backend);

// The backend torch's SDPA picks, under the current order, for causal
// training attention (inputs that require grad) on q, k of [batch, heads,
// time, head_dim] and v of [batch, heads, time, value_dim] (bf16 or float32,
// on CUDA or the CPU): "flash", "efficient", "cudnn", "math", "overrideable",
// or "none" when no backend takes the shape.
std::string sdpa_backend_for(int64_t batch, int64_t heads, int64_t time, int64_t head_dim, int64_t value_dim,
                             bool bf16, bool cuda);

// The run's setting: use_sdpa_backend(config.train.sdpa_backend), then what
// sdpa_backend_for says at the shape the model's attention hands SDPA for
// `batch` rows of data.seq_len (Differential: half the heads, values of twice
// the head size; MTA: its vanilla layers, or "none" when every layer scores
// explicitly). What the trainer and `cqk bench train` log and record.
std::string use_sdpa_backend(const Config& config, int64_t batch, bool bf16, bool cuda);

}  // namespace cqk
