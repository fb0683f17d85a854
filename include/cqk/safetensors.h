#pragma once
// The safetensors format (https://github.com/huggingface/safetensors): an
// 8-byte little-endian header length, a JSON header {name: {dtype, shape,
// data_offsets}, "__metadata__": {text: text}}, then the tensors' raw
// little-endian bytes, packed in the header's order. Readable by the
// `safetensors` package and by transformers without unpickling anything.
#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace cqk {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// The file's bytes. Tensors may live on any device and in any layout; dtypes
// float32/64, bfloat16, float16, int8/16/32/64, uint8 and bool. Throws
// std::invalid_argument for another dtype or a repeated or empty name.
std::string safetensors_bytes(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});
// safetensors_bytes written atomically (checkpoint.h's write_file_atomically).
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace cqk
