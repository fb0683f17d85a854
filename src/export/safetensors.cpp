#include "cqk/safetensors.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <set>
#include <stdexcept>

#include "cqk/atomic_file.h"

namespace cqk {

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors stores little-endian data as it is in memory");

std::string dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return "F32";
    case at::kDouble: return "F64";
    case at::kBFloat16: return "BF16";
    case at::kHalf: return "F16";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kShort: return "I16";
    case at::kChar: return "I8";
    case at::kByte: return "U8";
    case at::kBool: return "BOOL";
    default: throw std::invalid_argument(std::string("safetensors: no dtype for ") + c10::toString(type));
  }
}

}  // namespace

std::string safetensors_bytes(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  std::set<std::string> names;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__" || !names.insert(name).second)
      throw std::invalid_argument("safetensors: tensor name '" + name + "' is empty, reserved or repeated");
    auto bytes = tensor.detach().to(at::kCPU).contiguous();
    const int64_t size = bytes.numel() * static_cast<int64_t>(bytes.element_size());
    header[name] = {{"dtype", dtype_name(bytes.scalar_type())},
                    {"shape", bytes.sizes().vec()},
                    {"data_offsets", {offset, offset + size}}};
    offset += size;
    data.push_back(std::move(bytes));
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned (spaces are valid JSON)
  std::string file(8, '\0');
  const uint64_t length = json.size();
  std::memcpy(file.data(), &length, sizeof length);
  file += json;
  for (const auto& t : data) file.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  return file;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  write_file_atomically(path, safetensors_bytes(tensors, metadata));
}

}  // namespace cqk
